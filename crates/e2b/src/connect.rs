//! Connect-RPC as the E2B SDKs speak it to envd: JSON only (`application/json` for a unary call,
//! `application/connect+json` for a stream), messages as protobuf's JSON mapping (camelCase
//! fields, bytes as base64, 64-bit integers as strings or numbers).
//!
//! A stream's messages, both ways, are enveloped: a flags byte, a big-endian 32-bit length, the
//! JSON. A server stream always ends with a message flagged [`END_STREAM`] holding `{}` or
//! `{"error": {"code", "message"}}`, with HTTP status 200 whatever happened; a unary call's error
//! is a JSON body with the code's HTTP status.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;

use sandbox_mcp_engine::error::EngineError;

/// The flag of a stream's last message.
const END_STREAM: u8 = 0x02;
/// The flag of a compressed message (compression is never negotiated here).
const COMPRESSED: u8 = 0x01;
/// Largest request message taken.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// A Connect error: its code (one of Connect's names) and message.
#[derive(Debug, Clone)]
pub(crate) struct RpcError {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl RpcError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }

    fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code, "message": self.message})
    }
}

impl From<EngineError> for RpcError {
    fn from(e: EngineError) -> Self {
        let (status, _) = e.status_and_code();
        e.log(&sandbox_mcp_model::ids::current_request_id());
        let code = match status {
            StatusCode::BAD_REQUEST => "invalid_argument",
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::FORBIDDEN => "permission_denied",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::CONFLICT => "failed_precondition",
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => "resource_exhausted",
            StatusCode::GATEWAY_TIMEOUT => "deadline_exceeded",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            _ => "internal",
        };
        Self::new(code, e.external_message())
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.json())).into_response()
    }
}

/// A unary call's request: its body as JSON.
pub(crate) fn request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, RpcError> {
    uncompressed(headers, "content-encoding")?;
    serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        .map_err(|e| RpcError::invalid(format!("invalid request message: {e}")))
}

/// A unary call's answer.
pub(crate) fn reply<T: Serialize>(result: Result<T, RpcError>) -> Response {
    match result.and_then(|r| {
        serde_json::to_vec(&r).map_err(|e| RpcError::new("internal", format!("encoding: {e}")))
    }) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A server stream's request: the one enveloped message of its body.
pub(crate) fn stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, RpcError> {
    uncompressed(headers, "connect-content-encoding")?;
    let Some((&flags, rest)) = body.split_first() else {
        return Err(RpcError::invalid("an empty stream: no request message"));
    };
    if flags & COMPRESSED != 0 {
        return Err(RpcError::invalid("compressed messages are not accepted"));
    }
    let (len, json) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| RpcError::invalid("a request message cut short"))?;
    let len = u32::from_be_bytes(*len) as usize;
    if len > MAX_MESSAGE || json.len() < len {
        return Err(RpcError::invalid("a request message cut short or too long"));
    }
    serde_json::from_slice(&json[..len])
        .map_err(|e| RpcError::invalid(format!("invalid request message: {e}")))
}

fn uncompressed(headers: &HeaderMap, name: &str) -> Result<(), RpcError> {
    match headers.get(name).and_then(|v| v.to_str().ok()) {
        None | Some("identity") => Ok(()),
        Some(other) => Err(RpcError::new(
            "unimplemented",
            format!("{name} {other} is not supported; send uncompressed messages"),
        )),
    }
}

/// One message of a server stream.
pub(crate) fn message<T: Serialize>(m: &T) -> Bytes {
    envelope(0, &serde_json::to_vec(m).unwrap_or_else(|_| b"{}".to_vec()))
}

/// A server stream's last message: its end, with the error that ended it if one did.
pub(crate) fn end(error: Option<&RpcError>) -> Bytes {
    let json = match error {
        Some(e) => serde_json::json!({"error": e.json()}),
        None => serde_json::json!({}),
    };
    envelope(END_STREAM, json.to_string().as_bytes())
}

fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    Bytes::from(out)
}

/// A server stream's answer: status 200 and the enveloped messages (the last one [`end`]).
pub(crate) fn streaming(body: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    use futures::StreamExt as _;
    let body = Body::from_stream(body.map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "application/connect+json")], body).into_response()
}

/// A server stream that fails before its first message.
pub(crate) fn stream_error(e: RpcError) -> Response {
    streaming(futures::stream::once(async move { end(Some(&e)) }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stream_messages_are_enveloped_and_read_back() {
        let m = message(&serde_json::json!({"a": 1}));
        assert_eq!(&m[..5], &[0, 0, 0, 0, 7]);
        let got: serde_json::Value = stream_request(&HeaderMap::new(), &m).unwrap();
        assert_eq!(got["a"], 1);
        let e = end(Some(&RpcError::not_found("gone")));
        assert_eq!(e[0], END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(&end(None)[5..], b"{}");
    }

    #[test]
    fn a_bad_stream_request_is_refused_with_a_reason() {
        let h = HeaderMap::new();
        for body in [
            &b""[..],
            &[0, 0, 0],
            &[0, 0, 0, 0, 9, b'{', b'}'],
            &[1, 0, 0, 0, 2, b'{', b'}'],
        ] {
            let e = stream_request::<serde_json::Value>(&h, body).unwrap_err();
            assert_eq!(e.code, "invalid_argument", "{body:?}");
        }
        let mut gz = HeaderMap::new();
        gz.insert("connect-content-encoding", "gzip".parse().unwrap());
        let e = stream_request::<serde_json::Value>(&gz, &message(&1)).unwrap_err();
        assert_eq!(e.code, "unimplemented");
    }
}
