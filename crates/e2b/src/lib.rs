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
mod process;
mod token;

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

/// The envd version this door speaks as: what the SDKs check features against (default user,
/// stdin, closing stdin, octet-stream uploads), and nothing newer.
pub const ENVD_VERSION: &str = "0.5.7";

/// What the door needs: the engine, its keys, the secret envd tokens are made with, and the
/// processes started through envd.
pub struct Door {
    manager: Arc<Manager>,
    keys: Arc<KeyRing<Principal>>,
    tokens: token::Tokens,
    processes: process::Table,
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
        })
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
    control::routes()
        .merge(envd::routes())
        .merge(jupyter::routes())
        .fallback(|| async { Failure::new(StatusCode::NOT_FOUND, "no such endpoint here") })
        .layer(axum::extract::DefaultBodyLimit::max(files::UPLOAD_LIMIT))
        .with_state(door)
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
