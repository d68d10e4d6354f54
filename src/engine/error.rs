//! Engine errors and their HTTP form: every error leaves the engine as the spec's `Error` body
//! with a stable `error_code` and the request's id.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::agent::protocol::{AgentError, ErrorKind};
use crate::engine::driver::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("missing or unknown API key; send `Authorization: Bearer <key>`")]
    Unauthorized,
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Sandbox(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl EngineError {
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::NotFound(format!("sandbox {id} not found"))
    }

    /// The HTTP status and `error_code` of this error.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "invalid_argument"),
            Self::PermissionDenied(_) => (StatusCode::FORBIDDEN, "permission_denied"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::QuotaExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Self::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Self::Sandbox(_) => (StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl EngineError {
    /// The spec's `Error` body for this error.
    pub fn body(&self, request_id: &str) -> serde_json::Value {
        let (_, code) = self.status_and_code();
        serde_json::json!({
            "error_code": code,
            "message": self.to_string(),
            "request_id": request_id,
        })
    }
}

impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let request_id = crate::engine::ids::current_request_id();
        if status.is_server_error() {
            tracing::warn!(%request_id, code, "{self}");
        }
        let mut response = (status, Json(self.body(&request_id))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Longest message taken from inside a sandbox (an agent's error, a launcher's report): a
/// sandbox's words reach the client, but never more than this.
pub const MAX_SANDBOX_MESSAGE: usize = 2048;

/// `text` cut to [`MAX_SANDBOX_MESSAGE`] bytes on a character boundary, marked when cut.
pub fn clip(text: &str) -> String {
    if text.len() <= MAX_SANDBOX_MESSAGE {
        return text.to_string();
    }
    let mut end = MAX_SANDBOX_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes]", &text[..end], text.len() - end)
}

impl From<DriverError> for EngineError {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Unsupported(m) => Self::Conflict(m),
            DriverError::Launch(m) | DriverError::Agent(m) => Self::Sandbox(m),
            DriverError::Io(m) => Self::Internal(m),
        }
    }
}

/// An agent's error (its words clipped: they come from inside the sandbox).
impl From<AgentError> for EngineError {
    fn from(e: AgentError) -> Self {
        let m = clip(&e.message);
        match e.kind {
            ErrorKind::NotFound => Self::NotFound(m),
            ErrorKind::InvalidArgument => Self::InvalidArgument(m),
            ErrorKind::PermissionDenied => Self::PermissionDenied(m),
            ErrorKind::Conflict => Self::Conflict(m),
            ErrorKind::PayloadTooLarge => Self::PayloadTooLarge(m),
            ErrorKind::DiskFull => Self::QuotaExceeded(m),
            ErrorKind::Io => Self::Sandbox(m),
        }
    }
}

impl From<rusqlite::Error> for EngineError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Internal(format!("state database: {e}"))
    }
}
