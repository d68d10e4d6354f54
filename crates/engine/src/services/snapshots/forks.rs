//! Forks (children that start from one moment of their parent's files) and merges (one
//! sandbox's files replacing another's).

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use sandbox_mcp_model::driver::{CloneKind, CloneMethod, DriverError, LiveReport};
use sandbox_mcp_model::ids;
use sandbox_mcp_sys::lock;

use super::{FORKED_FROM, Forked, MAX_FORKS, MAX_LABELS, Restart, Snapshots};
use crate::error::EngineError;
use crate::services::registry::{Entry, Runtime};
use crate::state::{Record, Status};
use sandbox_mcp_model::record::Mounted;

impl Snapshots {
    /// Forks one of `tenant`'s sandboxes `count` times, to its end
    /// ([`super::lifecycle::Lifecycle::to_the_end`]).
    pub async fn fork(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
        count: u32,
        metadata: BTreeMap<String, String>,
        memory: Option<bool>,
        copy_volumes: bool,
    ) -> Result<Forked, EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        self.making
            .lifecycle
            .to_the_end(async move {
                this.fork_now(
                    &id,
                    tenant.as_deref(),
                    count,
                    metadata,
                    memory,
                    copy_volumes,
                )
                .await
            })
            .await
    }

    async fn fork_now(
        &self,
        id: &str,
        tenant: Option<&str>,
        count: u32,
        metadata: BTreeMap<String, String>,
        memory: Option<bool>,
        copy_volumes: bool,
    ) -> Result<Forked, EngineError> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(EngineError::InvalidArgument(format!(
                "count must be 1 to {MAX_FORKS}; got {count}"
            )));
        }
        let live = &self.driver.capabilities().live_state;
        if memory == Some(true) && !live.available {
            return Err(EngineError::from(DriverError::Unsupported(format!(
                "a fork cannot carry processes here: {}; fork with memory=false to copy files only",
                live.detail
            ))));
        }
        let memory = memory.unwrap_or(live.available);
        let parent = self.making.registry.entry(id, tenant)?;
        let mut runtime = parent.lifecycle.lock().await;
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
        // Each child's mounts: the parent's, or (`copy`) its own copy of each named volume.
        let child_ids: Vec<String> = (0..count).map(|_| ids::sandbox_id()).collect();
        let mut mounts = Vec::new();
        for child in &child_ids {
            let own = if copy_volumes {
                let suffix = &child[child.len() - 8..];
                let made = self
                    .making
                    .volumes
                    .copies(record.tenant.as_deref(), &record.volumes, suffix)
                    .await;
                match made {
                    Ok(own) => own,
                    Err(e) => {
                        self.discard_copies(&record, &mounts).await;
                        return Err(e);
                    }
                }
            } else {
                record.volumes.clone()
            };
            mounts.push(own);
        }
        let children = match self
            .reserve_children(&record, child_ids, mounts.clone(), labels)
            .await
        {
            Ok(children) => children,
            Err(e) => {
                self.discard_copies(&record, &mounts).await;
                return Err(e);
            }
        };
        let made = self
            .make_children(id, &parent, &mut runtime, &children, memory)
            .await;
        drop(runtime);
        match made {
            Ok((method, memory)) => Ok(Forked {
                ids: children.iter().map(|c| c.id.clone()).collect(),
                method,
                memory,
            }),
            Err(e) => {
                for child in &children {
                    self.making
                        .lifecycle
                        .discard(&child.id, child.uid_slot)
                        .await;
                }
                self.discard_copies(&record, &mounts).await;
                Err(e)
            }
        }
    }

    /// Deletes the volumes copied for children that were not made (none unless the parent's
    /// were copied: the children's mounts are then not the parent's).
    async fn discard_copies(&self, parent: &Record, mounts: &[Vec<Mounted>]) {
        for own in mounts.iter().filter(|m| **m != parent.volumes) {
            self.making
                .volumes
                .discard(parent.tenant.as_deref(), own)
                .await;
        }
    }

    /// The children's records, committed as `creating` (so a crash from here on leaves nothing
    /// a restart would list), with their slots and secret bindings.
    async fn reserve_children(
        &self,
        parent: &Record,
        child_ids: Vec<String>,
        mounts: Vec<Vec<Mounted>>,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<Record>, EngineError> {
        let count = child_ids.len() as u32;
        let _guard = self.making.registry.adding().await;
        let (existing, used_slots) = self.making.registry.slots();
        let max = self.making.lifecycle.max_sandboxes();
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
        for ((&slot, id), volumes) in slots.iter().zip(child_ids).zip(mounts) {
            let secrets = match self
                .making
                .secrets
                .bind_new(parent.tenant.as_deref(), &wanted)
            {
                Ok(s) => s,
                Err(e) => {
                    release(&slots).await;
                    // The parent's own bindings, bound again: one that no longer binds (its
                    // secret deleted since) is the parent's state, not the request's fault.
                    return Err(match e {
                        EngineError::InvalidArgument(m) => EngineError::Conflict(format!(
                            "sandbox {} has a secret bound that its children cannot get: {m}; detach it (sandbox_detach_secret) or create the secret again, then fork",
                            parent.id
                        )),
                        e => e,
                    });
                }
            };
            children.push(Record {
                id,
                name: None,
                status: Status::Creating,
                metadata: labels.clone(),
                uid_slot: slot,
                created_at: now,
                last_active_at: now,
                secrets,
                volumes,
                ..parent.clone()
            });
        }
        if let Err(e) = self.making.records.insert_all(&children).await {
            release(&slots).await;
            return Err(e);
        }
        for child in &children {
            // The parent's rules as stored: they are what its policy was made from.
            let net = self.making.networks.sandbox_net(child);
            self.making.registry.insert(
                child.id.clone(),
                Entry::new(child.clone(), Runtime::Stopped, false, net),
            );
        }
        Ok(children)
    }

    /// Gives every child the parent's files (stacked on a layer they share where the parent
    /// loses nothing by it, else copied with the parent frozen once, so all children start from
    /// the same moment), starts them side by side, and commits them as running. With `memory`,
    /// the parent's process trees are dumped first (each left stopped, so files and memory are
    /// one moment's) and restored into every child once it runs.
    async fn make_children(
        &self,
        id: &str,
        parent: &Arc<Entry>,
        runtime: &mut Runtime,
        children: &[Record],
        memory: bool,
    ) -> Result<(CloneMethod, Option<LiveReport>), EngineError> {
        let checkpoint = format!("fork-{}", ids::sandbox_id());
        let to = children
            .iter()
            .map(|c| {
                let limit_bytes = Self::disk_limit(c);
                (c.id.clone(), CloneKind::Sandbox { limit_bytes })
            })
            .collect();
        let keep = memory.then_some(checkpoint.as_str());
        let (method, mut report) = match self
            .stacked(id, parent, runtime, to, (keep, Restart::Now))
            .await?
        {
            // The processes, if any ran, were kept as `checkpoint` on the way.
            Some(stacked) => (stacked.method, memory.then_some(stacked.carried)),
            None => {
                self.copy_to_children(id, parent, *runtime, children, memory, &checkpoint)
                    .await?
            }
        };
        let started = futures::future::join_all(children.iter().map(|child| async move {
            let spec = self.making.lifecycle.start_spec(child)?;
            self.driver.start(&spec).await?;
            let entry = self.making.registry.entry_any(&child.id)?;
            self.making.networks.attach(&child.id, &entry).await?;
            Ok::<_, EngineError>(())
        }))
        .await;
        if let Err(e) = started.into_iter().collect::<Result<Vec<()>, _>>() {
            self.driver.drop_checkpoint(&checkpoint).await;
            return Err(e);
        }
        if let Some(report) = report.as_mut().filter(|r| !r.carried.is_empty()) {
            self.carry_into(children, &checkpoint, report).await;
        }
        self.driver.drop_checkpoint(&checkpoint).await;
        let ids = children.iter().map(|c| c.id.clone()).collect();
        self.making
            .records
            .set_status_all(ids, Status::Running)
            .await?;
        for child in children {
            self.making
                .registry
                .entry_any(&child.id)?
                .commit_running()
                .await;
        }
        Ok((method, report))
    }

    /// The copy path of [`Self::make_children`]: the parent's files cloned into each child,
    /// frozen meanwhile, its processes dumped first as `checkpoint` with `memory`.
    async fn copy_to_children(
        &self,
        id: &str,
        parent: &Entry,
        runtime: Runtime,
        children: &[Record],
        memory: bool,
        checkpoint: &str,
    ) -> Result<(CloneMethod, Option<LiveReport>), EngineError> {
        let (driver, from) = (self.driver.clone(), Self::fs_of(parent, id));
        let targets: Vec<(String, u64)> = children
            .iter()
            .map(|c| (c.id.clone(), Self::disk_limit(c)))
            .collect();
        let live = if memory {
            Some(self.checkpoint_for(id, runtime, checkpoint).await)
        } else {
            None
        };
        let copied = self
            .frozen(
                id,
                live.as_ref().map_or(runtime, |l| l.runtime),
                driver.clone_many(from, targets),
            )
            .await;
        let mut report = None;
        if let Some(l) = live {
            self.after_checkpoint(id, &l).await?;
            // A fork goes on without the processes it could not dump: the result says why.
            report = Some(l.report.unwrap_or_else(|e| LiveReport {
                carried: Vec::new(),
                skipped: vec![format!("every process ({e})")],
            }));
        }
        match copied.and_then(|c| c.map_err(EngineError::from)) {
            Ok(method) => Ok((method, report)),
            Err(e) => {
                self.driver.drop_checkpoint(checkpoint).await;
                Err(e)
            }
        }
    }

    /// Restores the checkpoint into each child in turn; a tree that fails in a child moves from
    /// `carried` to `skipped`, saying where and why.
    async fn carry_into(&self, children: &[Record], checkpoint: &str, report: &mut LiveReport) {
        for child in children {
            let got = self.driver.restore_checkpoint(&child.id, checkpoint).await;
            let failed: Vec<String> = match got {
                Ok(r) => r.skipped,
                Err(e) => vec![format!("every process ({e})")],
            };
            for f in failed {
                report.skipped.push(format!("in {}: {f}", child.id));
            }
        }
        // Each skipped entry reads `in CHILD: WHAT (why)`; `job job_1` is not `job job_10`.
        let failed_in_some: Vec<String> = report
            .carried
            .iter()
            .filter(|what| {
                let named = format!(": {what} (");
                report.skipped.iter().any(|s| s.contains(&named))
            })
            .cloned()
            .collect();
        report.carried.retain(|w| !failed_in_some.contains(w));
    }

    /// To its end ([`super::lifecycle::Lifecycle::to_the_end`]).
    pub async fn merge(
        self: &Arc<Self>,
        source: &str,
        target: &str,
        tenant: Option<&str>,
        force: bool,
    ) -> Result<CloneMethod, EngineError> {
        let this = self.clone();
        let (source, target) = (source.to_string(), target.to_string());
        let tenant = tenant.map(str::to_string);
        self.making
            .lifecycle
            .to_the_end(async move {
                this.merge_now(&source, &target, tenant.as_deref(), force)
                    .await
            })
            .await
    }

    async fn merge_now(
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
            self.making.registry.entry(source, tenant)?,
            self.making.registry.entry(target, tenant)?,
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
            self.making
                .lifecycle
                .stop_for_files(target, &dst, dst_rt)
                .await?;
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
            self.making.lifecycle.kill(source, tenant).await?;
            self.making.lifecycle.ensure_running(target, &dst).await?;
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
                    .making
                    .registry
                    .entry_any(&id)
                    .ok()
                    .and_then(|e| lock(&e.record).metadata.get(FORKED_FROM).cloned());
            }
            seen
        };
        !family(a).is_disjoint(&family(b))
    }
}
