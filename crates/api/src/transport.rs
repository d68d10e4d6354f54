//! How the client reaches the engine: over HTTP, or, for an engine this process serves, by handing
//! each request to the engine's router in the process, with no socket in between.
//!
//! The in-process path carries the very request the network path would send (method, path,
//! query, body, and the key and tenant headers the client adds to every request), and the
//! engine answers it through the same router, so every check (keys, tenant, limits, body
//! parsing) is the one a request from the network meets. What it saves is the loopback hop:
//! connection handling, HTTP framing on both sides and the kernel's TCP stack. Requests that
//! need a connection of their own (a WebSocket upgrade: `attach_process`) keep going over HTTP.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use progenitor_client::{ClientHooks, ClientInfo, OperationInfo};
use reqwest::header::{CONTENT_LENGTH, HeaderMap, HeaderValue, UPGRADE};

use crate::Client;

/// What an in-process call answers: the engine's response, its body streamed as produced.
pub type LocalAnswer = Pin<Box<dyn Future<Output = http::Response<reqwest::Body>> + Send>>;

/// An engine served by this process, as a function from a request to its answer. The engine's
/// HTTP crate builds it around its router; dropping the answer's future (a call cancelled)
/// drops the request, as a closed connection would.
#[derive(Clone)]
pub struct InProcess(Arc<dyn Fn(http::Request<reqwest::Body>) -> LocalAnswer + Send + Sync>);

impl InProcess {
    pub fn new(
        serve: impl Fn(http::Request<reqwest::Body>) -> LocalAnswer + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(serve))
    }

    /// The engine's answer to `request`, as it would come over a connection.
    pub fn call(&self, request: http::Request<reqwest::Body>) -> LocalAnswer {
        (self.0)(request)
    }
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcess")
    }
}

/// The client's way to the engine (progenitor's "inner" value of [`Client`]).
#[derive(Clone, Default, Debug)]
pub struct Transport {
    /// Headers on every request (the key, the tenant): the HTTP client adds them to what goes
    /// over the network, and the in-process path adds them the same way.
    headers: HeaderMap,
    /// The engine in this process, when it is.
    local: Option<InProcess>,
}

impl Transport {
    pub(crate) fn new(headers: HeaderMap, local: Option<InProcess>) -> Self {
        Self { headers, local }
    }

    /// Whether requests go to an engine in this process.
    pub(crate) fn is_in_process(&self) -> bool {
        self.local.is_some()
    }
}

impl Client {
    /// Whether this client calls an engine in this process, without a socket.
    pub fn is_in_process(&self) -> bool {
        self.inner().is_in_process()
    }
}

impl ClientHooks<Transport> for Client {
    async fn exec(
        &self,
        request: reqwest::Request,
        _info: &OperationInfo,
    ) -> reqwest::Result<reqwest::Response> {
        let transport = self.inner();
        match &transport.local {
            Some(local) if !request.headers().contains_key(UPGRADE) => {
                let request = as_sent(request, &transport.headers)?;
                Ok(reqwest::Response::from(local.call(request).await))
            }
            _ => self.client().execute(request).await,
        }
    }
}

/// `request` as the network path would send it: the client's headers where the request has none
/// of its own (as the HTTP client merges them), and a `Content-Length` for a body of known size
/// (as hyper writes one).
fn as_sent(
    request: reqwest::Request,
    defaults: &HeaderMap,
) -> reqwest::Result<http::Request<reqwest::Body>> {
    let mut request = http::Request::<reqwest::Body>::try_from(request)?;
    for (name, value) in defaults {
        if !request.headers().contains_key(name) {
            request.headers_mut().insert(name.clone(), value.clone());
        }
    }
    let len = request.body().as_bytes().map(<[u8]>::len);
    if let Some(len) = len.filter(|&n| n > 0)
        && !request.headers().contains_key(CONTENT_LENGTH)
    {
        request
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(len));
    }
    Ok(request)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn request(method: reqwest::Method, body: Option<&'static str>) -> reqwest::Request {
        let mut r = reqwest::Request::new(
            method,
            "http://127.0.0.1:1/v1/sandboxes?limit=2".parse().unwrap(),
        );
        if let Some(b) = body {
            *r.body_mut() = Some(reqwest::Body::from(b));
            r.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
        }
        r
    }

    #[test]
    fn a_request_in_process_carries_the_clients_headers_and_its_length() {
        let mut defaults = HeaderMap::new();
        defaults.insert("authorization", HeaderValue::from_static("Bearer k"));
        defaults.insert("x-sandbox-tenant", HeaderValue::from_static("acme"));
        let mut r = request(reqwest::Method::POST, Some("{\"a\":1}"));
        // The request's own value wins over the client's, as over the network.
        r.headers_mut()
            .insert("x-sandbox-tenant", HeaderValue::from_static("own"));
        let sent = as_sent(r, &defaults).unwrap();
        assert_eq!(sent.method(), http::Method::POST);
        assert_eq!(sent.uri().path(), "/v1/sandboxes");
        assert_eq!(sent.uri().query(), Some("limit=2"));
        assert_eq!(sent.headers()["authorization"], "Bearer k");
        assert_eq!(sent.headers()["x-sandbox-tenant"], "own");
        assert_eq!(sent.headers()["content-length"], "7");
        assert_eq!(sent.body().as_bytes(), Some(&b"{\"a\":1}"[..]));
    }

    #[test]
    fn a_request_without_a_body_gets_no_length() {
        let sent = as_sent(request(reqwest::Method::GET, None), &HeaderMap::new()).unwrap();
        assert!(!sent.headers().contains_key(CONTENT_LENGTH));
        assert!(!sent.headers().contains_key("content-type"));
    }
}
