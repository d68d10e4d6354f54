//! envd, the API E2B's SDKs expect inside each sandbox, served by the engine through the
//! sandbox's agent: which sandbox a request is for and whether its token opens it, `/health` and
//! `/envs` here; `/files` and the `filesystem` service in [`crate::files`], the `process` service
//! in [`crate::process`].
//!
//! A request names its sandbox with `E2b-Sandbox-Id` (the SDKs send it when `E2B_SANDBOX_URL`
//! points here) and carries that sandbox's access token in `X-Access-Token`: the token opens
//! that sandbox only, whoever's it is. A sandbox that does not run (killed, never made) answers
//! 502 as E2B's proxy does, so the SDKs report it the same way.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::Door;
use crate::connect::RpcError;

/// Which sandbox a request is for, once its token is checked, and that it runs.
pub(crate) struct Sandbox {
    pub(crate) id: String,
}

/// Why an envd request is refused, as E2B's proxy and envd answer.
pub(crate) enum Refusal {
    NoSandbox,
    BadToken,
    NotFound(String),
    /// A signed file URL past its expiry, or signed by no sandbox's token.
    Expired,
    BadSignature,
}

impl Refusal {
    pub(crate) fn rpc(self) -> RpcError {
        match self {
            Refusal::NoSandbox => RpcError::invalid(
                "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this engine's E2B address",
            ),
            Refusal::BadToken => RpcError::new(
                "unauthenticated",
                "invalid or missing X-Access-Token for this sandbox",
            ),
            Refusal::NotFound(id) => {
                RpcError::new("unavailable", format!("sandbox {id} was not found"))
            }
            Refusal::Expired => RpcError::new("unauthenticated", "signature is already expired"),
            Refusal::BadSignature => RpcError::new("unauthenticated", "invalid signature"),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::NotFound(id) => (
                StatusCode::BAD_GATEWAY,
                axum::Json(serde_json::json!({
                    "sandboxId": id,
                    "message": "The sandbox was not found",
                    "code": 502,
                })),
            )
                .into_response(),
            Refusal::NoSandbox => crate::Failure::bad(
                "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this engine's E2B address",
            )
            .into_response(),
            Refusal::BadToken => crate::Failure::new(
                StatusCode::UNAUTHORIZED,
                "invalid or missing X-Access-Token for this sandbox",
            )
            .into_response(),
            Refusal::Expired => {
                crate::Failure::new(StatusCode::UNAUTHORIZED, "signature is already expired")
                    .into_response()
            }
            Refusal::BadSignature => {
                crate::Failure::new(StatusCode::UNAUTHORIZED, "invalid signature").into_response()
            }
        }
    }
}

/// Which of a sandbox's services a request is for, by its route: envd (processes, files,
/// watches) or the code interpreter (E2B's port 49999).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Envd,
    Interpreter,
}

/// The sandbox an envd request is for: named, its envd token right, and known to the engine (a
/// paused one is resumed by the first call that needs its agent, as on the engine's own API).
pub(crate) async fn sandbox(door: &Door, headers: &HeaderMap) -> Result<Sandbox, Refusal> {
    sandbox_for(door, headers, Service::Envd).await
}

/// The sandbox a request for `service` is for. The envd token opens every service; the traffic
/// token, which the SDKs send to a sandbox's ports, opens the code interpreter alone. Which
/// service is the route's, never a header's: `E2b-Sandbox-Port` is the client's to set.
pub(crate) async fn sandbox_for(
    door: &Door,
    headers: &HeaderMap,
    service: Service,
) -> Result<Sandbox, Refusal> {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .ok_or(Refusal::NoSandbox)?;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let opened = door.tokens.opens(id, header("x-access-token"))
        || (service == Service::Interpreter
            && door
                .tokens
                .opens_traffic(id, header("e2b-traffic-access-token")));
    if !opened {
        return Err(Refusal::BadToken);
    }
    if crate::live(door, id, None).await.is_err() {
        return Err(Refusal::NotFound(id.chars().take(64).collect()));
    }
    Ok(Sandbox { id: id.to_string() })
}

/// A `/files` URL as the SDKs sign it (`download_url`, `upload_url`): what it names and its
/// signature.
pub(crate) struct SignedUrl<'a> {
    pub(crate) path: &'a str,
    /// `read` or `write`.
    pub(crate) operation: &'a str,
    pub(crate) user: &'a str,
    pub(crate) signature: Option<&'a str>,
    pub(crate) expiration: Option<i64>,
}

/// The sandbox a `/files` request is for: by its token (as [`sandbox`]), or else by a signed
/// URL's signature, which only the holder of a sandbox's token can make. A URL without
/// `E2b-Sandbox-Id` (the SDKs build it from `E2B_SANDBOX_URL` alone) is matched against each
/// sandbox's token in turn.
pub(crate) async fn file_sandbox(
    door: &Door,
    headers: &HeaderMap,
    url: &SignedUrl<'_>,
) -> Result<Sandbox, Refusal> {
    let Some(signature) = url
        .signature
        .filter(|_| headers.get("x-access-token").is_none())
    else {
        return sandbox(door, headers).await;
    };
    if url
        .expiration
        .is_some_and(|at| at < sandbox_mcp_model::ids::now_ms() / 1000)
    {
        return Err(Refusal::Expired);
    }
    let named = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let candidates = match named {
        Some(id) => vec![id],
        None => door
            .manager
            .lifecycle
            .list_current(None, &[], None)
            .await
            .map_err(|_| Refusal::BadSignature)?
            .into_iter()
            .map(|r| r.id)
            .collect(),
    };
    let signed = (url.path, url.operation, url.user, url.expiration);
    let id = candidates
        .into_iter()
        .find(|id| door.tokens.signed(id, signature, signed))
        .ok_or(Refusal::BadSignature)?;
    if crate::live(door, &id, None).await.is_err() {
        return Err(Refusal::NotFound(id.chars().take(64).collect()));
    }
    Ok(Sandbox { id })
}

/// `/health`: envd's (204) when a sandbox is named, else the control plane's (200).
pub(crate) async fn health(State(door): State<Arc<Door>>, headers: HeaderMap) -> Response {
    if headers.get("e2b-sandbox-id").is_none() {
        return StatusCode::OK.into_response();
    }
    match sandbox(&door, &headers).await {
        // A paused sandbox's envd does not answer until it is connected to (resumed), as on E2B:
        // that is how the SDKs tell it is not running.
        Ok(s) => match door.manager.lifecycle.get(&s.id, None, false).await {
            Ok(v) if v.record.status == sandbox_mcp_model::record::Status::Paused => {
                Refusal::NotFound(s.id).into_response()
            }
            _ => StatusCode::NO_CONTENT.into_response(),
        },
        Err(r) => r.into_response(),
    }
}

/// `/envs`: the sandbox's environment variables (those it was created with).
pub(crate) async fn envs(State(door): State<Arc<Door>>, headers: HeaderMap) -> Response {
    let s = match sandbox(&door, &headers).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match door.manager.lifecycle.get(&s.id, None, false).await {
        Ok(v) => axum::Json(
            v.record
                .env
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
        .into_response(),
        Err(e) => crate::Failure::from(e).into_response(),
    }
}
