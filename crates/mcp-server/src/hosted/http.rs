//! Hosted servers over Streamable HTTP: `/servers/NAME/mcp`, and `/mcp?name=NAME` for clients
//! written for SuperBox. The HTTP server's guard has checked Host, Origin, the key, the tenant's
//! hold on the session and the rate before a request gets here.
//!
//! `POST` `initialize` opens a session (its own sandbox and server process, `Mcp-Session-Id`);
//! later `POST`s carry requests (answered as JSON, or as an SSE stream when the server speaks
//! before it answers), notifications and responses (202); `GET` opens the stream of the server's
//! own messages; `DELETE` ends the session. A 2026-07-28 request without a session gets an
//! instance of its own for that request alone.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;

use super::ServerSpec;
use super::relay::error_response;
use super::sessions::{HostedServer, Item, Sessions};
use crate::server::RequestTenant;

/// How long one request may take inside a hosted server.
const REQUEST_DEADLINE: Duration = Duration::from_secs(600);
/// A session idle this long ends, unless its server says otherwise.
const DEFAULT_IDLE: Duration = Duration::from_secs(1800);

fn jsonrpc_error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    (status, axum::Json(error_response(id, code, message))).into_response()
}

fn json_response(message: &Value) -> Response {
    (StatusCode::OK, axum::Json(message)).into_response()
}

fn sse_frame(message: &str) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

/// A message as the server wrote it, as a JSON answer.
fn raw_json(message: String) -> Response {
    let mut r = Response::new(Body::from(message));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The server's messages and then its response, as an SSE stream; a plain JSON response when the
/// response comes first (no message before it).
async fn answer(mut rx: tokio::sync::mpsc::Receiver<Item>) -> Response {
    let first = match rx.recv().await {
        Some(Item::Final(response)) => return raw_json(response),
        Some(Item::Event(message)) => message,
        None => return StatusCode::ACCEPTED.into_response(),
    };
    let rest = futures::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Item::Event(m)) => Some((sse_frame(&m), Some(rx))),
            Some(Item::Final(m)) => Some((sse_frame(&m), None)),
            None => None,
        }
    });
    let stream = futures::stream::once(async move { sse_frame(&first) })
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>);
    sse(Body::from_stream(stream))
}

fn sse(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The registration of server `name` as `tenant` may use it; its environment's values come from
/// the operator's view when the server is the operator's.
pub async fn lookup(
    sessions: &Sessions,
    tenant: Option<&str>,
    name: &str,
) -> Result<HostedServer, String> {
    let backend = sessions.backend();
    let handle = backend.client(tenant).await.map_err(|e| e.text())?;
    let mut server = handle
        .client
        .get_server()
        .name(name)
        .send()
        .await
        .map_err(crate::call::error_text)?
        .into_inner();
    if server.shared && tenant.is_some() {
        let operator = backend.client(None).await.map_err(|e| e.text())?;
        server = operator
            .client
            .get_server()
            .name(name)
            .send()
            .await
            .map_err(crate::call::error_text)?
            .into_inner();
    }
    // The operator's server runs in the operator's sandboxes: its environment, secrets and
    // sandbox stay out of the tenant's reach, the session alone being the tenant's.
    let owner = if server.shared {
        None
    } else {
        tenant.map(String::from)
    };
    Ok(hosted_server(server, owner))
}

/// A registration as sessions start it.
pub fn hosted_server(
    server: sandbox_mcp_api::types::Server,
    owner: Option<String>,
) -> HostedServer {
    let spec = ServerSpec {
        command: server.command,
        template: server.template,
        allow_out: server.allow_out,
        secrets: server.secrets,
        env: server
            .env_vars
            .map(|e| e.0.into_iter().map(|(k, v)| (k, v.to_string())).collect())
            .unwrap_or_default(),
        shape: server.shape.and_then(|s| serde_json::to_value(s).ok()),
        cwd: server.cwd,
        http_port: server.http_port,
        http_path: server.http_path,
    };
    HostedServer {
        name: server.name.to_string(),
        owner,
        spec,
        idle: if server.idle_timeout_seconds == 0 {
            DEFAULT_IDLE
        } else {
            Duration::from_secs(server.idle_timeout_seconds)
        },
        warm: server.warm as usize,
    }
}

/// One request to hosted server `name`.
pub async fn handle(sessions: Sessions, name: String, req: Request) -> Response {
    let tenant = req
        .extensions()
        .get::<RequestTenant>()
        .and_then(|t| t.0.clone());
    let session_id = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let version = req
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let session = match &session_id {
        Some(id) => match sessions.get(id, tenant.as_deref()) {
            Some(s) if s.server.name == name => {
                if let Some(ended) = s.instance.ended() {
                    sessions.close(id, tenant.as_deref()).await;
                    return jsonrpc_error(
                        StatusCode::NOT_FOUND,
                        &Value::Null,
                        -32001,
                        &format!(
                            "Session not found: it ended because {}; send initialize for a new one",
                            ended.why
                        ),
                    );
                }
                Some(s)
            }
            _ => {
                return jsonrpc_error(
                    StatusCode::NOT_FOUND,
                    &Value::Null,
                    -32001,
                    "Session not found: it ended (DELETE, idle timeout, or its server exited); send initialize for a new one",
                );
            }
        },
        None => None,
    };
    if let Some(s) = &session
        && let Some(upstream) = &s.upstream
    {
        s.touch();
        let (parts, body) = req.into_parts();
        let Ok(body) = axum::body::to_bytes(body, crate::jsonrpc::BODY_LIMIT).await else {
            return jsonrpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &Value::Null,
                -32600,
                "the request is too large",
            );
        };
        let forwarded = upstream
            .forward(parts.method.clone(), &parts.headers, body)
            .await;
        let answer = match forwarded {
            Ok(r) => upstream.answer(r, &s.id),
            Err(e) => jsonrpc_error(
                StatusCode::BAD_GATEWAY,
                &Value::Null,
                -32603,
                &format!("server {name}: {e}{}", s.instance.tail_text()),
            ),
        };
        if parts.method == Method::DELETE {
            sessions.close(&s.id, tenant.as_deref()).await;
        }
        return answer;
    }
    match *req.method() {
        Method::DELETE => match session {
            Some(s) => {
                sessions.close(&s.id, tenant.as_deref()).await;
                StatusCode::OK.into_response()
            }
            None => jsonrpc_error(
                StatusCode::BAD_REQUEST,
                &Value::Null,
                -32600,
                "DELETE needs the Mcp-Session-Id of the session to end",
            ),
        },
        Method::GET => match session {
            Some(s) => {
                let rx = s.open_get_stream();
                let stream = futures::stream::unfold(rx, |mut rx| async move {
                    match rx.recv().await {
                        Some(Item::Event(m) | Item::Final(m)) => Some((sse_frame(&m), rx)),
                        None => None,
                    }
                })
                .map(Ok::<_, std::convert::Infallible>);
                sse(Body::from_stream(stream))
            }
            None => (
                StatusCode::METHOD_NOT_ALLOWED,
                "GET needs the Mcp-Session-Id of a session",
            )
                .into_response(),
        },
        Method::POST => {
            let (parts, body) = req.into_parts();
            let headers = parts.headers;
            let body = match axum::body::to_bytes(body, crate::jsonrpc::BODY_LIMIT).await {
                Ok(b) => b,
                Err(_) => {
                    return jsonrpc_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &Value::Null,
                        -32600,
                        "the request is too large",
                    );
                }
            };
            let message: Value = match serde_json::from_slice(&body) {
                Ok(m) => m,
                Err(e) => {
                    return jsonrpc_error(
                        StatusCode::BAD_REQUEST,
                        &Value::Null,
                        -32700,
                        &format!("Parse error: {e}"),
                    );
                }
            };
            if session.is_none() && message["method"] == "initialize" {
                match lookup(&sessions, tenant.as_deref(), &name).await {
                    Ok(server) if server.spec.http_port.is_some() => {
                        return sessions
                            .open_http(tenant.as_deref(), server, &headers, body)
                            .await
                            .unwrap_or_else(|e| {
                                json_response(&error_response(&message["id"], -32603, &e))
                            });
                    }
                    _ => {}
                }
            }
            post(
                &sessions,
                tenant.as_deref(),
                &name,
                session,
                version,
                message,
            )
            .await
        }
        _ => (StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE").into_response(),
    }
}

async fn post(
    sessions: &Sessions,
    tenant: Option<&str>,
    name: &str,
    session: Option<std::sync::Arc<super::sessions::Session>>,
    version: Option<String>,
    message: Value,
) -> Response {
    if !message.is_object() {
        return jsonrpc_error(
            StatusCode::BAD_REQUEST,
            &Value::Null,
            -32600,
            "send one JSON-RPC message per POST (batches are not part of the protocol versions served here)",
        );
    }
    let id = message.get("id").cloned();
    let method = message["method"].as_str().map(String::from);
    let Some(session) = session else {
        let server = match lookup(sessions, tenant, name).await {
            Ok(s) => s,
            Err(e) => {
                return jsonrpc_error(
                    StatusCode::NOT_FOUND,
                    id.as_ref().unwrap_or(&Value::Null),
                    -32001,
                    &e,
                );
            }
        };
        if method.as_deref() == Some("initialize") {
            return match sessions.open(tenant, server, &message).await {
                Ok((Some(session), response)) => {
                    let mut r = json_response(&response);
                    if let Ok(v) = HeaderValue::from_str(&session.id) {
                        r.headers_mut().insert("mcp-session-id", v);
                    }
                    r
                }
                Ok((None, response)) => json_response(&response),
                Err(e) => json_response(&error_response(
                    id.as_ref().unwrap_or(&Value::Null),
                    -32603,
                    &e,
                )),
            };
        }
        let enveloped = message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
            .as_str()
            .is_some();
        if (version.as_deref() == Some("2026-07-28") || enveloped) && id.is_some() {
            return stateless(sessions, tenant, &server, message).await;
        }
        return jsonrpc_error(
            StatusCode::BAD_REQUEST,
            id.as_ref().unwrap_or(&Value::Null),
            -32600,
            "no session: send initialize first (or MCP-Protocol-Version: 2026-07-28 for a stateless request)",
        );
    };
    session.touch();
    match (&id, &method) {
        // A request.
        (Some(_), Some(_)) => answer(session.request(message, REQUEST_DEADLINE)).await,
        // A notification, or the client's response to the server's request.
        _ => {
            if method.as_deref() == Some("notifications/cancelled") {
                tracing::debug!(server = %name, "the client cancelled a request");
            }
            match session.send(&message).await {
                Ok(()) => StatusCode::ACCEPTED.into_response(),
                Err(e) => jsonrpc_error(StatusCode::NOT_FOUND, &Value::Null, -32001, &e),
            }
        }
    }
}

/// A 2026-07-28 request without a session: an instance of its own, ended with the request.
async fn stateless(
    sessions: &Sessions,
    tenant: Option<&str>,
    server: &HostedServer,
    message: Value,
) -> Response {
    let id = message["id"].clone();
    let instance = match sessions.one_off(tenant, server).await {
        Ok(i) => i,
        Err(e) => return json_response(&error_response(&id, -32603, &e)),
    };
    // No session, so nothing of the server's own can reach the client: its requests are refused.
    let refuser = {
        let weak = std::sync::Arc::downgrade(&instance);
        tokio::spawn(async move {
            loop {
                let Some(instance) = weak.upgrade() else {
                    return;
                };
                let Some(m) = instance.next_event().await else {
                    return;
                };
                if let Some(head) = super::relay::Head::of(&m)
                    && let (Some(id), Some(method)) = (head.id, head.method)
                {
                    let why =
                        format!("`{method}` cannot reach a client that sent a stateless request");
                    let _ = instance.send(&error_response(&id, -32601, &why)).await;
                }
            }
        })
    };
    let response = instance
        .request(&super::sessions::inner_message(&message), REQUEST_DEADLINE)
        .await
        .unwrap_or_else(|e| error_response(&id, -32603, &e).to_string());
    refuser.abort();
    instance.kill().await;
    raw_json(response)
}
