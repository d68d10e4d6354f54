//! The engine's HTTP surface: routing for every operation of the spec, bearer-key auth on every
//! request, a 16 MiB body limit, and errors in the spec's shape (including for unknown routes,
//! wrong methods and malformed bodies), each with a request id.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Digest, KeyFile, KeyRing, bearer};
use crate::engine::api;
use crate::engine::error::EngineError;
use crate::engine::ids;
use crate::engine::manager::Manager;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 16 * 1024 * 1024;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// Media type of streamed responses.
pub const NDJSON: &str = "application/x-ndjson";

/// The id of the request being handled (empty outside a request).
pub fn current_request_id() -> String {
    REQUEST_ID.try_with(Clone::clone).unwrap_or_default()
}

/// Who made a request: the tenant its key belongs to, if any.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    pub tenant: Option<String>,
}

/// Header with which a request acts for one tenant (the MCP HTTP server sends it for its clients).
pub const TENANT_HEADER: &str = "x-sandbox-tenant";

/// The tenant whose sandboxes a request may see (`None`: all).
///
/// A key bound to a tenant always acts for it. An unbound key (which sees every sandbox) may narrow
/// itself to one tenant with the `x-sandbox-tenant` header; narrowing grants nothing, so any
/// unbound key may do it.
pub struct Tenant(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = EngineError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or(EngineError::Unauthorized)?;
        if principal.tenant.is_some() {
            return Ok(Tenant(principal.tenant));
        }
        match parts.headers.get(TENANT_HEADER) {
            None => Ok(Tenant(None)),
            Some(value) => {
                let tenant = value
                    .to_str()
                    .ok()
                    .filter(|t| crate::auth::valid_tenant(t))
                    .ok_or_else(|| {
                        EngineError::InvalidArgument("invalid x-sandbox-tenant header".into())
                    })?;
                Ok(Tenant(Some(tenant.to_string())))
            }
        }
    }
}

/// JSON body extractor whose rejections are API errors with the spec's shape.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = EngineError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => {
                let status = rejection.status();
                let text = rejection.body_text();
                Err(if status == StatusCode::PAYLOAD_TOO_LARGE {
                    EngineError::PayloadTooLarge(format!(
                        "the request body is over {} MiB",
                        BODY_LIMIT / (1024 * 1024)
                    ))
                } else {
                    EngineError::InvalidArgument(format!("invalid request body: {text}"))
                })
            }
        }
    }
}

/// Like [`ApiJson`], but a request with no body at all (`curl -X POST …`, or a client that
/// leaves out a body whose fields are all optional) counts as `{}`.
pub struct ApiJsonOrEmpty<T>(pub T);

impl<S, T> FromRequest<S> for ApiJsonOrEmpty<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + Default,
{
    type Rejection = EngineError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let empty = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .is_none()
            && req
                .headers()
                .get(axum::http::header::CONTENT_LENGTH)
                .is_none_or(|v| v.as_bytes() == b"0")
            && req
                .headers()
                .get(axum::http::header::TRANSFER_ENCODING)
                .is_none();
        if empty {
            return Ok(Self(T::default()));
        }
        ApiJson::<T>::from_request(req, state)
            .await
            .map(|ApiJson(v)| Self(v))
    }
}

impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let request_id = REQUEST_ID.try_with(Clone::clone).unwrap_or_default();
        if status.is_server_error() {
            tracing::warn!(%request_id, code, "{self}");
        }
        let body = serde_json::json!({
            "error_code": code,
            "message": self.to_string(),
            "request_id": request_id,
        });
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Accepted API keys, each standing for a principal (see [`crate::auth`]).
pub type Keys = KeyRing<Principal>;

/// The engine's keys: `fixed`, plus those of `file` (one key per line, `#` comments), which is
/// re-read when it changes. Blank keys are ignored.
pub fn keys(fixed: impl IntoIterator<Item = String>, file: Option<PathBuf>) -> Keys {
    fn parse(text: &str) -> Result<Vec<(Digest, Principal)>, String> {
        Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|k| (Digest::of(k), Principal::default()))
            .collect())
    }
    let ring = KeyRing::new(file.map(|f| KeyFile::new(f, parse)));
    fixed
        .into_iter()
        .filter(|k| !k.trim().is_empty())
        .fold(ring, |ring, k| ring.with(k.trim(), Principal::default()))
}

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub keys: Arc<Keys>,
}

async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let request_id = ids::request_id();
    REQUEST_ID
        .scope(request_id.clone(), async move {
            let principal = bearer(req.headers()).and_then(|t| state.keys.find(t));
            let Some(principal) = principal else {
                return EngineError::Unauthorized.into_response();
            };
            req.extensions_mut().insert(principal);
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let started = Instant::now();
            let mut response = next.run(req).await;
            tracing::debug!(%request_id, %method, %path, status = response.status().as_u16(), ms = started.elapsed().as_millis() as u64, "request");
            if let Ok(v) = HeaderValue::from_str(&request_id) {
                response.headers_mut().insert("x-request-id", v);
            }
            response
        })
        .await
}

async fn no_route() -> EngineError {
    EngineError::NotFound("no such endpoint; see the engine's OpenAPI document".into())
}

async fn wrong_method() -> EngineError {
    EngineError::MethodNotAllowed
}

/// Every route of the spec. The conformance test walks the spec and checks each one is here.
pub fn router(state: AppState) -> Router {
    let sandbox = "/v1/sandboxes/{sandbox_id}";
    Router::new()
        .route("/v1/health", get(api::health))
        .route("/v1/templates", get(api::list_templates))
        .route(
            "/v1/sandboxes",
            post(api::create_sandbox).get(api::list_sandboxes),
        )
        .route(
            sandbox,
            get(api::get_sandbox)
                .patch(api::update_sandbox)
                .delete(api::kill_sandbox),
        )
        .route(&format!("{sandbox}/pause"), post(api::pause_sandbox))
        .route(&format!("{sandbox}/resume"), post(api::resume_sandbox))
        .route(&format!("{sandbox}/metrics"), get(api::get_sandbox_metrics))
        .route(&format!("{sandbox}/exec"), post(api::exec_command))
        .route(
            &format!("{sandbox}/exec/stream"),
            post(api::exec_command_stream),
        )
        .route(&format!("{sandbox}/code"), post(api::run_code))
        .route(
            &format!("{sandbox}/code/stream"),
            post(api::run_code_stream),
        )
        .route(
            &format!("{sandbox}/contexts"),
            get(api::list_code_contexts).post(api::create_code_context),
        )
        .route(
            &format!("{sandbox}/contexts/{{context_id}}"),
            axum::routing::delete(api::delete_code_context),
        )
        .route(
            &format!("{sandbox}/jobs/{{job_id}}"),
            get(api::get_job).delete(api::kill_job),
        )
        .route(
            &format!("{sandbox}/files"),
            get(api::read_file)
                .put(api::write_file)
                .delete(api::delete_file),
        )
        .route(&format!("{sandbox}/files/list"), get(api::list_files))
        .route(&format!("{sandbox}/files/move"), post(api::move_file))
        .route(&format!("{sandbox}/files/download"), get(api::download_dir))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// A running engine HTTP server.
pub struct EngineServer {
    pub url: String,
    pub manager: Arc<Manager>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl EngineServer {
    /// Serves `manager` on `listener` and runs its timers.
    pub fn start(
        manager: Arc<Manager>,
        listener: TcpListener,
        keys: Keys,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let stop = CancellationToken::new();
        let state = AppState {
            manager: manager.clone(),
            keys: Arc::new(keys),
        };
        let app = router(state);
        let shutdown = stop.clone();
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!("engine server stopped: {e}");
            }
        });
        let timers = tokio::spawn(manager.clone().run_timers(stop.clone()));
        Ok(Self {
            url,
            manager,
            stop,
            tasks: vec![server, timers],
        })
    }

    /// Stops accepting requests, lets in-flight ones finish, and pauses the sandboxes.
    pub async fn shutdown(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        self.manager.shutdown().await;
    }
}
