//! How a call can fail, and the conversion from the generated client's results.

use serde::Serialize;
use serde_json::Value;

use sandbox_mcp_api::{Error, ResponseValue, types};

/// Every way a tool call can fail after the tool was found.
#[derive(Debug, Clone, PartialEq)]
pub enum CallFailure {
    /// Arguments that do not fit the schema (caught before any request is sent).
    InvalidArgs(String),
    /// The control plane answered with an error.
    Api {
        status: u16,
        code: String,
        message: String,
        request_id: String,
    },
    /// The control plane could not be reached.
    Unreachable(String),
    /// No answer before the call's deadline.
    Deadline(String),
    /// The control plane answered with something the spec does not allow.
    BadResponse(String),
    /// The tool name is not in the registry (a protocol error, not a tool result).
    UnknownTool(String),
}

impl CallFailure {
    pub fn unknown_tool(name: &str) -> Self {
        Self::UnknownTool(name.to_string())
    }

    /// Whether retrying against a freshly resolved engine could help: the request never arrived.
    pub(crate) fn is_connect_failure(&self) -> bool {
        matches!(self, Self::Unreachable(_))
    }
}

/// Turns the generated client's result into the JSON the model gets, or a failure.
pub fn respond<T: Serialize>(
    result: Result<ResponseValue<T>, Error<types::Error>>,
) -> Result<Value, CallFailure> {
    match result {
        Ok(response) => serde_json::to_value(response.into_inner())
            .map_err(|e| CallFailure::BadResponse(format!("cannot encode the response: {e}"))),
        Err(e) => Err(from_client_error(e)),
    }
}

/// A client error in one line, for people: the engine's message when it answered.
pub fn error_text(e: Error<types::Error>) -> String {
    from_client_error(e).text()
}

impl CallFailure {
    /// The failure in one line, for people: the engine's message when it answered.
    pub fn text(self) -> String {
        match self {
            CallFailure::Api { message, .. } => message,
            CallFailure::InvalidArgs(m)
            | CallFailure::Unreachable(m)
            | CallFailure::Deadline(m)
            | CallFailure::BadResponse(m)
            | CallFailure::UnknownTool(m) => m,
        }
    }
}

const NOT_THE_API: &str = "an HTML page came back instead of an API response; is SANDBOX_MCP_URL the engine, not a proxy or another service?";

fn from_client_error(e: Error<types::Error>) -> CallFailure {
    match e {
        Error::ErrorResponse(rv) => {
            let status = rv.status().as_u16();
            let body = rv.into_inner();
            CallFailure::Api {
                status,
                code: body.error_code,
                message: body.message,
                request_id: body.request_id,
            }
        }
        Error::InvalidRequest(message) => CallFailure::InvalidArgs(message),
        Error::CommunicationError(e) => {
            // `without_url`: the URL may carry credentials and is no business of the model's.
            let connect = e.is_connect();
            let timeout = e.is_timeout();
            let text = describe(&e.without_url());
            if timeout {
                CallFailure::Deadline(text)
            } else if connect && text.contains("certificate") {
                // Reaching it again will not help: the engine's TLS is what has to change.
                CallFailure::Unreachable(format!(
                    "{text}: the engine's TLS certificate is not one this machine trusts; give the engine a certificate for the name in SANDBOX_MCP_URL from a CA in the system's roots"
                ))
            } else if connect {
                CallFailure::Unreachable(text)
            } else {
                CallFailure::Unreachable(format!("the connection failed: {text}"))
            }
        }
        Error::ResponseBodyError(e) => CallFailure::BadResponse(format!(
            "the response body broke off: {}",
            describe(&e.without_url())
        )),
        Error::InvalidResponsePayload(body, e) => {
            if body.trim_ascii_start().starts_with(b"<") {
                // A proxy's error page, or another service at the engine's address.
                CallFailure::BadResponse(NOT_THE_API.into())
            } else {
                CallFailure::BadResponse(format!("the response does not match the API: {e}"))
            }
        }
        Error::UnexpectedResponse(response) => {
            let html = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/html"));
            CallFailure::BadResponse(if html {
                NOT_THE_API.into()
            } else {
                format!("unexpected HTTP status {}", response.status().as_u16())
            })
        }
        Error::InvalidUpgrade(e) => CallFailure::BadResponse(describe(&e.without_url())),
        Error::Custom(message) => CallFailure::BadResponse(message),
    }
}

/// reqwest's error chain, flattened into one line.
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A streamed response: NDJSON events (`output`, then a final `result` or `error`).
pub struct EventStream {
    inner: sandbox_mcp_api::ByteStream,
    buf: Vec<u8>,
}

/// Longest event line accepted from a stream (a final result carries capped output).
const MAX_EVENT: usize = 32 * 1024 * 1024;

fn parse_event(line: &[u8]) -> Result<Option<Value>, CallFailure> {
    serde_json::from_slice(line).map(Some).map_err(|e| {
        CallFailure::BadResponse(if line.trim_ascii_start().starts_with(b"<") {
            NOT_THE_API.into()
        } else {
            format!("the event stream broke: {e}")
        })
    })
}

impl EventStream {
    /// The next event, or `None` when the stream ended.
    pub async fn next(&mut self) -> Result<Option<Value>, CallFailure> {
        use futures::StreamExt;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return parse_event(&line);
            }
            match self.inner.next().await {
                Some(Ok(chunk)) => {
                    if self.buf.len() + chunk.len() > MAX_EVENT {
                        return Err(CallFailure::BadResponse(
                            "an event in the stream is too large".into(),
                        ));
                    }
                    self.buf.extend_from_slice(&chunk);
                }
                Some(Err(e)) => {
                    return Err(CallFailure::Unreachable(format!(
                        "the event stream broke off: {}",
                        describe(&e.without_url())
                    )));
                }
                None if self.buf.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                None => {
                    let line = std::mem::take(&mut self.buf);
                    return parse_event(&line);
                }
            }
        }
    }
}

/// Like [`respond`], for an operation that answers with a stream of events.
pub fn respond_stream(
    result: Result<ResponseValue<sandbox_mcp_api::ByteStream>, Error<types::Error>>,
) -> Result<EventStream, CallFailure> {
    match result {
        Ok(response) => Ok(EventStream {
            inner: response.into_inner(),
            buf: Vec::new(),
        }),
        Err(e) => Err(from_client_error(e)),
    }
}

/// A failure carried by an `error` event.
pub(crate) fn event_failure(event: &Value) -> CallFailure {
    let e = &event["error"];
    CallFailure::Api {
        status: 500,
        code: e["error_code"].as_str().unwrap_or("internal").to_string(),
        message: e["message"]
            .as_str()
            .unwrap_or("the operation failed")
            .to_string(),
        request_id: e["request_id"].as_str().unwrap_or("").to_string(),
    }
}
