//! Snapshots, forks, diffs and merges of a sandbox's files (`services::snapshots`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::convert::api_sandbox_id;
use super::convert::{Api, TryApi};
use super::request::{ApiJson, ApiJsonOrEmpty, AppState, Tenant, sandbox_id};
use crate::error::EngineError;
use crate::services::MAX_SNAPSHOTS;
use sandbox_mcp_api::types;
use sandbox_mcp_model::ids;

/// A snapshot id from a path, checked before anything is looked up.
fn snapshot_id(raw: &str) -> Result<&str, EngineError> {
    if ids::is_snapshot_id(raw) {
        Ok(raw)
    } else {
        Err(EngineError::InvalidArgument(format!(
            "{raw:?} is not a snapshot id (snap_ and 26 base32 characters); sandbox_snapshot_list shows them"
        )))
    }
}

pub(super) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<types::CreateSnapshotRequest>,
) -> Result<(StatusCode, Json<types::Snapshot>), EngineError> {
    let name = body.name.map(|n| n.to_string());
    let snap = state
        .manager
        .snapshots
        .snapshot_create(sandbox_id(&id)?, tenant.as_deref(), name)
        .await?;
    Ok((StatusCode::CREATED, Json(snap.try_api()?)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<types::SnapshotList>, EngineError> {
    let snapshots = state
        .manager
        .snapshots
        .snapshot_list(sandbox_id(&id)?, tenant.as_deref())
        .await?
        .into_iter()
        .map(TryApi::try_api)
        .collect::<Result<_, _>>()?;
    Ok(Json(types::SnapshotList {
        snapshots,
        limit: MAX_SNAPSHOTS as u64,
    }))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, snap)): Path<(String, String)>,
) -> Result<Json<types::DeleteSnapshotResult>, EngineError> {
    let snap = snapshot_id(&snap)?;
    state
        .manager
        .snapshots
        .snapshot_delete(sandbox_id(&id)?, tenant.as_deref(), snap)
        .await?;
    Ok(Json(types::DeleteSnapshotResult {
        id: super::convert::api_snapshot_id(snap)?,
        deleted: true,
    }))
}

pub(super) async fn restore(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, snap)): Path<(String, String)>,
) -> Result<Json<types::RestoreResult>, EngineError> {
    let snap = snapshot_id(&snap)?;
    let restored = state
        .manager
        .snapshots
        .snapshot_restore(sandbox_id(&id)?, tenant.as_deref(), snap)
        .await?;
    Ok(Json(restored.try_api()?))
}

pub(super) async fn fork(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<types::ForkRequest>,
) -> Result<(StatusCode, Json<types::ForkResult>), EngineError> {
    let id = sandbox_id(&id)?;
    let metadata = match &body.metadata {
        Some(m) => super::sandboxes::check_metadata(&m.0)?,
        None => Default::default(),
    };
    let forked = state
        .manager
        .snapshots
        .fork(id, tenant.as_deref(), body.count.get(), metadata)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(types::ForkResult {
            parent_id: api_sandbox_id(id)?,
            ids: forked
                .ids
                .iter()
                .map(|c| api_sandbox_id(c))
                .collect::<Result<_, _>>()?,
            method: forked.method.api(),
        }),
    ))
}

pub(super) async fn diff(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::DiffRequest>,
) -> Result<Json<types::DiffResult>, EngineError> {
    let against = body.against.to_string();
    let under = body.path.to_string();
    if under.split('/').any(|c| c == "..") {
        return Err(EngineError::InvalidArgument(format!(
            "path {under:?} may not contain `..`; give an absolute path such as /root/project"
        )));
    }
    let limit = body.limit as usize;
    let diffed = state
        .manager
        .snapshots
        .diff(
            sandbox_id(&id)?,
            tenant.as_deref(),
            &against,
            &under,
            body.save_to.map(|p| p.to_string()),
        )
        .await?;
    Ok(Json(super::convert::diff_result(against, diffed, limit)?))
}

pub(super) async fn merge(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::MergeRequest>,
) -> Result<Json<types::MergeResult>, EngineError> {
    let target = sandbox_id(&id)?;
    let source = body.source_id.to_string();
    let method = state
        .manager
        .snapshots
        .merge(&source, target, tenant.as_deref(), body.force)
        .await?;
    Ok(Json(types::MergeResult {
        target_id: api_sandbox_id(target)?,
        source_id: api_sandbox_id(&source)?,
        source_killed: true,
        method: method.api(),
    }))
}
