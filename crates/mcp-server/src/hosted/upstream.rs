//! Hosted servers that speak Streamable HTTP themselves (`http_port`): the session's sandbox runs
//! the server, a private preview of its port is the way in, and each of the client's requests is
//! forwarded there as it came (method, body, the MCP headers) with the answer streamed back. The
//! server's own session id stays between us and it: the client only ever sees ours.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;

use crate::backend::Backend;
use sandbox_mcp_sys::lock;

/// Headers of the client's request passed on to the server.
const PASSED: [&str; 4] = [
    "content-type",
    "accept",
    "mcp-protocol-version",
    "last-event-id",
];

pub struct Upstream {
    url: String,
    token: Option<String>,
    /// The server's own session id, once it gave one.
    inner_session: Mutex<Option<String>>,
    client: reqwest::Client,
}

impl Upstream {
    /// A private preview of `port` in sandbox `id`; requests go to its `path`.
    pub async fn open(
        backend: &Backend,
        tenant: Option<&str>,
        id: &str,
        port: u16,
        path: &str,
    ) -> Result<Self, String> {
        let handle = backend.client(tenant).await.map_err(|e| e.text())?;
        let body: sandbox_mcp_api::types::CreatePreviewRequest =
            serde_json::from_value(serde_json::json!({"port": port}))
                .map_err(|e| format!("invalid port {port}: {e}"))?;
        let preview = handle
            .client
            .create_preview()
            .sandbox_id(id)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "cannot open the server's port {port}: {}",
                    crate::call::error_text(e)
                )
            })?
            .into_inner();
        let url = format!(
            "{}{}",
            preview.path_url.trim_end_matches('/'),
            if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            }
        );
        let client = sandbox_mcp_api::http_builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            url,
            token: preview.token,
            inner_session: Mutex::new(None),
            client,
        })
    }

    /// Forwards one request as the client made it.
    pub async fn forward(
        &self,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<reqwest::Response, String> {
        let mut request = self.client.request(method, &self.url).body(body);
        for name in PASSED {
            if let Some(v) = headers.get(name) {
                request = request.header(name, v);
            }
        }
        if let Some(token) = &self.token {
            request = request.header("x-preview-token", token);
        }
        if let Some(session) = lock(&self.inner_session).clone() {
            request = request.header("mcp-session-id", session);
        }
        request
            .send()
            .await
            .map_err(|e| e.without_url().to_string())
    }

    /// Forwards `initialize` until the server listens (it may take a while to start), at most
    /// `wait`; `gone` says whether the server has exited meanwhile.
    pub async fn first(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        wait: Duration,
        gone: impl Fn() -> Option<String>,
    ) -> Result<reqwest::Response, String> {
        let until = Instant::now() + wait;
        loop {
            let left = until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100));
            let tried =
                tokio::time::timeout(left, self.forward(Method::POST, headers, body.clone()))
                    .await
                    .unwrap_or_else(|_| Err("no answer in time".into()));
            let listening = match &tried {
                Ok(r) => r.status() != StatusCode::BAD_GATEWAY,
                Err(_) => false,
            };
            if listening {
                return tried;
            }
            if let Some(why) = gone() {
                return Err(why);
            }
            if Instant::now() > until {
                return Err(format!(
                    "nothing answered on its port within {} s",
                    wait.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's answer for the client: its status, body (streamed) and content type, with our
    /// session id in place of the server's.
    pub fn answer(&self, upstream: reqwest::Response, ours: &str) -> Response {
        if let Some(inner) = upstream
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            *lock(&self.inner_session) = Some(inner.to_string());
        }
        let status = upstream.status();
        let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
        let body = Body::from_stream(
            upstream
                .bytes_stream()
                .map(|c| c.map_err(std::io::Error::other)),
        );
        let mut response = Response::new(body);
        *response.status_mut() = status;
        if let Some(t) = content_type {
            response.headers_mut().insert(header::CONTENT_TYPE, t);
        }
        if let Ok(v) = HeaderValue::from_str(ours) {
            response.headers_mut().insert("mcp-session-id", v);
        }
        response
    }
}
