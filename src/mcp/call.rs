//! How a call can fail, and the conversion from the generated client's results.

use serde::Serialize;
use serde_json::Value;

use crate::client::{Error, ResponseValue, types};

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
    pub fn is_connect_failure(&self) -> bool {
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
        Error::InvalidResponsePayload(_, e) => {
            CallFailure::BadResponse(format!("the response does not match the API: {e}"))
        }
        Error::UnexpectedResponse(response) => CallFailure::BadResponse(format!(
            "unexpected HTTP status {}",
            response.status().as_u16()
        )),
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
