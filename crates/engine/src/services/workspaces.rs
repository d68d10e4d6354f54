//! What a sandbox changed in a workspace it mounts: read back from its overlay's upper on the
//! host (never through the sandbox), as a git patch for the caller, or written into the folder
//! for the operator.

use std::path::PathBuf;
use std::sync::Arc;

use sandbox_mcp_model::driver::{DriverError, FsRef, MountLayers, TemplateLayout};
use sandbox_mcp_model::record::MountSource;
use sandbox_mcp_storage::workspace::{self, Changes};
use sandbox_mcp_sys::lock;

use super::registry::{Registry, Runtime};
use super::volumes::Volumes;
use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;

/// Largest patch returned (the API's bodies stay bounded; `apply` has no such limit).
pub const MAX_PATCH: usize = 16 << 20;

pub struct Workspaces {
    driver: DriverHandle,
    registry: Arc<Registry>,
    volumes: Arc<Volumes>,
}

/// Where one sandbox's copy of a workspace lies on the host.
struct Layers {
    host: PathBuf,
    upper: PathBuf,
    id_base: Option<u32>,
}

impl Workspaces {
    pub(crate) fn new(
        driver: DriverHandle,
        registry: Arc<Registry>,
        volumes: Arc<Volumes>,
    ) -> Self {
        Self {
            driver,
            registry,
            volumes,
        }
    }

    async fn layers(
        &self,
        id: &str,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Layers, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let record = lock(&entry.record).clone();
        let mounted = record.volumes.iter().find_map(|m| match &m.source {
            MountSource::Workspace { host } if m.name == name => Some((m.path.clone(), host)),
            _ => None,
        });
        let Some((target, host)) = mounted else {
            return Err(EngineError::NotFound(format!(
                "sandbox {id} mounts no workspace {name}; sandbox_info lists what it mounts"
            )));
        };
        let layout = TemplateLayout {
            name: record.template.clone(),
            mounts: vec![MountLayers {
                target: target.clone(),
                lowers: vec![host.clone()],
            }],
        };
        let fs = FsRef {
            name: id.to_string(),
            slot: Some(record.uid_slot),
        };
        let layers = self.driver.fs_layers(fs, layout).await?;
        let (_, upper, _) = layers.mounts.into_iter().next().ok_or_else(|| {
            EngineError::Conflict(format!("sandbox {id} has no layer at {target}"))
        })?;
        Ok(Layers {
            host: host.clone(),
            upper,
            id_base: layers.id_base,
        })
    }

    /// The sandbox's changes to workspace `name`, as a patch against the folder as it is now.
    pub async fn changes(
        &self,
        id: &str,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Changes, EngineError> {
        let l = self.layers(id, tenant, name).await?;
        blocking(move || workspace::changes(&l.host, &l.upper, l.id_base, MAX_PATCH))
            .await?
            .map_err(|e| EngineError::Conflict(format!("cannot read the workspace's changes: {e}")))
    }

    /// Writes the sandbox's changes to workspace `name` into the operator's folder, the sandbox
    /// frozen meanwhile. Refused for a folder exposed read-only.
    pub async fn apply(
        &self,
        id: &str,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<u64, EngineError> {
        if let Some(ws) = self.volumes.workspace(name)
            && ws.read_only
        {
            return Err(EngineError::PermissionDenied(format!(
                "workspace {name} is exposed read-only (--workspace {name}=PATH:ro): changes are not applied to it"
            )));
        }
        let l = self.layers(id, tenant, name).await?;
        if self
            .volumes
            .workspace(name)
            .is_none_or(|ws| ws.path != l.host)
        {
            return Err(EngineError::Conflict(format!(
                "workspace {name} is no longer exposed at the folder sandbox {id} mounts; expose it again with --workspace to apply"
            )));
        }
        let entry = self.registry.entry(id, tenant)?;
        let runtime = entry.lifecycle.lock().await;
        let mut thaw = false;
        if *runtime == Runtime::Running {
            match self.driver.freeze(id).await {
                Ok(()) => thaw = true,
                Err(DriverError::Unsupported(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let applied = blocking(move || workspace::apply(&l.host, &l.upper, l.id_base)).await;
        if thaw {
            self.driver.thaw(id).await?;
        }
        drop(runtime);
        applied?.map_err(|e| EngineError::Conflict(format!("cannot apply the changes: {e}")))
    }
}
