//! Sandboxes as a resource: create, list, get, update, kill, pause, resume, metrics; and the
//! engine's health and templates.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::convert::api_sandbox_id;
use super::convert::{Api, TryApi};
use super::request::{ApiJson, ApiJsonOrEmpty, ApiQuery, AppState, Tenant, check_env, sandbox_id};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{CreateRequest, SandboxView};
use sandbox_mcp_engine::state::NetworkRules;

type ApiResult<T> = Result<Json<T>, EngineError>;

/// Longest metadata key accepted.
const MAX_METADATA_KEY: usize = 64;
/// Most metadata pairs (the spec's `maxProperties`; the generated type does not check it).
const MAX_METADATA_PAIRS: usize = sandbox_mcp_engine::services::MAX_LABELS;
/// Longest metadata filter accepted.
const MAX_FILTER: usize = 2048;
/// Longest `timeout_seconds` (30 days).
const MAX_TIMEOUT_SECONDS: u64 = 2_592_000;

/// Metadata keys: the list filter is written `key=value,…`, so keys cannot hold `,` or `=`.
pub(super) fn check_metadata(
    m: &BTreeMap<String, types::MetadataValue>,
) -> Result<BTreeMap<String, String>, EngineError> {
    if m.len() > MAX_METADATA_PAIRS {
        return Err(EngineError::InvalidArgument(format!(
            "metadata has {} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            m.len()
        )));
    }
    let mut out = BTreeMap::new();
    for (k, v) in m {
        if k.is_empty()
            || k.chars().count() > MAX_METADATA_KEY
            || k.contains([',', '='])
            || k.contains('\0')
        {
            return Err(EngineError::InvalidArgument(format!(
                "metadata key {k:?} is invalid: use 1-{MAX_METADATA_KEY} characters without `,`, `=` or NUL"
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::InvalidArgument(format!(
                "metadata value of {k:?} contains a NUL byte"
            )));
        }
        out.insert(k.clone(), v.to_string());
    }
    Ok(out)
}

/// `key=value,key=value` → pairs.
fn parse_metadata_filter(s: &str) -> Result<Vec<(String, String)>, EngineError> {
    if s.chars().count() > MAX_FILTER {
        return Err(EngineError::InvalidArgument(format!(
            "metadata filter is longer than {MAX_FILTER} characters"
        )));
    }
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    EngineError::InvalidArgument(format!(
                        "metadata filter {pair:?} is not `key=value`; write pairs like `project=demo,owner=alice`"
                    ))
                })
        })
        .collect()
}

pub(super) fn sandbox(view: &SandboxView) -> ApiResult<types::Sandbox> {
    Ok(Json(view.try_api()?))
}

pub(super) async fn health(State(state): State<AppState>) -> ApiResult<types::Health> {
    Ok(Json(types::Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        driver: state.manager.driver().capabilities().name.into(),
    }))
}

pub(super) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<types::CreateSandboxRequest>,
) -> Result<(StatusCode, Json<types::Sandbox>), EngineError> {
    let view = state
        .manager
        .pools
        .create(create_request(&body, tenant)?)
        .await?;
    Ok((StatusCode::CREATED, sandbox(&view)?))
}

/// The manager's request for a create_sandbox body, every field checked.
pub(super) fn create_request(
    body: &types::CreateSandboxRequest,
    tenant: Tenant,
) -> Result<CreateRequest, EngineError> {
    let metadata = match &body.metadata {
        Some(m) => check_metadata(&m.0)?,
        None => BTreeMap::new(),
    };
    let env = match &body.env_vars {
        Some(e) => check_env(e)?,
        None => Vec::new(),
    };
    if let Some(t) = body.timeout_seconds
        && t.get() > MAX_TIMEOUT_SECONDS
    {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_seconds is at most {MAX_TIMEOUT_SECONDS} (30 days)"
        )));
    }
    Ok(CreateRequest {
        name: body.name.as_ref().map(|n| n.to_string()),
        template: body.template.as_ref().map(|t| t.to_string()),
        metadata,
        env,
        timeout_seconds: body.timeout_seconds.map(|t| t.get()),
        tenant: tenant.0,
        network: body.network.as_ref().map(Api::api).unwrap_or_default(),
        shape: body
            .shape
            .as_ref()
            .map(TryApi::try_api)
            .transpose()?
            .unwrap_or_default(),
        secrets: body
            .secrets
            .as_ref()
            .map(|s| {
                s.0.iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        desktop: None,
    })
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    status: Option<types::SandboxStatus>,
    metadata: Option<String>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<types::SandboxList> {
    let filter = match &query.metadata {
        Some(m) => parse_metadata_filter(m)?,
        None => Vec::new(),
    };
    let status = query.status.map(Api::api);
    let network = state.manager.networks.info();
    let sandboxes = state
        .manager
        .lifecycle
        .list_current(status, &filter, tenant.as_deref())
        .await?
        .into_iter()
        .map(|record| {
            (&SandboxView {
                record,
                network,
                usage: None,
                jobs: Vec::new(),
            })
                .try_api()
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(types::SandboxList { sandboxes }))
}

pub(super) async fn get(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::Sandbox> {
    let id = sandbox_id(&id)?;
    let mut view = state
        .manager
        .lifecycle
        .get(id, tenant.as_deref(), true)
        .await?;
    view.jobs = state
        .manager
        .agent
        .jobs(id, tenant.as_deref())
        .await
        .unwrap_or_default();
    sandbox(&view)
}

pub(super) async fn update(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::UpdateSandboxRequest>,
) -> ApiResult<types::Sandbox> {
    let metadata = match &body.metadata {
        Some(m) => Some(check_metadata(&m.0)?),
        None => None,
    };
    let network: Option<NetworkRules> = body.network.as_ref().map(Api::api);
    if metadata.is_none() && network.is_none() {
        return Err(EngineError::InvalidArgument(
            "nothing to update: give `metadata`, `network`, or both".into(),
        ));
    }
    let view = state
        .manager
        .lifecycle
        .update(sandbox_id(&id)?, tenant.as_deref(), metadata, network)
        .await?;
    sandbox(&view)
}

pub(super) async fn kill(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::KillResult> {
    let id = sandbox_id(&id)?;
    state.manager.lifecycle.kill(id, tenant.as_deref()).await?;
    Ok(Json(types::KillResult {
        id: api_sandbox_id(id)?,
        killed: true,
    }))
}

pub(super) async fn pause(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::Sandbox> {
    let view = state
        .manager
        .lifecycle
        .pause(sandbox_id(&id)?, tenant.as_deref())
        .await?;
    sandbox(&view)
}

pub(super) async fn resume(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::Sandbox> {
    let view = state
        .manager
        .lifecycle
        .resume(sandbox_id(&id)?, tenant.as_deref())
        .await?;
    sandbox(&view)
}

pub(super) async fn metrics(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::SandboxMetrics> {
    let id = sandbox_id(&id)?;
    let m = state
        .manager
        .lifecycle
        .metrics(id, tenant.as_deref())
        .await?;
    Ok(Json(types::SandboxMetrics {
        id: api_sandbox_id(id)?,
        status: m.status.api(),
        cpu_seconds: m.usage.cpu_seconds,
        memory_bytes: m.usage.memory_bytes,
        memory_peak_bytes: m.usage.memory_peak_bytes,
        memory_limit_bytes: m.usage.memory_limit_bytes,
        pids: m.usage.pids,
        pids_limit: m.usage.pids_limit,
        disk_bytes: m.disk_bytes,
        disk_limit_bytes: m.disk_limit_bytes,
        limits_enforced: m.limits_enforced,
        disk_limit_enforced: m.disk_limit_enforced,
    }))
}
