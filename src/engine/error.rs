//! Engine errors and their HTTP form: every error leaves the engine as the spec's `Error` body
//! with a stable `error_code`.

use axum::http::StatusCode;

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

impl From<rusqlite::Error> for EngineError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Internal(format!("state database: {e}"))
    }
}
