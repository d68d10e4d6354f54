//! Snapshots, forks, diffs and merges of sandbox filesystems.
//!
//! Everything here copies a sandbox's own files (its overlay uppers) through the driver: a
//! copy-on-write snapshot of the btrfs store when it has one (milliseconds whatever the size),
//! a file-by-file copy otherwise. The template's layers are shared and never copied.
//!
//! Crash safety follows the records: a snapshot's row is written `ready: false` before its
//! files are made or deleted, a fork's children are `creating` until they run, and a restore or
//! merge swaps the new tree in with one rename. Recovery deletes whatever is not ready, so after
//! a `kill -9` nothing half-made is listed, and nothing acknowledged is lost.

use std::collections::BTreeSet;

use sandbox_mcp_model::driver::{CloneKind, CloneMethod, DriverError, FsRef, LiveReport};
use sandbox_mcp_model::ids;
use sandbox_mcp_protocol::JobState;
use sandbox_mcp_storage::diff::Diff;
use sandbox_mcp_sys::lock;

use std::sync::Arc;

use sandbox_mcp_model::record::MountSource;

use super::Making;
use super::agent::Keeps;
use super::lifecycle::checkpoint_of;
use super::registry::{Entry, Runtime};
use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::state::{Record, Snapshot};

mod diffs;
mod forks;
mod live;

use live::Live;
pub(crate) use live::memory_of;
use live::{Restart, Stacked};

/// Most snapshots one sandbox keeps.
pub const MAX_SNAPSHOTS: usize = 16;
/// Most children one fork makes.
pub(crate) const MAX_FORKS: u32 = 32;
/// Most changes a diff remembers (the counts are exact beyond it): what `save_to` can write.
const DIFF_MEMORY: usize = 100_000;
/// Most metadata labels a sandbox has (the API checks them against it too).
pub const MAX_LABELS: usize = 32;
/// Key of a fork's metadata naming its parent.
pub(crate) const FORKED_FROM: &str = "forked_from";

/// A fork's outcome.
pub struct Forked {
    pub ids: Vec<String>,
    pub method: CloneMethod,
    /// When the fork carried processes: which, and which not with why.
    pub memory: Option<sandbox_mcp_model::driver::LiveReport>,
}

/// A restore's outcome, with what it ended.
pub struct Restored {
    pub snapshot: Snapshot,
    pub method: CloneMethod,
    pub stopped_processes: u64,
    pub ended_jobs: u64,
    /// A memory snapshot's processes brought back, and those that were not.
    pub memory: Option<LiveReport>,
    pub lost_contexts: u64,
}

/// A diff, and where its full list was written.
pub struct Diffed {
    pub diff: Diff,
    pub saved_to: Option<String>,
}

/// Snapshots, forks, diffs and merges.
pub struct Snapshots {
    driver: DriverHandle,
    making: Making,
}

impl Snapshots {
    pub(crate) fn new(driver: DriverHandle, making: Making) -> Self {
        Self { driver, making }
    }

    /// Runs `work` with the sandbox's processes frozen (when it is running), so the files it
    /// reads are one moment's: a command half way through writing a file cannot tear the copy.
    async fn frozen<T>(
        &self,
        id: &str,
        runtime: Runtime,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, EngineError> {
        let mut thaw = false;
        if runtime == Runtime::Running {
            match self.driver.freeze(id).await {
                Ok(()) => thaw = true,
                // No freezer (no cgroups): copied as it is.
                Err(DriverError::Unsupported(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let out = work.await;
        if thaw {
            self.driver.thaw(id).await?;
        }
        Ok(out)
    }

    /// Stacks sandbox `id`'s files instead of copying them, where the store can and it loses
    /// nothing (see [`sandbox_mcp_model::driver::Storage::stack_fs`]): the files become a layer
    /// it and `to` share, each with a new empty layer above. A running sandbox is stopped for it
    /// and started again: as it is when nothing but its agent runs and the agent keeps no job or
    /// REPL context, else with its processes carried over the restart
    /// ([`Self::stacked_carrying`]). A stopped one must keep no processes to bring back. A
    /// sandbox mounting a host folder keeps its files in its upper (a workspace's changes are
    /// read from there). `None`: not here; clone instead. The caller holds the lifecycle lock
    /// (`runtime`). `keep`: the checkpoint name under which the caller wants the processes;
    /// `restart`: whether the sandbox is started again here or by the caller.
    pub(super) async fn stacked(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        runtime: &mut Runtime,
        to: Vec<(String, CloneKind)>,
        (keep, restart): (Option<&str>, Restart),
    ) -> Result<Option<Stacked>, EngineError> {
        let from = Self::fs_of(entry, id);
        let workspace = lock(&entry.record)
            .volumes
            .iter()
            .any(|m| matches!(m.source, MountSource::Workspace { .. }));
        // The store first: on btrfs (which clones) nothing else is asked.
        if workspace || !self.driver.can_stack_stopped(from.clone()).await {
            return Ok(None);
        }
        let alone = self.driver.can_stack(from.clone()).await;
        let carries = self.driver.capabilities().live_state.available;
        let keeps = match *runtime {
            Runtime::Running if alone || carries => self.making.agent.keeps(id, entry).await,
            _ => Keeps::Unknown,
        };
        let stop = match *runtime {
            // The driver saw nothing but the agent run; asked again after the agent, so a
            // command that started meanwhile is seen.
            Runtime::Running
                if alone
                    && keeps == Keeps::Nothing
                    && self.driver.can_stack(from.clone()).await =>
            {
                true
            }
            Runtime::Running if matches!(keeps, Keeps::Nothing | Keeps::Running) => {
                return self
                    .stacked_carrying(id, entry, runtime, (from, to), (keep, restart))
                    .await;
            }
            Runtime::Stopped if alone && !self.driver.has_checkpoint(&checkpoint_of(id)).await => {
                false
            }
            _ => return Ok(None),
        };
        if stop {
            self.making
                .lifecycle
                .stop_for_files(id, entry, runtime)
                .await?;
        }
        let stacked = self.driver.stack_fs(from, to).await;
        let left_stopped = stop && restart == Restart::ByCaller && matches!(stacked, Ok(Some(_)));
        if stop && !left_stopped {
            self.making
                .lifecycle
                .restart_stopped(id, entry, runtime)
                .await?;
        }
        Ok(stacked?.map(|method| Stacked {
            method,
            carried: LiveReport::default(),
            stopped: left_stopped,
        }))
    }

    fn fs_of(entry: &Entry, id: &str) -> FsRef {
        FsRef {
            name: id.to_string(),
            slot: Some(lock(&entry.record).uid_slot),
        }
    }

    fn disk_limit(record: &Record) -> u64 {
        record.shape.disk_mb.saturating_mul(1024 * 1024)
    }

    async fn snapshots_of(&self, id: Option<&str>) -> Result<Vec<Snapshot>, EngineError> {
        self.making.records.snapshots(id).await
    }

    /// The snapshot `snap` of sandbox `id` (ready); any other answers as not found.
    async fn own_snapshot(&self, id: &str, snap: &str) -> Result<Snapshot, EngineError> {
        self.snapshots_of(Some(id))
            .await?
            .into_iter()
            .find(|s| s.id == snap && s.ready)
            .ok_or_else(|| {
                EngineError::NotFound(format!(
                    "snapshot {snap} is not a snapshot of sandbox {id}; sandbox_snapshot_list shows its snapshots"
                ))
            })
    }

    /// What sandbox `id`'s files and `snapshots` take of its disk, and what its files alone
    /// take: the store's own count where it keeps one (btrfs simple quotas: shared blocks once,
    /// so both are the same figure), else its files measured, plus each snapshot at its size
    /// when taken.
    async fn disk_use(&self, id: &str, snapshots: &[Snapshot]) -> Result<(u64, u64), EngineError> {
        let held: u64 = snapshots.iter().map(|s| s.size_bytes).sum();
        Ok(match self.driver.disk_charge(id).await {
            Some(charged) => (charged, charged),
            None => {
                let own = self.driver.disk_bytes(id).await;
                (own.saturating_add(held), own)
            }
        })
    }

    /// Refused when the sandbox's disk is (all but) full: a snapshot could not be kept, a fork
    /// would start full.
    fn check_disk(id: &str, record: &Record, used: u64, then: &str) -> Result<(), EngineError> {
        let limit = Self::disk_limit(record);
        if used >= limit / 100 * 95 {
            return Err(EngineError::QuotaExceeded(format!(
                "sandbox {id} is at its disk limit: its files and snapshots take {} of its {} MiB, so {then}; delete a snapshot (sandbox_snapshot_delete) or files first",
                used >> 20,
                record.shape.disk_mb
            )));
        }
        Ok(())
    }

    /// To its end ([`super::lifecycle::Lifecycle::to_the_end`]).
    pub async fn snapshot_create(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
        name: Option<String>,
        memory: bool,
        volumes: bool,
    ) -> Result<Snapshot, EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        self.making
            .lifecycle
            .to_the_end(async move {
                this.snapshot_create_now(&id, tenant.as_deref(), name, memory, volumes)
                    .await
            })
            .await
    }

    async fn snapshot_create_now(
        &self,
        id: &str,
        tenant: Option<&str>,
        name: Option<String>,
        memory: bool,
        volumes: bool,
    ) -> Result<Snapshot, EngineError> {
        let entry = self.making.registry.entry(id, tenant)?;
        let live = &self.driver.capabilities().live_state;
        if memory && !live.available {
            return Err(EngineError::from(DriverError::Unsupported(format!(
                "a snapshot cannot keep processes here: {}; take it with memory=false to keep files only",
                live.detail
            ))));
        }
        let mut runtime = entry.lifecycle.clone().lock_owned().await;
        let mut stopped = false;
        let made = self
            .snapshot_locked(
                id,
                &entry,
                (&mut runtime, &mut stopped),
                (name, memory, volumes),
            )
            .await;
        if stopped {
            // Stopped to stack its files: the snapshot answers once it is kept, and the
            // sandbox's processes come back just after, before any other call on it.
            self.making.lifecycle.restart_soon(id, &entry, runtime);
        }
        made
    }

    /// [`Self::snapshot_create_now`] under the sandbox's lifecycle lock (`runtime`); `stopped`
    /// is set when its files were stacked and it is left stopped for the caller to start.
    async fn snapshot_locked(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        (runtime, stopped): (&mut Runtime, &mut bool),
        (name, memory, volumes): (Option<String>, bool, bool),
    ) -> Result<Snapshot, EngineError> {
        if *runtime == Runtime::Killed {
            return Err(EngineError::sandbox_not_found(id));
        }
        let record = lock(&entry.record).clone();
        let existing = self.snapshots_of(Some(id)).await?;
        if existing.len() >= MAX_SNAPSHOTS {
            return Err(EngineError::QuotaExceeded(format!(
                "sandbox {id} has {} snapshots, the most it may keep; delete one with sandbox_snapshot_delete",
                existing.len()
            )));
        }
        if let Some(name) = &name
            && existing.iter().any(|s| s.name.as_ref() == Some(name))
        {
            return Err(EngineError::Conflict(format!(
                "sandbox {id} already has a snapshot named {name:?}; choose another name or delete that one"
            )));
        }
        // A snapshot counts against the sandbox's disk.
        let (used, own) = self.disk_use(id, &existing).await?;
        Self::check_disk(id, &record, used, "no snapshot can be kept")?;
        let mut snap = Snapshot {
            id: ids::snapshot_id(),
            sandbox_id: id.to_string(),
            name,
            ready: false,
            method: String::new(),
            size_bytes: own,
            created_at: ids::now_ms(),
            memory_bytes: None,
        };
        self.making.records.put_snapshot(&snap).await?;
        let from = Self::fs_of(entry, id);
        let to = vec![(snap.id.clone(), CloneKind::Snapshot)];
        let keep = memory.then(|| memory_of(&snap.id));
        // Started again after the answer, unless volumes are kept too: their copy (seconds for
        // a large one) comes after the stack, and the sandbox must not stay stopped through it.
        let restart = if volumes {
            Restart::Now
        } else {
            Restart::ByCaller
        };
        let stacked = match self
            .stacked(id, entry, runtime, to, (keep.as_deref(), restart))
            .await
        {
            Ok(stacked) => {
                *stopped = stacked.as_ref().is_some_and(|s| s.stopped);
                stacked.map(|s| s.method)
            }
            Err(e) => {
                self.drop_snapshot(&snap.id).await;
                return Err(e);
            }
        };
        // Stacked: the processes, if any ran, were kept as the snapshot's memory on the way.
        let live = match (stacked, memory) {
            (None, true) => Some(
                self.checkpoint_for(id, *runtime, &memory_of(&snap.id))
                    .await,
            ),
            _ => None,
        };
        let made = match stacked {
            Some(method) => Ok(Ok(method)),
            None => {
                self.frozen(
                    id,
                    live.as_ref().map_or(*runtime, |l| l.runtime),
                    self.driver.clone_fs(from, &snap.id, CloneKind::Snapshot),
                )
                .await
            }
        };
        if let Some(l) = &live {
            self.after_checkpoint(id, l).await?;
        }
        let made = match made {
            Ok(m) => m,
            Err(e) => {
                self.drop_snapshot(&snap.id).await;
                return Err(e);
            }
        };
        let method = match made {
            Ok(method) => method,
            Err(e) => {
                self.drop_snapshot(&snap.id).await;
                return Err(e.into());
            }
        };
        if let Some(Live { report: Err(e), .. }) = live {
            self.drop_snapshot(&snap.id).await;
            return Err(e);
        }
        if volumes && let Err(e) = self.making.volumes.keep(&record, &snap.id).await {
            self.drop_snapshot(&snap.id).await;
            return Err(e);
        }
        snap.ready = true;
        snap.method = method.as_str().to_string();
        // The store's count is exact once the snapshot has committed what was in flight.
        if let Some(charged) = self.driver.disk_charge(id).await {
            snap.size_bytes = charged;
        }
        self.making.records.put_snapshot(&snap).await?;
        snap.memory_bytes = self.driver.checkpoint_bytes(&memory_of(&snap.id)).await;
        Ok(snap)
    }

    /// Deletes a snapshot's files, then its row (best effort: recovery finishes the job).
    async fn drop_snapshot(&self, snap: &str) {
        self.driver.drop_checkpoint(&memory_of(snap)).await;
        if self.driver.remove_fs(snap).await.is_ok() {
            let _ = self.making.records.delete_snapshot(snap).await;
        }
    }

    pub async fn snapshot_list(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<Snapshot>, EngineError> {
        self.making.registry.entry(id, tenant)?;
        let mut ready: Vec<Snapshot> = self
            .snapshots_of(Some(id))
            .await?
            .into_iter()
            .filter(|s| s.ready)
            .collect();
        for s in &mut ready {
            s.memory_bytes = self.driver.checkpoint_bytes(&memory_of(&s.id)).await;
        }
        Ok(ready)
    }

    pub async fn snapshot_delete(
        &self,
        id: &str,
        tenant: Option<&str>,
        snap: &str,
    ) -> Result<(), EngineError> {
        let entry = self.making.registry.entry(id, tenant)?;
        let _runtime = entry.lifecycle.lock().await;
        let mut snapshot = self.own_snapshot(id, snap).await?;
        // Marked first: a crash while its files go leaves a row recovery finishes deleting.
        snapshot.ready = false;
        self.making.records.put_snapshot(&snapshot).await?;
        self.driver.remove_fs(snap).await?;
        self.driver.drop_checkpoint(&memory_of(snap)).await;
        self.making.records.delete_snapshot(snap).await
    }

    /// To its end ([`super::lifecycle::Lifecycle::to_the_end`]).
    pub async fn snapshot_restore(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
        snap: &str,
    ) -> Result<Restored, EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        let snap = snap.to_string();
        self.making
            .lifecycle
            .to_the_end(async move {
                this.snapshot_restore_now(&id, tenant.as_deref(), &snap)
                    .await
            })
            .await
    }

    async fn snapshot_restore_now(
        &self,
        id: &str,
        tenant: Option<&str>,
        snap: &str,
    ) -> Result<Restored, EngineError> {
        let entry = self.making.registry.entry(id, tenant)?;
        let snapshot = self.own_snapshot(id, snap).await?;
        // What the restore ends, counted while the agent still answers.
        let ended_jobs = self.making.agent.jobs(id, tenant).await.map_or(0, |jobs| {
            jobs.iter()
                .filter(|j| j.status == JobState::Running)
                .count() as u64
        });
        let lost_contexts = self.making.agent.context_count(id, &entry).await;
        let mut runtime = entry.lifecycle.lock().await;
        if *runtime == Runtime::Killed {
            return Err(EngineError::sandbox_not_found(id));
        }
        // Again under the lock: a delete may have taken it meanwhile.
        let snapshot = self.own_snapshot(id, &snapshot.id).await?;
        let stopped_processes = self
            .making
            .lifecycle
            .stop_for_files(id, &entry, &mut runtime)
            .await?;
        let from = FsRef {
            name: snap.to_string(),
            slot: None,
        };
        let limit = Self::disk_limit(&lock(&entry.record));
        let method = self.driver.replace_fs(id, from, limit).await?;
        // Volumes the snapshot kept get their files back (the sandbox is stopped meanwhile).
        let record = lock(&entry.record).clone();
        self.making.volumes.put_back(&record, snap).await?;
        drop(runtime);
        self.making.lifecycle.ensure_running(id, &entry).await?;
        let name = memory_of(&snapshot.id);
        let memory = if self.driver.has_checkpoint(&name).await {
            Some(
                self.driver
                    .restore_checkpoint(id, &name)
                    .await
                    .unwrap_or_else(|e| LiveReport {
                        carried: Vec::new(),
                        skipped: vec![format!("every process ({e})")],
                    }),
            )
        } else {
            None
        };
        Ok(Restored {
            snapshot,
            method,
            stopped_processes,
            ended_jobs,
            lost_contexts,
            memory,
        })
    }

    /// After a restart: snapshots whose files were being made or deleted, or whose sandbox is
    /// gone, are deleted.
    pub(crate) async fn recover(&self) -> Result<(), EngineError> {
        let live: BTreeSet<String> = self
            .making
            .registry
            .entries()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        for snap in self.snapshots_of(None).await? {
            if !snap.ready || !live.contains(&snap.sandbox_id) {
                tracing::info!(snapshot = %snap.id, "deleting an unfinished snapshot");
                self.drop_snapshot(&snap.id).await;
            }
        }
        Ok(())
    }
}
