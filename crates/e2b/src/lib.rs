//! E2B's wire protocol on the engine, so that programs written for E2B's SDKs (`e2b`,
//! `e2b-code-interpreter`) run against `sandbox-mcp engine` with three environment variables:
//! `E2B_API_URL` and `E2B_SANDBOX_URL` pointing at `--e2b-listen`, and `E2B_API_KEY` an engine key.
//!
//! One listener serves both halves: a request with an `E2b-Sandbox-Id` header is for envd, the API
//! inside a sandbox ([`envd`]: `/health`, `/files`, and the `process` and `filesystem` services
//! over Connect-RPC, [`connect`]); any other is for the control plane ([`control`]: sandboxes,
//! by `X-API-KEY`). The control plane takes the engine's keys, with their tenants; envd takes the
//! per-sandbox access token the control plane handed out ([`token`]), which opens that sandbox
//! only. Everything goes through the engine's services and the sandbox's agent, as the engine's
//! own API does: nothing new runs inside a sandbox.

mod connect;
mod control;
mod envd;
mod files;
mod jupyter;
mod lines;
mod process;
mod token;
mod user;
mod watch;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use sandbox_mcp_api::auth::KeyRing;
use sandbox_mcp_api::server::Principal;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_model::record::OnTimeout;

/// The envd version this door speaks as: what the SDKs check features against (default user,
/// stdin, closing stdin, octet-stream uploads, file metadata, entries in watch events, watching
/// with network mounts allowed), and nothing newer.
pub const ENVD_VERSION: &str = "0.6.4";

/// What the door needs: the engine, its keys, the secret envd tokens are made with, and the
/// processes started through envd.
pub struct Door {
    manager: Arc<Manager>,
    keys: Arc<KeyRing<Principal>>,
    tokens: token::Tokens,
    processes: process::Table,
    /// Each sandbox's default account, once found (see [`user`]).
    accounts: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Door {
    /// The door to `manager`, taking `keys` (the engine's). The token secret is kept in the data
    /// dir, so tokens handed out survive a restart.
    pub fn new(manager: Arc<Manager>, keys: Arc<KeyRing<Principal>>) -> std::io::Result<Self> {
        let tokens = token::Tokens::open(&manager.config().data_dir)?;
        Ok(Self {
            manager,
            keys,
            tokens,
            processes: process::Table::default(),
            accounts: Default::default(),
        })
    }
}

impl Door {
    /// Lets go of what the door keeps of a killed sandbox: its processes and its account.
    pub(crate) fn forget(&self, id: &str) {
        self.processes.forget_sandbox(id);
        sandbox_mcp_sys::lock(&self.accounts).remove(id);
    }
}

/// Serves the door on `listener` until `stop`: HTTP/1.1, and HTTP/2 without TLS (which the SDKs
/// speak by default).
pub async fn serve(listener: TcpListener, door: Arc<Door>, stop: CancellationToken) {
    let app = router(door);
    use axum::serve::ListenerExt as _;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let serve = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
    if let Err(e) = serve.await {
        tracing::error!("E2B door stopped: {e}");
    }
}

fn router(door: Arc<Door>) -> Router {
    use axum::routing::{get, post};
    let envd = Router::new()
        .route("/files", get(files::download).post(files::upload))
        .route("/envs", get(envd::envs))
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem));
    control::routes()
        .merge(envd)
        .merge(jupyter::routes())
        .fallback(|| async { Failure::new(StatusCode::NOT_FOUND, "no such endpoint here") })
        .layer(axum::extract::DefaultBodyLimit::max(files::UPLOAD_LIMIT))
        .layer(axum::middleware::from_fn(
            sandbox_mcp_api::unread::close_if_unread,
        ))
        .with_state(door)
}

/// envd's `filesystem` service: watches in [`watch`], the rest in [`files`].
async fn filesystem(
    state: axum::extract::State<Arc<Door>>,
    method: axum::extract::Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    match method.as_str() {
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            watch::rpc(&state.0, &method, &headers, &body).await
        }
        _ => files::rpc(state, method, headers, body).await,
    }
}

/// An answer in E2B's error shape, `{"code", "message"}`, with the status as its code.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn unsupported(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("{what} is not supported by this engine's E2B API (see its README)"),
        )
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let (status, _) = e.status_and_code();
        e.log(&sandbox_mcp_model::ids::current_request_id());
        Self::new(status, e.external_message())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

/// Where relative paths and commands without a `cwd` are, as in E2B's templates (whose user's
/// home it is); made in a sandbox the first time the door needs it.
pub(crate) const HOME: &str = "/home/user";

/// Sandbox `id` as the door sees it: a sandbox whose timeout has passed has at once what its
/// timeout does (the engine's timers would within a tick): killed, it is gone, as E2B's are at
/// their end; paused (`autoPause`), it is seen paused.
pub(crate) async fn live(
    door: &Door,
    id: &str,
    tenant: Option<&str>,
) -> Result<sandbox_mcp_engine::services::SandboxView, EngineError> {
    let lifecycle = &door.manager.lifecycle;
    let view = lifecycle.get(id, tenant, false).await?;
    if !view.record.timed_out(sandbox_mcp_model::ids::now_ms()) {
        return Ok(view);
    }
    let expired = lifecycle.expire(id, tenant).await;
    if view.record.on_timeout == OnTimeout::Kill {
        door.forget(id);
        return Err(EngineError::sandbox_not_found(id));
    }
    expired?;
    lifecycle.get(id, tenant, false).await
}

/// A name for a placeholder file in `dir`, made and deleted to have the agent make `dir` with its
/// parents: its own for each call, so that two calls at once never delete each other's.
pub(crate) fn placeholder(dir: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{dir}/.e2b-placeholder-{}-{n}", std::process::id())
}

/// A path as envd takes it: relative ones are under [`HOME`].
pub(crate) fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{HOME}/{path}")
    }
}

/// Whether `(name, value)` may be an environment variable: a name of letters, digits and `_`
/// (at most 256, not starting with a digit), and a value without NUL. Sandboxes' and commands'
/// and cells' variables alike.
pub(crate) fn valid_env(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !value.contains('\0')
}

/// The tenant a control-plane request acts for: its key's (`X-API-KEY`, or a bearer token), or
/// every tenant for an unbound key, which may narrow itself with `X-Sandbox-Tenant`.
pub(crate) fn caller(door: &Door, headers: &HeaderMap) -> Result<Option<String>, Failure> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| sandbox_mcp_api::auth::bearer(headers));
    let principal = key.and_then(|k| door.keys.find(k)).ok_or_else(|| {
        Failure::new(
            StatusCode::UNAUTHORIZED,
            "invalid or missing API key: set E2B_API_KEY to one of the engine's keys",
        )
    })?;
    if principal.tenant.is_some() {
        return Ok(principal.tenant);
    }
    match headers.get("x-sandbox-tenant").map(|v| v.to_str()) {
        None => Ok(None),
        Some(Ok(t)) if sandbox_mcp_api::auth::valid_tenant(t) => Ok(Some(t.to_string())),
        Some(_) => Err(Failure::bad("invalid X-Sandbox-Tenant header")),
    }
}
