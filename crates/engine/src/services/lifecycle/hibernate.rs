//! Hibernation: a paused sandbox written to disk. Its process trees are checkpointed (CRIU, by
//! the driver) and its processes stopped, so their memory is freed; its files stay where they
//! are. The next call that needs it running restarts it and restores the checkpoint, which lives
//! in the engine's data directory and so outlasts an engine restart or a reboot.

use std::sync::Arc;

use sandbox_mcp_model::driver::{DriverError, LiveReport};

use super::Lifecycle;
use crate::error::EngineError;
use crate::services::SandboxView;
use crate::services::registry::{Entry, Runtime};
use crate::state::Status;

/// The checkpoint a hibernated sandbox's processes are kept in.
pub(crate) fn checkpoint_of(id: &str) -> String {
    format!("hibernated-{id}")
}

impl Lifecycle {
    /// Hibernates one of `tenant`'s sandboxes, to its end ([`Self::to_the_end`]): what was
    /// carried to disk, and what not with why.
    pub async fn hibernate(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<(SandboxView, LiveReport), EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        self.to_the_end(async move {
            let entry = this.registry.lookup(&id, tenant.as_deref()).await?;
            let report = this.hibernate_entry(&id, &entry).await?;
            Ok((this.registry.view(&entry), report))
        })
        .await
    }

    /// Whether this engine can hibernate sandboxes at all (CRIU works here).
    pub(crate) fn can_hibernate(&self) -> bool {
        self.driver.capabilities().live_state.available
    }

    pub(crate) async fn hibernate_entry(
        &self,
        id: &str,
        entry: &Arc<Entry>,
    ) -> Result<LiveReport, EngineError> {
        let live = &self.driver.capabilities().live_state;
        if !live.available {
            return Err(EngineError::from(DriverError::Unsupported(format!(
                "a sandbox cannot be hibernated here: {}; pause it without hibernate to keep its memory resident",
                live.detail
            ))));
        }
        let mut rt = entry.lifecycle.lock().await;
        match *rt {
            Runtime::Killed => return Err(EngineError::sandbox_not_found(id)),
            // Nothing runs: nothing to write.
            Runtime::Stopped => return Ok(LiveReport::default()),
            Runtime::Frozen => self.driver.thaw(id).await?,
            Runtime::Running => {}
        }
        let name = checkpoint_of(id);
        self.driver.drop_checkpoint(&name).await;
        let report = match self.driver.checkpoint(id, &name).await {
            // A process that cannot be written down would be lost: then nothing is stopped.
            Ok(r) if !r.skipped.is_empty() => Err(EngineError::Conflict(format!(
                "sandbox {id} cannot be hibernated without losing {}; pause it without hibernate to keep everything in memory",
                r.skipped.join(", ")
            ))),
            Ok(r) => Ok(r),
            Err(e) => Err(e.into()),
        };
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                // Nothing lost: the sandbox goes back to how it was.
                self.driver.drop_checkpoint(&name).await;
                self.driver.continue_processes(id).await;
                if *rt == Runtime::Frozen {
                    self.driver.freeze(id).await?;
                }
                return Err(e);
            }
        };
        self.driver.stop(id).await?;
        self.set_status(id, Status::Paused).await?;
        *rt = Runtime::Stopped;
        entry.set_visible(Runtime::Stopped);
        drop(rt);
        self.flush_active(id, entry).await;
        Ok(report)
    }

    /// After a stopped sandbox was started again: brings its hibernated processes back, if it
    /// has any. A tree that cannot come back is logged; the sandbox runs without it.
    pub(crate) async fn wake(&self, id: &str) {
        let name = checkpoint_of(id);
        if !self.driver.has_checkpoint(&name).await {
            return;
        }
        match self.driver.restore_checkpoint(id, &name).await {
            Ok(report) => {
                for why in report.skipped {
                    tracing::warn!(sandbox = %id, "woke without {why}");
                }
            }
            Err(e) => tracing::warn!(sandbox = %id, "its hibernated processes are lost: {e}"),
        }
        self.driver.drop_checkpoint(&name).await;
    }
}
