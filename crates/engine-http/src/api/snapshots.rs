//! Snapshots, forks, diffs and merges of a sandbox's files (`manager::snapshots`).

use super::convert::api_sandbox_id;
use super::convert::{Api, TryApi};
use super::request::AppState;
use sandbox_mcp_api::server::Caller;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::MAX_SNAPSHOTS;
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
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::CreateSnapshotRequest,
) -> Result<types::Snapshot, EngineError> {
    let name = body.name.map(|n| n.to_string());
    let snap = state
        .manager
        .snapshots
        .snapshot_create(
            &id,
            caller.tenant(),
            name,
            body.memory == Some(true),
            body.volumes,
        )
        .await?;
    snap.try_api()
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::SnapshotList, EngineError> {
    let snapshots = state
        .manager
        .snapshots
        .snapshot_list(&id, caller.tenant())
        .await?
        .into_iter()
        .map(TryApi::try_api)
        .collect::<Result<_, _>>()?;
    Ok(types::SnapshotList {
        snapshots,
        limit: MAX_SNAPSHOTS as u64,
    })
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    snap: String,
) -> Result<types::DeleteSnapshotResult, EngineError> {
    let snap = snapshot_id(&snap)?;
    state
        .manager
        .snapshots
        .snapshot_delete(&id, caller.tenant(), snap)
        .await?;
    Ok(types::DeleteSnapshotResult {
        id: super::convert::api_snapshot_id(snap)?,
        deleted: true,
    })
}

pub(super) async fn restore(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    snap: String,
) -> Result<types::RestoreResult, EngineError> {
    let snap = snapshot_id(&snap)?;
    let restored = state
        .manager
        .snapshots
        .snapshot_restore(&id, caller.tenant(), snap)
        .await?;
    restored.try_api()
}

pub(super) async fn fork(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::ForkRequest,
) -> Result<types::ForkResult, EngineError> {
    let id: &str = &id;
    let metadata = match &body.metadata {
        Some(m) => super::sandboxes::check_metadata(&m.0)?,
        None => Default::default(),
    };
    let forked = state
        .manager
        .snapshots
        .fork(
            id,
            caller.tenant(),
            body.count.get(),
            metadata,
            body.memory,
            body.volumes == types::ForkRequestVolumes::Copy,
        )
        .await?;
    Ok(types::ForkResult {
        parent_id: api_sandbox_id(id)?,
        ids: forked
            .ids
            .iter()
            .map(|c| api_sandbox_id(c))
            .collect::<Result<_, _>>()?,
        method: forked.method.api(),
        memory: forked.memory.map(TryApi::try_api).transpose()?,
    })
}

pub(super) async fn diff(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::DiffRequest,
) -> Result<types::DiffResult, EngineError> {
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
            &id,
            caller.tenant(),
            &against,
            &under,
            body.save_to.map(|p| p.to_string()),
        )
        .await?;
    super::convert::diff_result(against, diffed, limit)
}

pub(super) async fn merge(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::MergeRequest,
) -> Result<types::MergeResult, EngineError> {
    let target: &str = &id;
    let source = body.source_id.to_string();
    let method = state
        .manager
        .snapshots
        .merge(&source, target, caller.tenant(), body.force)
        .await?;
    Ok(types::MergeResult {
        target_id: api_sandbox_id(target)?,
        source_id: api_sandbox_id(&source)?,
        source_killed: true,
        method: method.api(),
    })
}
