//! Sandbox lifecycles: create (from a template, as a caller, a pool or a build asks), find,
//! update, pause, resume, kill; quotas; recovery after a restart; shutdown.
//!
//! Invariants:
//! - A sandbox's record is committed `creating` before it is built and `running` once it is;
//!   `killing` before it is torn down, and deleted after.
//! - Lifecycle transitions of one sandbox are serialized by its `lifecycle` lock.
//! - The in-memory runtime state can always be rebuilt from the database and the driver.

mod create;
mod hibernate;
mod settings;
mod timeouts;

pub(crate) use create::record_of;
pub(crate) use hibernate::checkpoint_of;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sandbox_mcp_model::driver::{Liveness, StartSpec};
use sandbox_mcp_network::log as netlog;
use sandbox_mcp_sys::lock;
use tokio_util::task::TaskTracker;

use super::catalog::Catalog;
use super::networks::{Networks, bindings};
use super::registry::{Entry, Registry, Runtime};
use super::secrets::Secrets;
use super::{Metrics, NetworkLogPage, SandboxView};
use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;
use crate::records::Records;
use crate::state::{Record, Status};

/// How long a shutdown waits for transitions under way: longer than a launch may take.
const TRANSITIONS_FINISH: std::time::Duration = std::time::Duration::from_secs(40);

pub struct Lifecycle {
    max_sandboxes: usize,
    driver: DriverHandle,
    records: Arc<Records>,
    registry: Arc<Registry>,
    networks: Arc<Networks>,
    catalog: Arc<Catalog>,
    secrets: Arc<Secrets>,
    /// Transitions under way, each a task of its own: see [`Self::to_the_end`].
    transitions: TaskTracker,
}

impl Lifecycle {
    pub(crate) fn new(
        max_sandboxes: usize,
        driver: DriverHandle,
        records: Arc<Records>,
        registry: Arc<Registry>,
        networks: Arc<Networks>,
        catalog: Arc<Catalog>,
        secrets: Arc<Secrets>,
    ) -> Self {
        Self {
            max_sandboxes,
            driver,
            records,
            registry,
            networks,
            catalog,
            secrets,
            transitions: TaskTracker::new(),
        }
    }

    /// Most sandboxes the engine keeps at once.
    pub(crate) fn max_sandboxes(&self) -> usize {
        self.max_sandboxes
    }

    /// After a restart: finish interrupted creates and kills; every other sandbox comes back
    /// paused — frozen with its processes if they survived, stopped (files kept) if not.
    pub(crate) async fn recover(&self) -> Result<(), EngineError> {
        // Slots still in use: those of sandboxes that stay, and of any whose cleanup failed (its
        // files or processes may still hold the ids, so the range must not be handed out again).
        let mut held = Vec::new();
        for record in self.records.all().await? {
            let id = record.id.clone();
            match record.status {
                Status::Creating | Status::Killing => {
                    let cleaned = match self.destroy_with_snapshots(&id).await {
                        Err(e) => {
                            tracing::warn!(sandbox = %id, "cleanup after restart failed: {e}");
                            false
                        }
                        Ok(()) => {
                            let _ = self.records.delete(&id).await;
                            true
                        }
                    };
                    if !cleaned {
                        held.push(record.uid_slot);
                    }
                }
                Status::Running | Status::Paused => {
                    let liveness = self.driver.liveness(&id).await;
                    if matches!(liveness, Liveness::Running | Liveness::Frozen) {
                        // A fork or memory snapshot cut short by a crash leaves the processes it
                        // was dumping stopped: they go on (once thawed, if frozen).
                        self.driver.continue_processes(&id).await;
                        // Its processes live: a hibernation checkpoint left (a crash between
                        // the dump and the stop, or after a wake's restore) is stale, and must
                        // never be restored beside them.
                        self.driver.drop_checkpoint(&checkpoint_of(&id)).await;
                    }
                    let runtime = match liveness {
                        Liveness::Gone => {
                            // Killed by another replica, or deleted behind the engine's back.
                            self.records.delete(&id).await?;
                            continue;
                        }
                        Liveness::Frozen => Runtime::Frozen,
                        Liveness::Stopped => Runtime::Stopped,
                        Liveness::Running => match self.driver.freeze(&id).await {
                            Ok(()) => Runtime::Frozen,
                            Err(_) => Runtime::Running,
                        },
                    };
                    let status = if runtime == Runtime::Running {
                        Status::Running
                    } else {
                        Status::Paused
                    };
                    self.records.set_status(&id, status).await?;
                    let mut record = record;
                    record.status = status;
                    let net = self.networks.sandbox_net(&record);
                    let entry = Entry::new(record, runtime, true, net);
                    if runtime != Runtime::Stopped {
                        // The agent survived the engine: serve its network again.
                        self.networks.reattach(&id, &entry).await;
                    }
                    self.registry.insert(id, entry);
                }
            }
        }
        // The registry of uid ranges must agree: slots of sandboxes cleaned up above (or lost
        // with a crash) are released, and those still held stay claimed.
        held.extend(self.registry.slots().1);
        self.driver.reconcile_slots(held).await;
        if self.records.local_only() {
            // Logs of sandboxes that went while no engine ran (or in a crash mid-kill) go too.
            let live = self.registry.entries().into_iter().map(|(id, _)| id);
            self.networks.retain_logs(live.collect());
        }
        Ok(())
    }

    /// What the driver needs to start the sandbox of `record`.
    pub(crate) fn start_spec(&self, record: &Record) -> Result<StartSpec, EngineError> {
        let template = self.catalog.template(&record.template)?;
        Ok(StartSpec {
            id: record.id.clone(),
            uid_slot: record.uid_slot,
            shape: record.shape,
            template: super::volumes::layout_of(&template.layout, record),
            volumes: super::volumes::binds_of(record),
            // The agent's own environment: what REPL interpreters start with, too: the
            // template's (an image's `Env`), the egress CA's, the sandbox's own.
            // Bound secrets' stand-ins are not here: each command gets them when it starts
            // (`Call::add_env`), so a detach applies to the next command.
            env: template
                .file
                .env
                .iter()
                .cloned()
                .chain(sandbox_mcp_network::intercept::trust_env())
                .chain(record.env.iter().cloned())
                .collect(),
            workdir: template.file.workdir.clone(),
            user: template.file.user,
            record: record.clone(),
            same_boot: false,
        })
    }

    /// [`Registry::list`] after taking in what other replicas changed (drivers that share
    /// records).
    pub async fn list_current(
        &self,
        status: Option<Status>,
        metadata: &[(String, String)],
        tenant: Option<&str>,
    ) -> Result<Vec<Record>, EngineError> {
        self.registry.sync_shared().await?;
        Ok(self.registry.list(status, metadata, tenant))
    }

    pub async fn get(
        &self,
        id: &str,
        tenant: Option<&str>,
        with_usage: bool,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        let usage = if with_usage {
            // A description shows three figures of its use and a recent measurement of its
            // files (see `crate::disk_meter`); `metrics` reads everything as of now.
            Some(
                self.driver
                    .usage_and_disk(id, true, false, entry.quiet_since())
                    .await,
            )
        } else {
            None
        };
        Ok(SandboxView {
            usage,
            ..self.registry.view(&entry)
        })
    }

    /// A page of the sandbox's network log (readable whatever the sandbox's state).
    pub async fn network_log(
        &self,
        id: &str,
        tenant: Option<&str>,
        query: netlog::Query,
    ) -> Result<NetworkLogPage, EngineError> {
        self.registry.lookup(id, tenant).await?;
        self.networks.log_page(id, query).await
    }

    pub async fn metrics(&self, id: &str, tenant: Option<&str>) -> Result<Metrics, EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        let (usage, disk_bytes) = self.driver.usage_and_disk(id, false, true, None).await;
        let record = entry.record();
        let capabilities = self.driver.capabilities();
        Ok(Metrics {
            status: record.status,
            usage,
            disk_bytes,
            disk_limit_bytes: record.shape.disk_mb * 1024 * 1024,
            limits_enforced: capabilities.limits_enforced,
            disk_limit_enforced: capabilities.disk_limits_enforced,
        })
    }

    pub(crate) async fn set_status(&self, id: &str, status: Status) -> Result<(), EngineError> {
        self.records.set_status(id, status).await
    }

    pub async fn pause(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<SandboxView, EngineError> {
        self.set_paused(id, tenant, true).await
    }

    pub async fn resume(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<SandboxView, EngineError> {
        self.set_paused(id, tenant, false).await
    }

    /// Pauses (freezes) or resumes (thaws, or restarts if stopped) one of `tenant`'s sandboxes,
    /// to its end.
    async fn set_paused(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
        paused: bool,
    ) -> Result<SandboxView, EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        self.to_the_end(async move { this.set_paused_now(&id, tenant.as_deref(), paused).await })
            .await
    }

    async fn set_paused_now(
        &self,
        id: &str,
        tenant: Option<&str>,
        paused: bool,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        if paused {
            self.pause_entry(id, &entry).await?;
        } else {
            self.ensure_running(id, &entry).await?;
        }
        Ok(self.registry.view(&entry))
    }

    pub(crate) async fn pause_entry(
        &self,
        id: &str,
        entry: &Arc<Entry>,
    ) -> Result<(), EngineError> {
        let mut rt = entry.lifecycle.lock().await;
        match *rt {
            Runtime::Running => {
                self.driver.freeze(id).await?;
                self.set_status(id, Status::Paused).await?;
                *rt = Runtime::Frozen;
                entry.set_visible(Runtime::Frozen);
                self.flush_active(id, entry).await;
                Ok(())
            }
            Runtime::Frozen | Runtime::Stopped => Ok(()),
            Runtime::Killed => Err(EngineError::sandbox_not_found(id)),
        }
    }

    /// Thaws a frozen sandbox or restarts a stopped one.
    pub(crate) async fn ensure_running(
        &self,
        id: &str,
        entry: &Arc<Entry>,
    ) -> Result<(), EngineError> {
        let mut rt = entry.lifecycle.lock().await;
        match *rt {
            Runtime::Running => return Ok(()),
            Runtime::Killed => return Err(EngineError::sandbox_not_found(id)),
            Runtime::Frozen => {
                self.driver.thaw(id).await?;
            }
            Runtime::Stopped if !self.driver.capabilities().restarts_stopped => {
                // Its pod is gone (a wedged agent's is deleted): nothing to restart.
                drop(rt);
                let why = format!(
                    "sandbox {id} is gone: its agent stopped answering, so its pod was deleted; create a new sandbox"
                );
                self.registry.forget(id, Some(why.clone())).await;
                return Err(EngineError::Gone(why));
            }
            Runtime::Stopped => return self.restart_stopped(id, entry, &mut rt).await,
        }
        self.set_status(id, Status::Running).await?;
        *rt = Runtime::Running;
        entry.set_visible(Runtime::Running);
        Ok(())
    }

    /// Starts a stopped sandbox's agent again. The caller holds the sandbox's `lifecycle`
    /// lock: `runtime` is what it guards.
    pub(crate) async fn restart_stopped(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        runtime: &mut Runtime,
    ) -> Result<(), EngineError> {
        let mut spec = self.start_spec(&lock(&entry.record))?;
        // Hibernated processes come back into the boot they left (`wake`, below).
        spec.same_boot = self.driver.has_checkpoint(&checkpoint_of(id)).await;
        self.driver.start(&spec).await?;
        // A new agent has a new network namespace.
        self.networks.reattach(id, entry).await;
        self.wake(id).await;
        self.set_status(id, Status::Running).await?;
        *runtime = Runtime::Running;
        entry.set_visible(Runtime::Running);
        Ok(())
    }

    /// [`Self::restart_stopped`] in a task of its own, holding the sandbox's lifecycle lock
    /// (`runtime`) from the caller on, so no other transition or call sees it stopped between:
    /// for a call that returns once what it made is kept, without waiting for the sandbox's
    /// processes to come back. It is listed as running meanwhile: any call on it finds it so. A
    /// failed start is logged and leaves it stopped and listed paused (its processes, if any, in
    /// its hibernation checkpoint), as a crash would: its next call starts it.
    pub(crate) fn restart_soon(
        self: &Arc<Self>,
        id: &str,
        entry: &Arc<Entry>,
        mut runtime: tokio::sync::OwnedMutexGuard<Runtime>,
    ) {
        if *runtime != Runtime::Stopped {
            return;
        }
        // Listed as what every call finds: running (a call waits on the lock meanwhile).
        entry.set_visible(Runtime::Running);
        let (this, id, entry) = (self.clone(), id.to_string(), entry.clone());
        self.transitions.spawn(async move {
            if let Err(e) = this.restart_stopped(&id, &entry, &mut runtime).await {
                entry.set_visible(*runtime);
                tracing::warn!(sandbox = %id, "not started again yet: {e}; its next call starts it");
            }
        });
    }

    /// Stops a running sandbox's processes and marks it so the next call restarts it.
    pub(crate) async fn stop_agent(&self, id: &str, entry: &Arc<Entry>) {
        let mut rt = entry.lifecycle.lock().await;
        if *rt == Runtime::Running {
            let _ = self.driver.stop(id).await;
            *rt = Runtime::Stopped;
            entry.set_visible(Runtime::Stopped);
            let _ = self.set_status(id, Status::Paused).await;
        }
    }

    /// Stops a sandbox's processes for good (its files are about to change under them); the
    /// next call starts a fresh agent. Returns how many processes there were. The caller holds
    /// the sandbox's `lifecycle` lock: `runtime` is what it guards.
    pub(crate) async fn stop_for_files(
        &self,
        id: &str,
        entry: &Entry,
        runtime: &mut Runtime,
    ) -> Result<u64, EngineError> {
        entry.interruptions.fetch_add(1, Ordering::AcqRel);
        let stopped = self.driver.processes(id).await;
        self.driver.stop(id).await?;
        // A paused sandbox's cgroup stays frozen after its processes die: the next agent must
        // not start frozen.
        self.driver.thaw(id).await?;
        *runtime = Runtime::Stopped;
        entry.set_visible(Runtime::Stopped);
        self.set_status(id, Status::Paused).await?;
        Ok(stopped)
    }

    /// Destroys a sandbox's processes and files, and its snapshots' files (their rows go with
    /// its record).
    pub(crate) async fn destroy_with_snapshots(&self, id: &str) -> Result<(), EngineError> {
        self.driver.destroy(id).await?;
        self.driver
            .drop_checkpoint(&hibernate::checkpoint_of(id))
            .await;
        for snap in self.records.snapshots(Some(id)).await? {
            self.driver.remove_fs(&snap.id).await?;
            self.driver
                .drop_checkpoint(&crate::services::snapshots::memory_of(&snap.id))
                .await;
        }
        Ok(())
    }

    /// Takes back a sandbox that was never acknowledged: its processes, files, record and slot
    /// (the slot only once the rest is gone, so its ids are never reused too soon).
    pub(crate) async fn discard(&self, id: &str, slot: u32) {
        if let Some(entry) = self.registry.remove(id) {
            entry.net.close();
        }
        if self.driver.destroy(id).await.is_ok() && self.records.delete(id).await.is_ok() {
            self.driver.release_slot(slot).await;
        }
    }

    /// Kills one of `tenant`'s sandboxes, to its end ([`Self::to_the_end`]).
    pub async fn kill(self: &Arc<Self>, id: &str, tenant: Option<&str>) -> Result<(), EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        self.to_the_end(async move { this.kill_now(&id, tenant.as_deref()).await })
            .await
    }

    pub(crate) async fn kill_now(&self, id: &str, tenant: Option<&str>) -> Result<(), EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        let mut rt = entry.lifecycle.lock().await;
        if *rt == Runtime::Killed {
            return Err(EngineError::sandbox_not_found(id));
        }
        self.set_status(id, Status::Killing).await?;
        entry.killing.store(true, Ordering::Release);
        entry.interruptions.fetch_add(1, Ordering::AcqRel);
        let slot = lock(&entry.record).uid_slot;
        self.destroy_with_snapshots(id).await.map_err(|e| match e {
            EngineError::Host(e) => EngineError::KillIncomplete(e),
            e => e,
        })?;
        self.records.delete(id).await?;
        self.driver.release_slot(slot).await;
        *rt = Runtime::Killed;
        entry.ready.store(false, Ordering::Release);
        entry.net.close();
        self.networks.forget(id);
        self.registry.remove(id);
        // What the engine held for the sandbox (relay buffers, decrypted connections) goes back
        // to the kernel, not only to the allocator. Its connections end as the network closes.
        tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let _ = blocking(sandbox_mcp_sys::budget::give_back).await;
        });
        Ok(())
    }

    /// Writes the sandbox's last activity down, if it changed since last time.
    pub(crate) async fn flush_active(&self, id: &str, entry: &Arc<Entry>) {
        if entry.active_dirty.swap(false, Ordering::Relaxed) {
            let at = entry.last_active.load(Ordering::Relaxed);
            let _ = self.records.set_last_active(id, at).await;
        }
    }

    /// Clean shutdown: running sandboxes are frozen (their processes and memory are kept, no CPU
    /// is used) and marked paused; the next engine resumes them on first use.
    pub(crate) async fn shutdown(&self) {
        // Transitions under way finish first (each is bounded), so that every sandbox below is
        // made or not, killed or not: nothing is paused, or left, halfway.
        self.transitions.close();
        if tokio::time::timeout(TRANSITIONS_FINISH, self.transitions.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "{} lifecycle transition(s) still under way at shutdown; the next start finishes or undoes them",
                self.transitions.len()
            );
        }
        for (id, entry) in self.registry.entries() {
            // The engine's builds would be killed at the next start anyway: killed now, they
            // leave no frozen processes behind meanwhile. Pooled sandboxes are paused like the
            // rest (a pod runs on): the next start hands them out again (`Pools::restart_internal`).
            if entry.internal() && entry.tenant().as_deref() != Some(super::pool::POOL_TENANT) {
                if let Err(e) = self.kill_now(&id, entry.tenant().as_deref()).await {
                    tracing::debug!(sandbox = %id, "not killed at shutdown: {e}");
                }
                continue;
            }
            if entry.ready.load(Ordering::Acquire)
                && let Err(e) = self.pause_entry(&id, &entry).await
            {
                tracing::debug!(sandbox = %id, "not paused at shutdown: {e}");
            }
            self.flush_active(&id, &entry).await;
            // Its relay and preview connections end with this engine; the next one serves them.
            entry.net.close();
        }
        self.driver.close().await;
    }

    /// Gives a sandbox new network rules' policy and its record's secret bindings (a pooled
    /// sandbox handed out to a request).
    pub(crate) fn rebind(
        &self,
        entry: &Entry,
        record: Record,
        policy: sandbox_mcp_network::policy::Policy,
    ) {
        entry.net.set_policy(policy);
        entry.net.set_bindings(bindings(&record));
        *lock(&entry.record) = record;
    }
}
