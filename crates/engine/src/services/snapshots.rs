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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use sandbox_mcp_model::driver::{CloneKind, CloneMethod, DriverError, FsLayers, FsRef};
use sandbox_mcp_model::ids;
use sandbox_mcp_protocol::{JobState, WriteFile};
use sandbox_mcp_storage::diff::{self, Diff};
use sandbox_mcp_sys::lock;

use super::agent::AgentClient;
use super::catalog::Catalog;
use super::lifecycle::Lifecycle;
use super::networks::Networks;
use super::registry::{Entry, Registry, Runtime};
use super::secrets::Secrets;
use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;
use crate::records::Records;
use crate::state::{Record, Snapshot, Status};

/// Most snapshots one sandbox keeps.
pub(crate) const MAX_SNAPSHOTS: usize = 16;
/// Most children one fork makes.
pub(crate) const MAX_FORKS: u32 = 32;
/// Most changes a diff remembers (the counts are exact beyond it): what `save_to` can write.
const DIFF_MEMORY: usize = 100_000;
/// Most metadata labels a sandbox has (the API checks them against it too).
pub(crate) const MAX_LABELS: usize = 32;
/// Key of a fork's metadata naming its parent.
pub(crate) const FORKED_FROM: &str = "forked_from";

/// A fork's outcome.
pub(crate) struct Forked {
    pub ids: Vec<String>,
    pub method: CloneMethod,
}

/// A restore's outcome, with what it ended.
pub(crate) struct Restored {
    pub snapshot: Snapshot,
    pub method: CloneMethod,
    pub stopped_processes: u64,
    pub ended_jobs: u64,
    pub lost_contexts: u64,
}

/// A diff, and where its full list was written.
pub(crate) struct Diffed {
    pub diff: Diff,
    pub saved_to: Option<String>,
}

/// Snapshots, forks, diffs and merges.
pub(crate) struct Snapshots {
    driver: DriverHandle,
    records: Arc<Records>,
    registry: Arc<Registry>,
    networks: Arc<Networks>,
    secrets: Arc<Secrets>,
    catalog: Arc<Catalog>,
    lifecycle: Arc<Lifecycle>,
    agent: Arc<AgentClient>,
}

impl Snapshots {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        driver: DriverHandle,
        records: Arc<Records>,
        registry: Arc<Registry>,
        networks: Arc<Networks>,
        secrets: Arc<Secrets>,
        catalog: Arc<Catalog>,
        lifecycle: Arc<Lifecycle>,
        agent: Arc<AgentClient>,
    ) -> Self {
        Self {
            driver,
            records,
            registry,
            networks,
            secrets,
            catalog,
            lifecycle,
            agent,
        }
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
        self.records.snapshots(id).await
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

    pub(crate) async fn snapshot_create(
        &self,
        id: &str,
        tenant: Option<&str>,
        name: Option<String>,
    ) -> Result<Snapshot, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let runtime = entry.lifecycle.lock().await;
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
        };
        self.records.put_snapshot(&snap).await?;
        let from = Self::fs_of(&entry, id);
        let made = self
            .frozen(
                id,
                *runtime,
                self.driver.clone_fs(from, &snap.id, CloneKind::Snapshot),
            )
            .await?;
        let method = match made {
            Ok(method) => method,
            Err(e) => {
                self.drop_snapshot(&snap.id).await;
                return Err(e.into());
            }
        };
        snap.ready = true;
        snap.method = method.as_str().to_string();
        // The store's count is exact once the snapshot has committed what was in flight.
        if let Some(charged) = self.driver.disk_charge(id).await {
            snap.size_bytes = charged;
        }
        self.records.put_snapshot(&snap).await?;
        Ok(snap)
    }

    /// Deletes a snapshot's files, then its row (best effort: recovery finishes the job).
    async fn drop_snapshot(&self, snap: &str) {
        if self.driver.remove_fs(snap).await.is_ok() {
            let _ = self.records.delete_snapshot(snap).await;
        }
    }

    pub(crate) async fn snapshot_list(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<Snapshot>, EngineError> {
        self.registry.entry(id, tenant)?;
        Ok(self
            .snapshots_of(Some(id))
            .await?
            .into_iter()
            .filter(|s| s.ready)
            .collect())
    }

    pub(crate) async fn snapshot_delete(
        &self,
        id: &str,
        tenant: Option<&str>,
        snap: &str,
    ) -> Result<(), EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let _runtime = entry.lifecycle.lock().await;
        let mut snapshot = self.own_snapshot(id, snap).await?;
        // Marked first: a crash while its files go leaves a row recovery finishes deleting.
        snapshot.ready = false;
        self.records.put_snapshot(&snapshot).await?;
        self.driver.remove_fs(snap).await?;
        self.records.delete_snapshot(snap).await
    }

    pub(crate) async fn snapshot_restore(
        &self,
        id: &str,
        tenant: Option<&str>,
        snap: &str,
    ) -> Result<Restored, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let snapshot = self.own_snapshot(id, snap).await?;
        // What the restore ends, counted while the agent still answers.
        let ended_jobs = self.agent.jobs(id, tenant).await.map_or(0, |jobs| {
            jobs.iter()
                .filter(|j| j.status == JobState::Running)
                .count() as u64
        });
        let lost_contexts = self.agent.context_count(id, &entry).await;
        let mut runtime = entry.lifecycle.lock().await;
        if *runtime == Runtime::Killed {
            return Err(EngineError::sandbox_not_found(id));
        }
        // Again under the lock: a delete may have taken it meanwhile.
        let snapshot = self.own_snapshot(id, &snapshot.id).await?;
        let stopped_processes = self
            .lifecycle
            .stop_for_files(id, &entry, &mut runtime)
            .await?;
        let from = FsRef {
            name: snap.to_string(),
            slot: None,
        };
        let limit = Self::disk_limit(&lock(&entry.record));
        let method = self.driver.replace_fs(id, from, limit).await?;
        drop(runtime);
        self.lifecycle.ensure_running(id, &entry).await?;
        Ok(Restored {
            snapshot,
            method,
            stopped_processes,
            ended_jobs,
            lost_contexts,
        })
    }

    pub(crate) async fn fork(
        &self,
        id: &str,
        tenant: Option<&str>,
        count: u32,
        metadata: BTreeMap<String, String>,
    ) -> Result<Forked, EngineError> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(EngineError::InvalidArgument(format!(
                "count must be 1 to {MAX_FORKS}; got {count}"
            )));
        }
        let parent = self.registry.entry(id, tenant)?;
        let runtime = parent.lifecycle.lock().await;
        if *runtime == Runtime::Killed {
            return Err(EngineError::sandbox_not_found(id));
        }
        let record = lock(&parent.record).clone();
        let snapshots = self.snapshots_of(Some(id)).await?;
        let (used, _) = self.disk_use(id, &snapshots).await?;
        Self::check_disk(id, &record, used, "its forks would start full")?;
        let mut labels = record.metadata.clone();
        labels.extend(metadata.clone());
        labels.insert(FORKED_FROM.to_string(), id.to_string());
        if labels.len() > MAX_LABELS {
            return Err(EngineError::InvalidArgument(format!(
                "the children would have {} metadata labels (the parent's, yours and forked_from); at most {MAX_LABELS} are allowed",
                labels.len()
            )));
        }
        let children = self.reserve_children(&record, count, labels).await?;
        let made = self.make_children(id, &parent, *runtime, &children).await;
        drop(runtime);
        match made {
            Ok(method) => Ok(Forked {
                ids: children.iter().map(|c| c.id.clone()).collect(),
                method,
            }),
            Err(e) => {
                for child in &children {
                    self.lifecycle.discard(&child.id, child.uid_slot).await;
                }
                Err(e)
            }
        }
    }

    /// The children's records, committed as `creating` (so a crash from here on leaves nothing
    /// a restart would list), with their slots and secret bindings.
    async fn reserve_children(
        &self,
        parent: &Record,
        count: u32,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<Record>, EngineError> {
        let _guard = self.registry.adding().await;
        let (existing, used_slots) = self.registry.slots();
        let max = self.lifecycle.max_sandboxes();
        if existing + count as usize > max {
            return Err(EngineError::QuotaExceeded(format!(
                "the engine allows at most {max} sandboxes and {existing} exist, so {count} more do not fit; kill some or fork fewer"
            )));
        }
        let wanted: BTreeMap<String, String> = parent
            .secrets
            .iter()
            .map(|(env, b)| (env.clone(), b.secret.clone()))
            .collect();
        let now = ids::now_ms();
        // One claim and one commit for all of them: each would pay its own fsyncs otherwise.
        let slots = self.driver.claim_slots(used_slots, count as usize).await?;
        let release = |slots: &[u32]| {
            let slots = slots.to_vec();
            async move {
                for s in slots {
                    self.driver.release_slot(s).await;
                }
            }
        };
        let mut children = Vec::new();
        for &slot in &slots {
            let secrets = match self.secrets.bind_new(parent.tenant.as_deref(), &wanted) {
                Ok(s) => s,
                Err(e) => {
                    release(&slots).await;
                    return Err(e);
                }
            };
            children.push(Record {
                id: ids::sandbox_id(),
                name: None,
                status: Status::Creating,
                metadata: labels.clone(),
                uid_slot: slot,
                created_at: now,
                last_active_at: now,
                secrets,
                ..parent.clone()
            });
        }
        if let Err(e) = self.records.insert_all(&children).await {
            release(&slots).await;
            return Err(e);
        }
        for child in &children {
            // The parent's rules as stored: they are what its policy was made from.
            let net = self.networks.sandbox_net(child);
            self.registry.insert(
                child.id.clone(),
                Entry::new(child.clone(), Runtime::Stopped, false, net),
            );
        }
        Ok(children)
    }

    /// Copies the parent's files to every child (the parent frozen once, so all children start
    /// from the same moment), starts them side by side, and commits them as running.
    async fn make_children(
        &self,
        id: &str,
        parent: &Entry,
        runtime: Runtime,
        children: &[Record],
    ) -> Result<CloneMethod, EngineError> {
        let (driver, from) = (self.driver.clone(), Self::fs_of(parent, id));
        let targets: Vec<(String, u64)> = children
            .iter()
            .map(|c| (c.id.clone(), Self::disk_limit(c)))
            .collect();
        let method = self
            .frozen(id, runtime, driver.clone_many(from, targets))
            .await??;
        let started = futures::future::join_all(children.iter().map(|child| async move {
            let spec = self.lifecycle.start_spec(child)?;
            self.driver.start(&spec).await?;
            let entry = self.registry.entry_any(&child.id)?;
            self.networks.attach(&child.id, &entry).await?;
            Ok::<_, EngineError>(())
        }))
        .await;
        started.into_iter().collect::<Result<Vec<()>, _>>()?;
        let ids = children.iter().map(|c| c.id.clone()).collect();
        self.records.set_status_all(ids, Status::Running).await?;
        for child in children {
            self.registry.entry_any(&child.id)?.commit_running().await;
        }
        Ok(method)
    }

    pub(crate) async fn diff(
        &self,
        id: &str,
        tenant: Option<&str>,
        against: &str,
        under: &str,
        save_to: Option<String>,
    ) -> Result<Diffed, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let template = self.catalog.template(&lock(&entry.record).template)?;
        let (base, base_template) = if ids::is_snapshot_id(against) {
            let snap = self
                .snapshots_of(None)
                .await?
                .into_iter()
                .find(|s| s.id == against && s.ready);
            // Another tenant's snapshot answers exactly like one that does not exist.
            let owner = snap.and_then(|s| self.registry.entry(&s.sandbox_id, tenant).ok());
            let owner = owner.ok_or_else(|| {
                EngineError::NotFound(format!(
                    "snapshot {against} not found; sandbox_snapshot_list shows a sandbox's snapshots"
                ))
            })?;
            let owner_template = self.catalog.template(&lock(&owner.record).template)?;
            (
                FsRef {
                    name: against.to_string(),
                    slot: None,
                },
                owner_template,
            )
        } else if ids::is_sandbox_id(against) {
            let other = self.registry.entry(against, tenant)?;
            let other_template = self.catalog.template(&lock(&other.record).template)?;
            (Self::fs_of(&other, against), other_template)
        } else {
            return Err(EngineError::InvalidArgument(format!(
                "against must be a sandbox id (sbx_…) or a snapshot id (snap_…); got {against:?}"
            )));
        };
        let side = |layers: FsLayers| diff::Side {
            mounts: layers
                .mounts
                .into_iter()
                .map(|(target, upper, lowers)| diff::Mount {
                    target,
                    upper,
                    lowers,
                })
                .collect(),
            id_base: layers.id_base,
        };
        let a = side(
            self.driver
                .fs_layers(base, base_template.layout.clone())
                .await?,
        );
        let b = side(
            self.driver
                .fs_layers(Self::fs_of(&entry, id), template.layout.clone())
                .await?,
        );
        let under = under.to_string();
        let diff = blocking(move || diff::diff(&a, &b, &under, DIFF_MEMORY))
            .await?
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidInput => EngineError::InvalidArgument(e.to_string()),
                _ => EngineError::Conflict(format!("cannot compare the files: {e}")),
            })?;
        let saved_to = match save_to {
            Some(path) => Some(self.save_diff(id, tenant, &path, &diff).await?),
            None => None,
        };
        Ok(Diffed { diff, saved_to })
    }

    /// Writes the whole list of changes to `path` in the sandbox, one per line:
    /// `<A|D|M> <kind> <size> <path>[ (<what>)]`.
    async fn save_diff(
        &self,
        id: &str,
        tenant: Option<&str>,
        path: &str,
        diff: &Diff,
    ) -> Result<String, EngineError> {
        use base64::Engine as _;
        use std::fmt::Write as _;
        let mut text = String::new();
        for e in &diff.entries {
            let change = match e.change {
                diff::Change::Added => 'A',
                diff::Change::Removed => 'D',
                diff::Change::Modified => 'M',
            };
            let kind = serde_json::to_value(e.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let _ = write!(text, "{change} {kind} {} {}", e.size, e.path);
            if !e.what.is_empty() {
                let _ = write!(text, " ({})", e.what.join(","));
            }
            text.push('\n');
        }
        let listed = diff.added + diff.removed + diff.modified;
        if (diff.entries.len() as u64) < listed {
            let _ = writeln!(
                text,
                "… {} more changes not listed",
                listed - diff.entries.len() as u64
            );
        }
        let written = self
            .agent
            .call(
                id,
                tenant,
                WriteFile {
                    path: path.to_string(),
                    data_b64: base64::engine::general_purpose::STANDARD.encode(text),
                },
                Duration::from_secs(60),
            )
            .await?;
        Ok(written.path)
    }

    pub(crate) async fn merge(
        &self,
        source: &str,
        target: &str,
        tenant: Option<&str>,
        force: bool,
    ) -> Result<CloneMethod, EngineError> {
        if source == target {
            return Err(EngineError::InvalidArgument(
                "source_id and target_id are the same sandbox".into(),
            ));
        }
        let (src, dst) = (
            self.registry.entry(source, tenant)?,
            self.registry.entry(target, tenant)?,
        );
        let (src_record, dst_record) = (src.record(), dst.record());
        if src_record.template != dst_record.template {
            return Err(EngineError::Conflict(format!(
                "{source} runs template {} and {target} template {}: only sandboxes of one template can be merged",
                src_record.template, dst_record.template
            )));
        }
        if !force && !self.related(&src_record, &dst_record) {
            return Err(EngineError::Conflict(format!(
                "{source} and {target} are unrelated (neither was forked from the other or from a common parent); pass force: true to replace {target}'s files anyway"
            )));
        }
        {
            // Locked in id order: a merge the other way round cannot deadlock with this one.
            let (first, second) = if source < target {
                (&src, &dst)
            } else {
                (&dst, &src)
            };
            let mut a = first.lifecycle.lock().await;
            let mut b = second.lifecycle.lock().await;
            let (src_rt, dst_rt) = if source < target {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            if *src_rt == Runtime::Killed || *dst_rt == Runtime::Killed {
                return Err(EngineError::NotFound(
                    "one of the sandboxes was killed meanwhile".into(),
                ));
            }
            self.lifecycle.stop_for_files(target, &dst, dst_rt).await?;
            let (driver, tid, from) = (
                self.driver.clone(),
                target.to_string(),
                Self::fs_of(&src, source),
            );
            let limit = Self::disk_limit(&dst_record);
            let method = self
                .frozen(source, *src_rt, driver.replace_fs(&tid, from, limit))
                .await??;
            drop((a, b));
            self.lifecycle.kill(source, tenant).await?;
            self.lifecycle.ensure_running(target, &dst).await?;
            Ok(method)
        }
    }

    /// Whether two sandboxes share an ancestor through `forked_from` (or one is the other's).
    fn related(&self, a: &Record, b: &Record) -> bool {
        let family = |r: &Record| -> BTreeSet<String> {
            let mut seen = BTreeSet::from([r.id.clone()]);
            let mut next = r.metadata.get(FORKED_FROM).cloned();
            while let Some(id) = next.take() {
                if !seen.insert(id.clone()) {
                    break;
                }
                next = self
                    .registry
                    .entry_any(&id)
                    .ok()
                    .and_then(|e| lock(&e.record).metadata.get(FORKED_FROM).cloned());
            }
            seen
        };
        !family(a).is_disjoint(&family(b))
    }

    /// After a restart: snapshots whose files were being made or deleted, or whose sandbox is
    /// gone, are deleted.
    pub(crate) async fn recover(&self) -> Result<(), EngineError> {
        let live: BTreeSet<String> = self
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
