//! What the API needs around its handlers: the app state, the keys and the middleware that
//! authenticates each request (setting its principal) and gives it an id, the errors for what the
//! generated router refuses and for unknown routes, and checks shared by resources.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use sandbox_mcp_api::auth::{Digest, KeyFile, KeyRing, bearer};
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::{Principal, Rejection};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_model::ids;

/// Largest request body accepted.
pub(crate) const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Longest environment variable name accepted.
const MAX_ENV_NAME: usize = limits::env_name::MAX_LENGTH;
/// Most environment variables.
const MAX_ENV_VARS: usize = limits::env_vars::MAX_PROPERTIES;

/// Accepted API keys, each standing for a principal (see [`sandbox_mcp_api::auth`]).
pub(crate) type Keys = KeyRing<Principal>;

/// The engine's keys: `fixed`, plus those of `file` (one key per line, optionally followed by
/// the tenant it is bound to, `#` comments), which is re-read when it changes. Blank keys are
/// ignored; a file naming an invalid tenant is refused whole (the keys it had stay in force).
pub fn keys(fixed: impl IntoIterator<Item = String>, file: Option<std::path::PathBuf>) -> Keys {
    fn parse(text: &str) -> Result<Vec<(Digest, Principal)>, String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let mut words = line.split_whitespace();
                let key = words.next().unwrap_or_default();
                let tenant = words.next().map(str::to_string);
                if let Some(t) = &tenant
                    && !sandbox_mcp_api::auth::valid_tenant(t)
                {
                    return Err(format!("{t:?} is not a valid tenant name"));
                }
                if words.next().is_some() {
                    return Err("a line holds a key and at most one tenant".to_string());
                }
                Ok((Digest::of(key), Principal { tenant }))
            })
            .collect()
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

/// The error for a request the generated router refused before it reached a handler.
pub(crate) fn rejected(rejection: Rejection) -> EngineError {
    match rejection {
        Rejection::Unauthenticated => EngineError::Unauthorized,
        Rejection::InvalidTenant => {
            EngineError::InvalidArgument("invalid x-sandbox-tenant header".into())
        }
        Rejection::NoSuchSandbox(raw) => {
            EngineError::sandbox_not_found(raw.chars().take(64).collect::<String>().as_str())
        }
        Rejection::BodyTooLarge => EngineError::PayloadTooLarge(format!(
            "the request body is over {} MiB",
            BODY_LIMIT / (1024 * 1024)
        )),
        Rejection::InvalidBody(text) => {
            EngineError::InvalidArgument(format!("invalid request body: {text}"))
        }
        Rejection::InvalidQuery(text) => EngineError::InvalidArgument(text),
        Rejection::NotWebSocket(text) => EngineError::InvalidArgument(text),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::convert::{api_sandbox_id, api_snapshot_id};
    use super::*;
    use sandbox_mcp_model::ids;

    /// The spec's id patterns are exactly the engine's id formats: every id the engine makes is
    /// valid API data, and a character outside its alphabet is refused by both (the router
    /// checks a path's sandbox id with the spec's pattern).
    #[test]
    fn the_spec_id_patterns_are_the_engine_id_formats() {
        for _ in 0..100 {
            assert!(api_sandbox_id(&ids::sandbox_id()).is_ok());
            assert!(api_snapshot_id(&ids::snapshot_id()).is_ok());
        }
        for c in (b'!'..=b'~').map(char::from) {
            let sandbox = format!("sbx_{c}{}", "0".repeat(25));
            let snapshot = format!("snap_{c}{}", "0".repeat(25));
            assert_eq!(
                types::SandboxId::try_from(sandbox.clone()).is_ok(),
                ids::is_sandbox_id(&sandbox),
                "{sandbox}"
            );
            assert_eq!(
                types::SnapshotId::try_from(snapshot.clone()).is_ok(),
                ids::is_snapshot_id(&snapshot),
                "{snapshot}"
            );
        }
        let against = |s: &str| types::DiffRequest::builder().against(s).try_into();
        let ok: Result<types::DiffRequest, _> = against(&ids::snapshot_id());
        assert!(ok.is_ok());
        let bad: Result<types::DiffRequest, _> = against("sbx_iiiiiiiiiiiiiiiiiiiiiiiiii");
        assert!(bad.is_err());
    }
}
