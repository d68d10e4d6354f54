//! Sandboxes as a resource: create, list, get, update, kill, pause, resume, metrics; and the
//! engine's health and templates.

use std::collections::BTreeMap;

use super::convert::api_sandbox_id;
use super::convert::{Api, TryApi};
use super::request::{AppState, check_env};
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::{self, Caller};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{CreateRequest, MountRequest, SandboxView};
use sandbox_mcp_engine::state::NetworkRules;

/// Longest metadata key accepted.
const MAX_METADATA_KEY: usize = 64;
/// Most metadata pairs (the spec's `maxProperties`; the generated type does not check it).
const MAX_METADATA_PAIRS: usize = limits::metadata::MAX_PROPERTIES;
// What the API allows is what the services keep (a fork copies its parent's metadata).
const _: () = assert!(MAX_METADATA_PAIRS == sandbox_mcp_engine::services::MAX_LABELS);
/// Longest metadata filter accepted.
const MAX_FILTER: usize = limits::metadata_filter::MAX_LENGTH;
/// Longest `timeout_seconds` (30 days).
const MAX_TIMEOUT_SECONDS: u64 = limits::create_sandbox_request::TIMEOUT_SECONDS_MAXIMUM;

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

pub(super) fn sandbox(view: &SandboxView) -> Result<types::Sandbox, EngineError> {
    view.try_api()
}

pub(super) async fn health(state: &AppState) -> Result<types::Health, EngineError> {
    Ok(types::Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        driver: state.manager.driver().capabilities().name.into(),
        live_state: {
            let live = &state.manager.driver().capabilities().live_state;
            types::LiveState {
                available: live.available,
                detail: live
                    .detail
                    .clone()
                    .try_into()
                    .map_err(|e| EngineError::Response(format!("live state detail: {e}").into()))?,
            }
        },
    })
}

pub(super) async fn create(
    state: &AppState,
    caller: Caller,
    body: types::CreateSandboxRequest,
) -> Result<types::Sandbox, EngineError> {
    let mut req = create_request(&body, caller)?;
    let wanted: Vec<MountRequest> = body
        .volumes
        .iter()
        .flatten()
        .map(|v| MountRequest {
            name: v.name.to_string(),
            path: v.path.to_string(),
            read_only: v.read_only,
        })
        .collect();
    req.volumes = state
        .manager
        .volumes
        .resolve(req.tenant.as_deref(), &wanted)
        .await?;
    let view = state.manager.pools.create(req).await?;
    sandbox(&view)
}

/// The manager's request for a create_sandbox body, every field checked.
pub(super) fn create_request(
    body: &types::CreateSandboxRequest,
    caller: Caller,
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
        tenant: caller.into_tenant(),
        network: body.network.as_ref().map(Api::api).unwrap_or_default(),
        shape: (&body.shape).try_api()?,
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
        volumes: Vec::new(),
        on_timeout: body.on_timeout.map(Api::api).unwrap_or_default(),
    })
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
    query: server::ListSandboxesQuery,
) -> Result<types::SandboxList, EngineError> {
    let filter = match &query.metadata {
        Some(m) => parse_metadata_filter(m)?,
        None => Vec::new(),
    };
    let status = query.status.map(Api::api);
    let network = state.manager.networks.info();
    let sandboxes = state
        .manager
        .lifecycle
        .list_current(status, &filter, caller.tenant())
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
    Ok(types::SandboxList { sandboxes })
}

pub(super) async fn get(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::Sandbox, EngineError> {
    let id: &str = &id;
    // The agent's answer and the cgroup and file reads side by side (each checks the tenant).
    let (view, jobs) = tokio::join!(
        state.manager.lifecycle.get(id, caller.tenant(), true),
        state.manager.agent.described_jobs(id, caller.tenant())
    );
    let mut view = view?;
    view.jobs = jobs.unwrap_or_default();
    sandbox(&view)
}

pub(super) async fn update(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::UpdateSandboxRequest,
) -> Result<types::Sandbox, EngineError> {
    let metadata = match &body.metadata {
        Some(m) => Some(check_metadata(&m.0)?),
        None => None,
    };
    let network: Option<NetworkRules> = body.network.as_ref().map(Api::api);
    let timeout = body.timeout_seconds.map(|t| t.get());
    let (lifecycle, tenant) = (&state.manager.lifecycle, caller.tenant());
    let view = match (metadata, network, timeout) {
        (None, None, None) => {
            return Err(EngineError::InvalidArgument(
                "nothing to update: give `metadata`, `network`, `timeout_seconds`, or several"
                    .into(),
            ));
        }
        (None, None, t) => lifecycle.set_timeout(&id, tenant, t).await?,
        (m, n, t) => {
            let view = lifecycle.update(&id, tenant, m, n).await?;
            match t {
                Some(_) => lifecycle.set_timeout(&id, tenant, t).await?,
                None => view,
            }
        }
    };
    sandbox(&view)
}

pub(super) async fn kill(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::KillResult, EngineError> {
    let id: &str = &id;
    state.manager.lifecycle.kill(id, caller.tenant()).await?;
    Ok(types::KillResult {
        id: api_sandbox_id(id)?,
        killed: true,
    })
}

pub(super) async fn pause(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    hibernate: Option<bool>,
) -> Result<types::Sandbox, EngineError> {
    let view = if hibernate == Some(true) {
        state
            .manager
            .lifecycle
            .hibernate(&id, caller.tenant())
            .await?
            .0
    } else {
        state.manager.lifecycle.pause(&id, caller.tenant()).await?
    };
    sandbox(&view)
}

pub(super) async fn resume(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::Sandbox, EngineError> {
    let view = state.manager.lifecycle.resume(&id, caller.tenant()).await?;
    sandbox(&view)
}

pub(super) async fn metrics(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::SandboxMetrics, EngineError> {
    let id: &str = &id;
    let m = state.manager.lifecycle.metrics(id, caller.tenant()).await?;
    Ok(types::SandboxMetrics {
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
    })
}
