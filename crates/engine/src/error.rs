//! Engine errors and their HTTP form: every error leaves the engine as the spec's `Error` body
//! with a stable `error_code` and the request's id.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use sandbox_mcp_model::driver::DriverError;
use sandbox_mcp_protocol::{AgentError, ErrorKind};

/// Every way an API request fails. The variants holding a `String` are messages for the caller
/// (what to fix, or what happened to the sandbox); the ones holding a source are the engine's own
/// failures, whose details go to the log with the request id, while the caller gets a short note
/// ([`EngineError::external_message`]) — as dropshot separates internal and external messages.
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
    /// A sandbox that existed and went outside the engine's control (its pod deleted or
    /// ended): 404 like any missing sandbox, with its own code so callers can tell.
    #[error("{0}")]
    Gone(String),
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
    /// A part of the engine the request needs could not be set up (the secrets key, the egress
    /// CA). The caller learns which; the cause (paths, the host's errors) goes to the log.
    #[error("{what}")]
    Unavailable {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The state database failed.
    #[error("state database: {0}")]
    State(#[from] rusqlite::Error),
    /// An operation on the host failed (cgroups, the sandbox store, the uid registry).
    #[error(transparent)]
    Host(DriverError),
    /// A background task panicked or was cancelled.
    #[error("background task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The templates could not be prepared.
    #[error("templates: {0}")]
    Templates(#[source] std::io::Error),
    /// A sandbox could not be deleted completely; the kill is finished at the next start.
    #[error("kill incomplete: {0}")]
    KillIncomplete(#[source] DriverError),
    /// The engine made a response the API's own types refuse (or cannot serialize): a bug.
    #[error("response does not fit the API")]
    Response(#[source] Box<dyn std::error::Error + Send + Sync>),
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
            Self::Gone(_) => (StatusCode::NOT_FOUND, "gone"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::QuotaExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Self::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Self::Sandbox(_) => (StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error"),
            Self::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::State(_)
            | Self::Host(_)
            | Self::Task(_)
            | Self::Templates(_)
            | Self::KillIncomplete(_)
            | Self::Response(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// What the caller is told. For the engine's own failures that is a note, never the
    /// internal detail (paths, database errors), which the log has under the request id.
    pub fn external_message(&self) -> String {
        match self {
            Self::KillIncomplete(_) => {
                "the sandbox's processes are stopped but its files could not all be deleted; \
                 the engine finishes the kill when it next starts"
                    .into()
            }
            Self::State(_)
            | Self::Host(_)
            | Self::Task(_)
            | Self::Templates(_)
            | Self::Response(_) => {
                "the engine failed internally; its log has the details under this request id".into()
            }
            Self::Unavailable { what, .. } => {
                format!("{what}; the engine's log has the details under this request id")
            }
            other => other.to_string(),
        }
    }
}

/// An error with its whole chain of causes, for the log.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

impl EngineError {
    /// Logs the whole chain of an engine failure (a server error) under the request id: the
    /// caller's message says the log has the details.
    pub fn log(&self, request_id: &str) {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            tracing::warn!(%request_id, code, "{}", chain(self));
        }
    }

    /// The spec's `Error` body for this error.
    pub fn body(&self, request_id: &str) -> serde_json::Value {
        let (_, code) = self.status_and_code();
        serde_json::json!({
            "error_code": code,
            "message": self.external_message(),
            "request_id": request_id,
        })
    }
}

impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        let request_id = sandbox_mcp_model::ids::current_request_id();
        self.log(&request_id);
        let mut response = (status, Json(self.body(&request_id))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub(crate) use sandbox_mcp_model::clip;

impl From<DriverError> for EngineError {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Unsupported(m) => Self::Conflict(m),
            DriverError::Launch(m) | DriverError::Agent(m) => Self::Sandbox(m),
            DriverError::Gone(m) => Self::Gone(m),
            DriverError::Exhausted(m) => Self::QuotaExceeded(m),
            e @ DriverError::Io { .. } => Self::Host(e),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn internal_detail_goes_to_the_log_not_to_the_caller() {
        let cause = std::io::Error::other("/var/lib/sandbox-mcp/sandboxes/x: device busy");
        let e = EngineError::Host(DriverError::io("remove the sandbox's cgroups")(cause));
        let body = e.body("req1");
        assert_eq!(body["error_code"], "internal");
        let message = body["message"].as_str().unwrap();
        assert!(!message.contains("/var/lib"), "{message}");
        assert!(message.contains("request id"), "{message}");
        assert!(chain(&e).contains("device busy"), "{}", chain(&e));
        // A message meant for the caller reaches it whole.
        let e = EngineError::NotFound("sandbox sbx_x not found".into());
        assert_eq!(e.body("r")["message"], "sandbox sbx_x not found");
    }

    #[test]
    fn an_agent_message_reaches_the_caller_clipped() {
        // 200 KiB fits in an agent's error frame; only 2 KiB of it may reach a client.
        let long = "é".repeat(100 * 1024);
        let e = EngineError::from(AgentError {
            kind: ErrorKind::Io,
            message: long.clone(),
        });
        let message = e.body("r")["message"].as_str().unwrap().to_string();
        assert!(
            message.len() < sandbox_mcp_model::MAX_SANDBOX_MESSAGE + 64,
            "{}",
            message.len()
        );
        assert!(message.ends_with(&format!("[{} more bytes]", long.len() - 2048)));
        // Cut on a character boundary (é is two bytes), and short text is left alone.
        assert!(message.starts_with(&"é".repeat(1024)));
        assert_eq!(clip("short"), "short");
    }
}
