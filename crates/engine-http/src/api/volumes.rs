//! Named volumes and workspaces: create, list, delete; a sandbox's changes to a workspace, and
//! (for operator keys) applying them to the folder.

use super::convert::{api_sandbox_id, internal};
use super::request::AppState;
use sandbox_mcp_api::server::Caller;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::VolumeView;
use sandbox_mcp_model::ids;
use sandbox_mcp_storage::diff::Change;

fn view(v: VolumeView) -> Result<types::Volume, EngineError> {
    Ok(types::Volume {
        name: v.name.parse().map_err(internal)?,
        kind: if v.workspace {
            types::VolumeKind::Workspace
        } else {
            types::VolumeKind::Volume
        },
        size_bytes: v.size_bytes,
        quota_bytes: v.quota_bytes,
        read_only: v.read_only,
        used_by: v
            .used_by
            .iter()
            .map(|id| api_sandbox_id(id))
            .collect::<Result<_, _>>()?,
        created_at: v.created_at.map(ids::time),
    })
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
) -> Result<types::VolumeList, EngineError> {
    let volumes = state.manager.volumes.list(caller.tenant()).await?;
    Ok(types::VolumeList {
        volumes: volumes.into_iter().map(view).collect::<Result<_, _>>()?,
    })
}

pub(super) async fn create(
    state: &AppState,
    caller: Caller,
    body: types::CreateVolumeRequest,
) -> Result<types::Volume, EngineError> {
    let made = state
        .manager
        .volumes
        .create(caller.tenant(), &body.name, body.size_mb.map(|s| s.get()))
        .await?;
    view(made)
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    name: String,
) -> Result<types::DeleteVolumeResult, EngineError> {
    let deleted = state.manager.volumes.delete(caller.tenant(), &name).await?;
    Ok(types::DeleteVolumeResult {
        name: name.parse().map_err(internal)?,
        deleted,
    })
}

pub(super) async fn changes(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    name: String,
) -> Result<types::WorkspaceChanges, EngineError> {
    let c = state
        .manager
        .workspaces
        .changes(&id, caller.tenant(), &name)
        .await?;
    Ok(types::WorkspaceChanges {
        name: name.parse().map_err(internal)?,
        patch: c.patch,
        files: c
            .files
            .into_iter()
            .map(|f| types::WorkspaceFileChange {
                path: f.path,
                change: match f.change {
                    Change::Added => types::ChangeKind::Added,
                    Change::Removed => types::ChangeKind::Removed,
                    Change::Modified => types::ChangeKind::Modified,
                },
                binary: f.binary,
            })
            .collect(),
        added: c.added,
        removed: c.removed,
        modified: c.modified,
    })
}

pub(super) async fn apply(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    name: String,
) -> Result<types::ApplyWorkspaceResult, EngineError> {
    // The folder is the operator's: a key bound to a tenant (or narrowed to one) may read a
    // sandbox's changes, never write them into it.
    if caller.tenant().is_some() {
        return Err(EngineError::PermissionDenied(
            "applying changes to a workspace's folder takes an operator key (one not bound to a tenant)".into(),
        ));
    }
    let applied = state.manager.workspaces.apply(&id, None, &name).await?;
    Ok(types::ApplyWorkspaceResult {
        name: name.parse().map_err(internal)?,
        applied,
    })
}
