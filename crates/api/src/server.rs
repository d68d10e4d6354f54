//! The engine's side of the API (feature `server`): [`EngineApi`], one async method per operation
//! of the spec on the generated types, and [`router`], which binds every operation's method and
//! path to its method — both generated from the spec by `build.rs`, so an engine that lacks an
//! operation, or has one the spec no longer does, does not compile.
//!
//! What the router takes from a request before it calls a method is here, each refused through
//! [`EngineApi::rejected`] so that the engine words every error: the [`Caller`] (the tenant a
//! request acts for), the sandbox id of the path (checked; [`crate::types::SandboxId`]), the
//! query ([`ApiQuery`]) and the JSON body ([`ApiJson`], [`ApiJsonOrEmpty`]). Streamed answers
//! are [`Ndjson`].

use std::collections::HashMap;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Json, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;

#[allow(
    unused_mut,
    unreachable_pub,
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/server.rs"));
}

pub use generated::*;

/// Header with which a request acts for one tenant (the MCP HTTP server sends it for its
/// clients; see [`crate::connect_as`]).
pub const TENANT_HEADER: &str = "x-sandbox-tenant";

/// Media type of streamed responses: one JSON event per line.
pub const NDJSON: &str = "application/x-ndjson";

/// Who a request's key stands for, set on the request by the engine's authentication layer.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    /// The tenant the key is bound to, if any.
    pub tenant: Option<String>,
}

/// The caller of an operation: the tenant whose sandboxes it may see and make (`None`: all).
///
/// A key bound to a tenant always acts for it. An unbound key (which sees every sandbox) may
/// narrow itself to one tenant with the `x-sandbox-tenant` header; narrowing grants nothing, so
/// any unbound key may do it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    tenant: Option<String>,
}

impl Caller {
    pub fn new(tenant: Option<String>) -> Self {
        Self { tenant }
    }

    /// The tenant the caller acts for; `None`: every tenant.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    pub fn into_tenant(self) -> Option<String> {
        self.tenant
    }
}

/// Why the router refused a request before calling a method; [`EngineApi::rejected`] turns it
/// into the engine's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The request carries no [`Principal`]: the authentication layer did not let it through.
    Unauthenticated,
    /// The `x-sandbox-tenant` header is not a tenant name.
    InvalidTenant,
    /// The path's sandbox id (as given) is not one: a malformed id is simply not found.
    NoSuchSandbox(String),
    /// The body is over the router's limit.
    BodyTooLarge,
    /// The body is not the operation's JSON (axum's words).
    InvalidBody(String),
    /// The query is not the operation's (axum's words).
    InvalidQuery(String),
    /// A WebSocket operation called without a WebSocket handshake (what is missing).
    NotWebSocket(String),
}

fn refuse<A: EngineApi>(rejection: Rejection) -> Response {
    A::rejected(rejection).into_response()
}

impl<A: EngineApi> FromRequestParts<A> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &A) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .ok_or_else(|| refuse::<A>(Rejection::Unauthenticated))?;
        if principal.tenant.is_some() {
            return Ok(Caller::new(principal.tenant.clone()));
        }
        match parts.headers.get(TENANT_HEADER) {
            None => Ok(Caller::new(None)),
            Some(value) => value
                .to_str()
                .ok()
                .filter(|t| crate::auth::valid_tenant(t))
                .map(|t| Caller::new(Some(t.to_string())))
                .ok_or_else(|| refuse::<A>(Rejection::InvalidTenant)),
        }
    }
}

/// The path's `{sandbox_id}`, checked against the spec's pattern.
impl<A: EngineApi> FromRequestParts<A> for crate::types::SandboxId {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &A) -> Result<Self, Self::Rejection> {
        let Path(mut params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let raw = params.remove("sandbox_id").unwrap_or_default();
        Self::try_from(raw.clone()).map_err(|_| refuse::<A>(Rejection::NoSuchSandbox(raw)))
    }
}

/// A query whose rejections are the engine's errors.
pub struct ApiQuery<T>(pub T);

impl<A: EngineApi, T: DeserializeOwned> FromRequestParts<A> for ApiQuery<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &A) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Self(v))
            .map_err(|e| refuse::<A>(Rejection::InvalidQuery(e.body_text())))
    }
}

/// A JSON body whose rejections are the engine's errors.
pub struct ApiJson<T>(pub T);

impl<A: EngineApi, T: DeserializeOwned> FromRequest<A> for ApiJson<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &A) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Self(v)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(refuse::<A>(Rejection::BodyTooLarge))
            }
            Err(rejection) => Err(refuse::<A>(Rejection::InvalidBody(rejection.body_text()))),
        }
    }
}

/// Like [`ApiJson`], for a body the spec does not require: a request with no body at all
/// (`curl -X POST …`, or a client that leaves out a body whose fields are all optional) counts
/// as `{}`.
pub struct ApiJsonOrEmpty<T>(pub T);

impl<A: EngineApi, T: DeserializeOwned + Default> FromRequest<A> for ApiJsonOrEmpty<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &A) -> Result<Self, Self::Rejection> {
        let headers = req.headers();
        let empty = headers.get(header::CONTENT_TYPE).is_none()
            && headers
                .get(header::CONTENT_LENGTH)
                .is_none_or(|v| v.as_bytes() == b"0")
            && headers.get(header::TRANSFER_ENCODING).is_none();
        if empty {
            return Ok(Self(T::default()));
        }
        ApiJson::<T>::from_request(req, state)
            .await
            .map(|ApiJson(v)| Self(v))
    }
}

/// A streamed answer (`application/x-ndjson`): one JSON event per line.
pub struct Ndjson(Body);

impl Ndjson {
    /// The events as the stream yields them, each sent as it comes.
    pub fn stream(events: impl Stream<Item = serde_json::Value> + Send + 'static) -> Self {
        Self(Body::from_stream(
            events.map(|event| Ok::<_, Infallible>(Bytes::from(line(&event)))),
        ))
    }

    /// One event: an answer that has nothing to stream.
    pub fn single(event: &serde_json::Value) -> Self {
        Self(Body::from(line(event)))
    }
}

fn line(event: &serde_json::Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    line
}

impl IntoResponse for Ndjson {
    fn into_response(self) -> Response {
        ([(header::CONTENT_TYPE, NDJSON)], self.0).into_response()
    }
}

/// A WebSocket handshake (`x-dropshot-websocket` operations): the request's key and its
/// connection, to be upgraded by the answer [`WebSocketUpgrade::accept`] makes. Extracting it
/// never fails, so that the operation can refuse what it would refuse anyway (an unknown
/// sandbox, say) before it says the request was no WebSocket handshake.
pub struct WebSocketUpgrade(Result<Handshake, String>);

struct Handshake {
    key: header::HeaderValue,
    on_upgrade: hyper::upgrade::OnUpgrade,
}

/// The engine's side of an upgraded connection.
pub type WebSocket =
    tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

fn handshake(parts: &mut Parts) -> Result<Handshake, String> {
    let has = |name: header::HeaderName, value: &str| {
        parts.headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(value)))
        })
    };
    if parts.method != axum::http::Method::GET
        || !has(header::CONNECTION, "upgrade")
        || !has(header::UPGRADE, "websocket")
    {
        return Err("this operation is a WebSocket: send a GET with `Connection: Upgrade` and `Upgrade: websocket`".into());
    }
    if !has(header::SEC_WEBSOCKET_VERSION, "13") {
        return Err("only WebSocket version 13 is spoken".into());
    }
    let key = parts
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .cloned()
        .ok_or("the WebSocket handshake has no Sec-WebSocket-Key")?;
    let on_upgrade = parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or("this connection cannot be upgraded (HTTP/1.1 only)")?;
    Ok(Handshake { key, on_upgrade })
}

impl<A: EngineApi> FromRequestParts<A> for WebSocketUpgrade {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &A) -> Result<Self, Self::Rejection> {
        Ok(Self(handshake(parts)))
    }
}

impl WebSocketUpgrade {
    /// The `101 Switching Protocols` answer; `serve` runs with the socket once the client has it.
    /// A message (or frame) over `max_message` bytes ends the connection. The rejection when the
    /// request was no WebSocket handshake.
    pub fn accept<F>(
        self,
        max_message: usize,
        serve: impl FnOnce(WebSocket) -> F + Send + 'static,
    ) -> Result<Response, Rejection>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let Handshake { key, on_upgrade } = self.0.map_err(Rejection::NotWebSocket)?;
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
                hyper_util::rt::TokioIo::new(upgraded),
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                Some(
                    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                        .max_message_size(Some(max_message))
                        .max_frame_size(Some(max_message)),
                ),
            )
            .await;
            serve(socket).await;
        });
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(
            header::CONNECTION,
            header::HeaderValue::from_static("upgrade"),
        );
        headers.insert(
            header::UPGRADE,
            header::HeaderValue::from_static("websocket"),
        );
        if let Ok(v) = header::HeaderValue::from_str(&accept) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, v);
        }
        Ok(response)
    }
}
