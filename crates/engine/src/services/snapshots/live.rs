//! The process half of a fork or a memory snapshot: dumping the sandbox's process trees (CRIU,
//! by the driver) just before the frozen copy of its files, so both are one moment's, and letting
//! the sandbox go on after. A paused sandbox is thawed for the dump (as any call would resume it)
//! and paused again.

use std::sync::Arc;

use sandbox_mcp_model::driver::{CloneKind, CloneMethod, FsRef, LiveReport};

use super::Snapshots;
use crate::error::EngineError;
use crate::services::lifecycle::checkpoint_of;
use crate::services::registry::{Entry, Runtime};

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

/// Files stacked rather than copied ([`Snapshots::stacked`]).
pub(in crate::services) struct Stacked {
    pub(in crate::services) method: CloneMethod,
    /// The processes carried over the sandbox's restart (none when only its agent ran).
    pub(in crate::services) carried: LiveReport,
    /// The sandbox was stopped for the stack and is left so, its processes (if any) in its
    /// hibernation checkpoint: the caller starts it ([`Restart::ByCaller`]).
    pub(in crate::services) stopped: bool,
}

/// Who starts a sandbox stopped to stack its files again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::services) enum Restart {
    /// [`Snapshots::stacked`] does, before it returns (a fork: the parent goes on beside its
    /// children).
    Now,
    /// Its caller does once what it made is kept, after a stack that succeeded (a snapshot:
    /// [`crate::services::lifecycle::Lifecycle::restart_soon`]); after one that failed, it is
    /// started again at once, as with `Now`.
    ByCaller,
}

impl Snapshots {
    /// [`Snapshots::stacked`] for a running sandbox on a store that stacks, whose agent keeps
    /// running jobs and REPL contexts at most (no finished job's output): its processes are
    /// dumped as its hibernation checkpoint (and copied as `keep`, for the caller), the sandbox
    /// is stopped, its files are stacked, and it is started again with them restored, as a wake
    /// does. A crash on the way leaves it hibernated: the next call wakes it. Only where that
    /// loses nothing: every process is in a tree that can be carried, and no TCP connection is
    /// open (a restore closes them). Else `None`, with the sandbox going on as it was, and the
    /// caller copies.
    pub(super) async fn stacked_carrying(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        runtime: &mut Runtime,
        (from, to): (FsRef, Vec<(String, CloneKind)>),
        (keep, restart): (Option<&str>, Restart),
    ) -> Result<Option<Stacked>, EngineError> {
        if !self.driver.capabilities().live_state.available {
            return Ok(None);
        }
        let name = checkpoint_of(id);
        self.driver.drop_checkpoint(&name).await;
        // Its connections are counted while it is dumped (a dump in vain if one is open).
        let (open, live) = tokio::join!(
            self.driver.open_connections(id),
            self.checkpoint_for(id, *runtime, &name)
        );
        let carried = match &live.report {
            Ok(report) if report.skipped.is_empty() && open == Some(0) => match keep {
                Some(keep) => self
                    .driver
                    .copy_checkpoint(&name, keep)
                    .await
                    .is_ok()
                    .then(|| report.clone()),
                None => Some(report.clone()),
            },
            _ => None,
        };
        let Some(carried) = carried else {
            // Nothing lost: the sandbox goes on, and is copied instead.
            self.after_checkpoint(id, &live).await?;
            self.driver.drop_checkpoint(&name).await;
            return Ok(None);
        };
        let lifecycle = &self.making.lifecycle;
        let drop_kept = async || {
            if let Some(keep) = keep {
                self.driver.drop_checkpoint(keep).await;
            }
        };
        if let Err(e) = lifecycle.stop_for_files(id, entry, runtime).await {
            // Not stopped: it goes on as it was.
            drop_kept().await;
            if *runtime == Runtime::Running {
                self.after_checkpoint(id, &live).await?;
                self.driver.drop_checkpoint(&name).await;
            }
            return Err(e);
        }
        let stacked = self.driver.stack_fs(from, to).await;
        if restart == Restart::ByCaller
            && let Ok(Some(method)) = stacked
        {
            return Ok(Some(Stacked {
                method,
                carried,
                stopped: true,
            }));
        }
        // Started again, its processes restored and their checkpoint dropped (a wake).
        let restarted = lifecycle.restart_stopped(id, entry, runtime).await;
        match (stacked, restarted) {
            (Ok(Some(method)), Ok(())) => Ok(Some(Stacked {
                method,
                carried,
                stopped: false,
            })),
            (stacked, restarted) => {
                // The caller copies instead, or fails: the copy of the processes goes.
                drop_kept().await;
                restarted?;
                stacked?;
                Ok(None)
            }
        }
    }
}

/// The checkpoint a memory snapshot's processes are kept in.
pub(crate) fn memory_of(snapshot: &str) -> String {
    format!("snapshot-{snapshot}")
}
