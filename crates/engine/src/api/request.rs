//! What every handler takes from a request: the app state, the authenticated principal and the
//! tenant it acts for, a JSON body or query whose rejections are API errors, a checked sandbox id
//! — and the middleware that authenticates each request and gives it an id.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{FromRequest, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, extract::rejection::QueryRejection};
use serde::de::DeserializeOwned;

use crate::error::EngineError;
use crate::manager::Manager;
use sandbox_mcp_api::auth::{Digest, KeyFile, KeyRing, bearer};
use sandbox_mcp_api::types;
use sandbox_mcp_model::ids;

/// Largest request body accepted.
pub(crate) const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Media type of streamed responses.
pub const NDJSON: &str = "application/x-ndjson";

/// Longest environment variable name accepted.
const MAX_ENV_NAME: usize = 128;
/// Most environment variables (the spec's `maxProperties`).
const MAX_ENV_VARS: usize = 64;

/// Header with which a request acts for one tenant (the MCP HTTP server sends it for its clients).
pub(crate) const TENANT_HEADER: &str = "x-sandbox-tenant";

/// Accepted API keys, each standing for a principal (see [`sandbox_mcp_api::auth`]).
pub(crate) type Keys = KeyRing<Principal>;

/// The engine's keys: `fixed`, plus those of `file` (one key per line, `#` comments), which is
/// re-read when it changes. Blank keys are ignored.
pub fn keys(fixed: impl IntoIterator<Item = String>, file: Option<std::path::PathBuf>) -> Keys {
    fn parse(text: &str) -> Result<Vec<(Digest, Principal)>, String> {
        Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|k| (Digest::of(k), Principal::default()))
            .collect())
    }
    let ring = KeyRing::new(file.map(|f| KeyFile::new(f, parse)));
    fixed
        .into_iter()
        .filter(|k| !k.trim().is_empty())
        .fold(ring, |ring, k| ring.with(k.trim(), Principal::default()))
}

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub keys: Arc<Keys>,
}

/// Who made a request: the tenant its key belongs to, if any.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    pub tenant: Option<String>,
}

/// Gives the request an id, checks its bearer key and records who made it.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let request_id = ids::request_id();
    ids::REQUEST_ID
        .scope(request_id.clone(), async move {
            let principal = bearer(req.headers()).and_then(|t| state.keys.find(t));
            let Some(principal) = principal else {
                return EngineError::Unauthorized.into_response();
            };
            req.extensions_mut().insert(principal);
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let started = Instant::now();
            let mut response = next.run(req).await;
            tracing::debug!(%request_id, %method, %path, status = response.status().as_u16(), ms = started.elapsed().as_millis() as u64, "request");
            if let Ok(v) = HeaderValue::from_str(&request_id) {
                response.headers_mut().insert("x-request-id", v);
            }
            response
        })
        .await
}

pub(crate) async fn no_route() -> EngineError {
    EngineError::NotFound("no such endpoint; see the engine's OpenAPI document".into())
}

pub(crate) async fn wrong_method() -> EngineError {
    EngineError::MethodNotAllowed
}

/// The tenant whose sandboxes a request may see (`None`: all).
///
/// A key bound to a tenant always acts for it. An unbound key (which sees every sandbox) may narrow
/// itself to one tenant with the `x-sandbox-tenant` header; narrowing grants nothing, so any
/// unbound key may do it.
pub(crate) struct Tenant(pub Option<String>);

impl Tenant {
    pub(crate) fn as_deref(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = EngineError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or(EngineError::Unauthorized)?;
        if principal.tenant.is_some() {
            return Ok(Tenant(principal.tenant));
        }
        match parts.headers.get(TENANT_HEADER) {
            None => Ok(Tenant(None)),
            Some(value) => {
                let tenant = value
                    .to_str()
                    .ok()
                    .filter(|t| sandbox_mcp_api::auth::valid_tenant(t))
                    .ok_or_else(|| {
                        EngineError::InvalidArgument("invalid x-sandbox-tenant header".into())
                    })?;
                Ok(Tenant(Some(tenant.to_string())))
            }
        }
    }
}

/// JSON body extractor whose rejections are API errors with the spec's shape.
pub(crate) struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = EngineError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => {
                let status = rejection.status();
                let text = rejection.body_text();
                Err(if status == StatusCode::PAYLOAD_TOO_LARGE {
                    EngineError::PayloadTooLarge(format!(
                        "the request body is over {} MiB",
                        BODY_LIMIT / (1024 * 1024)
                    ))
                } else {
                    EngineError::InvalidArgument(format!("invalid request body: {text}"))
                })
            }
        }
    }
}

/// Like [`ApiJson`], but a request with no body at all (`curl -X POST …`, or a client that
/// leaves out a body whose fields are all optional) counts as `{}`.
pub(crate) struct ApiJsonOrEmpty<T>(pub T);

impl<S, T> FromRequest<S> for ApiJsonOrEmpty<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Default,
{
    type Rejection = EngineError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::http::header;
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

/// Query extractor whose rejections are API errors.
pub(crate) struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = EngineError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Self(v))
            .map_err(|e: QueryRejection| EngineError::InvalidArgument(e.body_text()))
    }
}

/// A path's sandbox id; a malformed one is simply not found (no oracle for id formats).
pub fn sandbox_id(raw: &str) -> Result<&str, EngineError> {
    if ids::is_sandbox_id(raw) {
        Ok(raw)
    } else {
        Err(EngineError::sandbox_not_found(
            raw.chars().take(64).collect::<String>().as_str(),
        ))
    }
}

/// Environment variables (of a request or of a build step): names must be identifiers (OpenAPI
/// 3.0 cannot say so of object keys).
pub(super) fn check_env(
    env: &BTreeMap<String, types::EnvValue>,
) -> Result<Vec<(String, String)>, EngineError> {
    if env.len() > MAX_ENV_VARS {
        return Err(EngineError::InvalidArgument(format!(
            "{} environment variables given; at most {MAX_ENV_VARS} are allowed",
            env.len()
        )));
    }
    let mut out = Vec::new();
    for (k, v) in env.iter() {
        let valid = !k.is_empty()
            && k.len() <= MAX_ENV_NAME
            && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(EngineError::InvalidArgument(format!(
                "environment variable name {:?} is invalid: use letters, digits and `_`, not starting with a digit, at most {MAX_ENV_NAME} characters",
                k.chars().take(MAX_ENV_NAME + 1).collect::<String>()
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::InvalidArgument(format!(
                "environment variable {k} contains a NUL byte"
            )));
        }
        out.push((k.clone(), v.to_string()));
    }
    Ok(out)
}
