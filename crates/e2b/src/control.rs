//! E2B's control plane: sandboxes created, listed, read, paused, resumed (connected), given a
//! new timeout and killed, by `X-API-KEY` (an engine key, with its tenant), on the engine's
//! lifecycle services. Shapes follow E2B's public spec (`spec/openapi.yml` of e2b-dev/E2B);
//! what has no meaning here answers with a clear error.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use sandbox_mcp_engine::services::{CreateRequest, SandboxView};
use sandbox_mcp_model::record::{OnTimeout, Record, Status};

use crate::{Door, ENVD_VERSION, Failure, caller};

mod list;
mod more;
mod network;
mod snapshots;

use list::{list, list_running};
use more::{fork, metrics, templates, unsupported_teams, unsupported_volumes};

/// E2B's default sandbox timeout when a create names none, in seconds.
const DEFAULT_TIMEOUT: u64 = 15;
/// The template `e2b-code-interpreter` asks for.
const CODE_INTERPRETER: &str = "code-interpreter-v1";
/// Most sandboxes one list page holds.
const MAX_PAGE: usize = 1000;

type D = State<Arc<Door>>;

pub(crate) fn routes() -> Router<Arc<Door>> {
    Router::new()
        .route("/sandboxes", post(create).get(list_running))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/timeout", post(timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/templates", get(templates))
        .route("/health", get(crate::envd::health))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/network", put(network::update))
        .route("/teams", get(unsupported_teams))
        .route(
            "/volumes",
            get(unsupported_volumes).post(unsupported_volumes),
        )
        .route("/volumes/{id}", delete(unsupported_volumes))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    #[serde(default)]
    auto_pause: bool,
    /// With `autoPause`: `false` stops the sandbox's processes at its timeout and keeps only
    /// its files (resuming it is a new boot); otherwise it is paused with its memory.
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    secure: bool,
    mcp: Option<serde_json::Value>,
    volume_mounts: Option<serde_json::Value>,
    network: Option<network::Network>,
}

#[derive(Deserialize)]
struct AutoResume {
    enabled: bool,
}

/// What the sandbox's timeout does, from `autoPause` and `autoPauseMemory`.
fn on_timeout(new: &NewSandbox) -> OnTimeout {
    match (new.auto_pause, new.auto_pause_memory) {
        (false, _) => OnTimeout::Kill,
        (true, Some(false)) => OnTimeout::Stop,
        (true, _) => OnTimeout::Pause,
    }
}

/// The create and connect answer (E2B's `Sandbox`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Created {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    envd_access_token: String,
    traffic_access_token: String,
    /// Where the SDK builds sandbox host names: this door itself, never E2B's cloud, so an SDK
    /// without `E2B_SANDBOX_URL` fails here instead of sending the token elsewhere.
    domain: Option<String>,
}

/// A sandbox as read and listed (E2B's `SandboxDetail` and `ListedSandbox`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Detail {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    alias: Option<String>,
    started_at: String,
    end_at: String,
    cpu_count: u64,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    state: &'static str,
    metadata: BTreeMap<String, String>,
    envd_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    domain: Option<String>,
    /// Its egress rules, as E2B's network options.
    network: serde_json::Value,
}

const CLIENT_ID: &str = "sandbox-mcp";

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The host the client reached this door by: the domain its sandboxes' host names are under.
fn domain(headers: &HeaderMap) -> Option<String> {
    headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.len() <= 255)
        .map(str::to_string)
}

fn detail(door: &Door, r: &Record, headers: &HeaderMap, token: bool) -> Detail {
    Detail {
        template_id: r.template.clone(),
        sandbox_id: r.id.clone(),
        client_id: CLIENT_ID,
        alias: r.name.clone(),
        started_at: rfc3339(r.created_at),
        // Without a timeout a sandbox lives until killed: a year on, for clients that need a date.
        end_at: rfc3339(
            r.expires_at
                .unwrap_or(r.created_at + 365 * 24 * 3600 * 1000),
        ),
        cpu_count: r.shape.vcpus.ceil().max(1.0) as u64,
        memory_mb: r.shape.memory_mb,
        disk_size_mb: r.shape.disk_mb,
        state: match r.status {
            Status::Paused => "paused",
            _ => "running",
        },
        metadata: r.metadata.clone(),
        envd_version: ENVD_VERSION,
        envd_access_token: token.then(|| door.tokens.of(&r.id)),
        domain: domain(headers),
        network: serde_json::json!({"allowOut": r.network.allow_out, "denyOut": r.network.deny_out}),
    }
}

fn created(door: &Door, r: &Record, headers: &HeaderMap) -> Created {
    Created {
        template_id: r.template.clone(),
        sandbox_id: r.id.clone(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        envd_access_token: door.tokens.of(&r.id),
        traffic_access_token: door.tokens.traffic_of(&r.id),
        domain: domain(headers),
    }
}

/// Refuses a request that asks for any option the door does not honour: the first one's
/// reason, a `400`. Never silently ignored.
fn refuse(options: &[(bool, &str)]) -> Result<(), Failure> {
    match options.iter().find(|(asked, _)| *asked) {
        Some((_, why)) => Err(Failure::bad(*why)),
        None => Ok(()),
    }
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Failure> {
    serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        .map_err(|e| Failure::bad(format!("invalid request body: {e}")))
}

fn check_env(env: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, Failure> {
    env.iter()
        .map(|(k, v)| {
            if crate::valid_env(k, v) {
                Ok((k.clone(), v.clone()))
            } else {
                Err(Failure::bad(format!(
                    "environment variable {:?} is invalid: a name of letters, digits and `_` not starting with a digit, and a value without NUL",
                    k.chars().take(64).collect::<String>()
                )))
            }
        })
        .collect()
}

fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), Failure> {
    if m.len() > sandbox_mcp_engine::services::MAX_LABELS {
        return Err(Failure::bad(format!(
            "metadata has {} pairs; at most {} are allowed",
            m.len(),
            sandbox_mcp_engine::services::MAX_LABELS
        )));
    }
    for (k, v) in m {
        if k.is_empty()
            || k.chars().count() > 64
            || k.contains([',', '=', '\0'])
            || v.contains('\0')
        {
            return Err(Failure::bad(format!(
                "metadata key {k:?} is invalid: use 1-64 characters without `,`, `=` or NUL"
            )));
        }
    }
    Ok(())
}

async fn create(State(door): D, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    match try_create(&door, &headers, &body).await {
        Ok(c) => (StatusCode::CREATED, Json(c)).into_response(),
        Err(f) => f.into_response(),
    }
}

async fn try_create(door: &Door, headers: &HeaderMap, body: &[u8]) -> Result<Created, Failure> {
    let tenant = caller(door, headers)?;
    let new: NewSandbox = parse_body(body)?;
    refuse(&[
        (
            new.auto_resume.as_ref().is_some_and(|r| r.enabled),
            "autoResume is not supported here: a paused sandbox is resumed by connecting to it (Sandbox.connect())",
        ),
        (
            new.mcp.is_some(),
            "Failed to start MCP gateway: E2B's MCP gateway (mcp) is not supported here; the engine's own hosted MCP servers are (see its README)",
        ),
        (
            new.volume_mounts.is_some(),
            "volumeMounts are not supported through the E2B API here; use the engine's volumes",
        ),
    ])?;
    let _ = new.secure;
    let on_timeout = on_timeout(&new);
    check_metadata(&new.metadata)?;
    let network = network::rules(new.network.unwrap_or_default(), new.allow_internet_access)?;
    // E2B's code interpreter template is its base with a Jupyter server; here the engine's REPL
    // contexts serve that API in any template, so it names the default one unless one by that
    // name exists.
    let template = match new.template_id.as_str() {
        CODE_INTERPRETER | "code-interpreter"
            if door
                .manager
                .catalog
                .template_for(tenant.as_deref(), &new.template_id)
                .is_err() =>
        {
            door.manager.catalog.default_template()
        }
        _ => new.template_id,
    };
    let req = CreateRequest {
        name: None,
        template: Some(template),
        metadata: new.metadata,
        env: check_env(&new.env_vars)?,
        timeout_seconds: Some(new.timeout.unwrap_or(DEFAULT_TIMEOUT)),
        tenant,
        network,
        secrets: BTreeMap::new(),
        shape: Default::default(),
        desktop: None,
        volumes: Vec::new(),
        on_timeout,
    };
    let view = door.manager.pools.create(req).await?;
    Ok(created(door, &view.record, headers))
}

async fn view(
    door: &Door,
    headers: &HeaderMap,
    id: &str,
) -> Result<(SandboxView, Option<String>), Failure> {
    let tenant = caller(door, headers)?;
    let view = crate::live(door, id, tenant.as_deref()).await?;
    Ok((view, tenant))
}

async fn info(State(door): D, headers: HeaderMap, Path(id): Path<String>) -> Response {
    match view(&door, &headers, &id).await {
        Ok((v, _)) => Json(detail(&door, &v.record, &headers, true)).into_response(),
        Err(f) => f.into_response(),
    }
}

async fn kill(State(door): D, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let done = async {
        let tenant = caller(&door, &headers)?;
        door.manager.lifecycle.kill(&id, tenant.as_deref()).await?;
        door.forget(&id);
        Ok::<_, Failure>(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}

#[derive(Deserialize)]
struct Pause {
    /// `false`: keep the files only; resuming is a new boot.
    memory: Option<bool>,
}

async fn pause(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let (v, tenant) = view(&door, &headers, &id).await?;
        let how: Pause = parse_body(&body)?;
        if v.record.status == Status::Paused {
            return Err(Failure::new(
                StatusCode::CONFLICT,
                format!("sandbox {id} is already paused"),
            ));
        }
        let lifecycle = &door.manager.lifecycle;
        if how.memory == Some(false) {
            lifecycle.stop(&id, tenant.as_deref()).await?;
        } else {
            lifecycle.pause(&id, tenant.as_deref()).await?;
        }
        Ok(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}

#[derive(Deserialize)]
struct Timeout {
    timeout: Option<u64>,
}

/// Connect: resumes a paused sandbox (201) or finds a running one (200), and sets its timeout.
async fn connect(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    resumed(&door, &headers, &id, &body, false).await
}

/// The older resume: a running sandbox is a conflict.
async fn resume(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    resumed(&door, &headers, &id, &body, true).await
}

async fn resumed(
    door: &Door,
    headers: &HeaderMap,
    id: &str,
    body: &[u8],
    strict: bool,
) -> Response {
    let done = async {
        let t: Timeout = parse_body(body)?;
        let (v, tenant) = view(door, headers, id).await?;
        let was_paused = v.record.status == Status::Paused;
        if strict && !was_paused {
            return Err(Failure::new(
                StatusCode::CONFLICT,
                format!("sandbox {id} is already running"),
            ));
        }
        let v = if was_paused {
            door.manager.lifecycle.resume(id, tenant.as_deref()).await?
        } else {
            v
        };
        // A connect extends the sandbox's life to at least `timeout` from now, never shortens it
        // (where a timeout cannot be moved later, a pod's, it keeps the one it has).
        if let Some(seconds) = t.timeout {
            let wanted = sandbox_mcp_model::ids::now_ms() + (seconds as i64) * 1000;
            if v.record.expires_at.is_some_and(|at| at < wanted)
                && door.manager.lifecycle.timeouts_extend()
            {
                door.manager
                    .lifecycle
                    .set_timeout(id, tenant.as_deref(), Some(seconds))
                    .await?;
            }
        }
        let status = if was_paused {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok((status, Json(created(door, &v.record, headers))))
    };
    done.await.into_response()
}

async fn timeout(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let t: Timeout = parse_body(&body)?;
        let seconds = t
            .timeout
            .ok_or_else(|| Failure::bad("timeout (seconds) is required"))?;
        let tenant = caller(&door, &headers)?;
        door.manager
            .lifecycle
            .set_timeout(&id, tenant.as_deref(), Some(seconds))
            .await?;
        Ok::<_, Failure>(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}

#[derive(Deserialize)]
struct Refresh {
    duration: Option<u64>,
}

/// Extends the sandbox's life by `duration` seconds from now (E2B's keep-alive).
async fn refresh(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let r: Refresh = parse_body(&body)?;
        let tenant = caller(&door, &headers)?;
        door.manager
            .lifecycle
            .set_timeout(
                &id,
                tenant.as_deref(),
                Some(r.duration.unwrap_or(DEFAULT_TIMEOUT)),
            )
            .await?;
        Ok::<_, Failure>(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}
