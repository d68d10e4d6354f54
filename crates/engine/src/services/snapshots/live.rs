//! The process half of a fork or a memory snapshot: dumping the sandbox's process trees (CRIU,
//! by the driver) just before the frozen copy of its files, so both are one moment's, and letting
//! the sandbox go on after. A paused sandbox is thawed for the dump (as any call would resume it)
//! and paused again.

use sandbox_mcp_model::driver::LiveReport;

use super::Snapshots;
use crate::error::EngineError;
use crate::services::registry::Runtime;

/// A checkpoint taken ahead of a copy of the files.
pub(super) struct Live {
    /// What the copy should treat the sandbox as: running when it was thawed for the dump.
    pub(super) runtime: Runtime,
    refreeze: bool,
    /// The trees dumped and those left behind, or why none could be.
    pub(super) report: Result<LiveReport, EngineError>,
}

impl Snapshots {
    /// Dumps sandbox `id`'s process trees as checkpoint `name`, leaving them stopped until
    /// [`Self::after_checkpoint`].
    pub(super) async fn checkpoint_for(&self, id: &str, runtime: Runtime, name: &str) -> Live {
        let refreeze = runtime == Runtime::Frozen;
        if refreeze && let Err(e) = self.driver.thaw(id).await {
            return Live {
                runtime,
                refreeze: false,
                report: Err(e.into()),
            };
        }
        let runtime = if refreeze { Runtime::Running } else { runtime };
        let report = if runtime == Runtime::Running {
            self.driver.checkpoint(id, name).await.map_err(Into::into)
        } else {
            Ok(LiveReport {
                carried: Vec::new(),
                skipped: vec!["every process (the sandbox is stopped: none runs)".into()],
            })
        };
        Live {
            runtime,
            refreeze,
            report,
        }
    }

    /// Lets the sandbox go on once its files are copied (and pauses it again if it was).
    pub(super) async fn after_checkpoint(&self, id: &str, live: &Live) -> Result<(), EngineError> {
        if live.runtime == Runtime::Running {
            self.driver.continue_processes(id).await;
        }
        if live.refreeze {
            self.driver.freeze(id).await?;
        }
        Ok(())
    }
}

/// The checkpoint a memory snapshot's processes are kept in.
pub(crate) fn memory_of(snapshot: &str) -> String {
    format!("snapshot-{snapshot}")
}
