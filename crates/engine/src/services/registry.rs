//! The registry: the sandboxes this engine knows, each an [`Entry`] (its record, what its
//! processes are doing, its network), found by id and tenant. On a driver whose engine replicas
//! share records, a sandbox another replica made is adopted on first sight, and one that went
//! where the driver keeps it is forgotten, with why, for later calls on it.
//!
//! Invariants:
//! - A sandbox is visible (lookups, listings) only once its record is committed as `running`.
//! - Another tenant's sandbox answers exactly like one that does not exist.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sandbox_mcp_model::driver::Shared;
use sandbox_mcp_model::ids;
use sandbox_mcp_network::SandboxNet;
use sandbox_mcp_sys::lock;

use super::SandboxView;
use super::networks::Networks;
use super::pool;
use super::previews::Live;
use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::records::Records;
use crate::state::{Record, Status};

/// Most forgotten sandboxes whose reason is kept.
const GONE_KEPT: usize = 512;

/// What the processes of a sandbox are doing, as far as the engine knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runtime {
    Running,
    Frozen,
    Stopped,
    Killed,
}

/// One sandbox as the engine holds it.
pub(crate) struct Entry {
    pub(crate) record: Mutex<Record>,
    /// Lifecycle transitions of the sandbox are serialized by this lock; contents operations
    /// (exec, files) run concurrently, outside it. Shared, so a transition can hand it to a task
    /// that finishes after the call ([`super::lifecycle::Lifecycle::restart_soon`]).
    pub(crate) lifecycle: Arc<tokio::sync::Mutex<Runtime>>,
    /// Mirror of `lifecycle` readable without awaiting (for listings).
    pub(crate) visible_status: Mutex<Status>,
    pub(crate) ready: AtomicBool,
    pub(crate) last_active: AtomicI64,
    pub(crate) active_dirty: AtomicBool,
    pub(crate) inflight: AtomicUsize,
    /// The sandbox's network: policy, resolved names, open connections.
    pub(crate) net: Arc<SandboxNet>,
    /// Its ports served as preview URLs, by port.
    pub(crate) previews: Mutex<BTreeMap<u16, Live>>,
    /// Times the engine stopped the sandbox's processes on purpose (a restore, a merge, a kill):
    /// a call whose agent hangs up across one was interrupted, not crashed.
    pub(crate) interruptions: AtomicU64,
    /// Set when a kill begins.
    pub(crate) killing: AtomicBool,
    /// `last_active` when the idle policy last failed to hibernate the sandbox (something in it
    /// cannot be written down): it is not dumped again for nothing until it is used again.
    pub(crate) hibernate_refused: AtomicI64,
    /// When (ms) its agent, asked while no call of the engine was under way, said it had no
    /// jobs (`i64::MIN`: never): see [`super::agent::AgentClient::described_jobs`].
    pub(crate) no_jobs_at: AtomicI64,
}

impl Entry {
    pub(crate) fn new(
        record: Record,
        runtime: Runtime,
        ready: bool,
        net: Arc<SandboxNet>,
    ) -> Arc<Self> {
        let last = record.last_active_at;
        let status = if runtime == Runtime::Running {
            Status::Running
        } else {
            Status::Paused
        };
        Arc::new(Self {
            record: Mutex::new(record),
            lifecycle: Arc::new(tokio::sync::Mutex::new(runtime)),
            visible_status: Mutex::new(status),
            ready: AtomicBool::new(ready),
            last_active: AtomicI64::new(last),
            active_dirty: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            net,
            previews: Mutex::new(BTreeMap::new()),
            interruptions: AtomicU64::new(0),
            killing: AtomicBool::new(false),
            hibernate_refused: AtomicI64::new(i64::MIN),
            no_jobs_at: AtomicI64::new(i64::MIN),
        })
    }

    /// When a call of the engine last started or ended in the sandbox (ms), or `None` while one
    /// is under way. Caches of what only such a call can change (a description's walk of the
    /// files, its agent's "no jobs") stand while this is older than they are.
    pub(crate) fn quiet_since(&self) -> Option<i64> {
        (self.inflight.load(Ordering::Acquire) == 0)
            .then(|| self.last_active.load(Ordering::Acquire))
    }

    /// The record as callers see it: with its latest activity and visible status.
    pub(crate) fn record(&self) -> Record {
        let mut r = lock(&self.record).clone();
        r.last_active_at = self.last_active.load(Ordering::Relaxed);
        r.status = *lock(&self.visible_status);
        r
    }

    pub(crate) fn set_visible(&self, runtime: Runtime) {
        *lock(&self.visible_status) = if runtime == Runtime::Running {
            Status::Running
        } else {
            Status::Paused
        };
    }

    /// Marks the sandbox running and visible: its record is committed as `running`.
    pub(crate) async fn commit_running(&self) {
        *self.lifecycle.lock().await = Runtime::Running;
        self.set_visible(Runtime::Running);
        lock(&self.record).status = Status::Running;
        self.ready.store(true, Ordering::Release);
    }

    pub(crate) fn tenant(&self) -> Option<String> {
        lock(&self.record).tenant.clone()
    }

    /// Whether the sandbox is one of the engine's own (a pooled one, a build's).
    pub(crate) fn internal(&self) -> bool {
        lock(&self.record)
            .tenant
            .as_deref()
            .is_some_and(pool::internal)
    }

    fn touch(&self) {
        self.last_active.store(ids::now_ms(), Ordering::Relaxed);
        self.active_dirty.store(true, Ordering::Relaxed);
    }
}

/// Counts an operation in flight for the idle timer, and refreshes activity on both ends.
pub(crate) struct InFlight(Arc<Entry>);

impl InFlight {
    pub(crate) fn new(entry: Arc<Entry>) -> Self {
        entry.inflight.fetch_add(1, Ordering::Relaxed);
        entry.touch();
        Self(entry)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        // Release: whoever sees none under way sees this touch too (a description reuses a
        // walk of the files only for a sandbox untouched since: `crate::disk_meter`).
        self.0.inflight.fetch_sub(1, Ordering::Release);
    }
}

/// A sandbox forgotten because it went where the driver keeps it.
struct Gone {
    id: String,
    tenant: Option<String>,
    why: String,
}

pub(crate) struct Registry {
    records: Arc<Records>,
    driver: DriverHandle,
    networks: Arc<Networks>,
    sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    /// Newest last, [`GONE_KEPT`] at most: a later call on one gets why, not "no such sandbox".
    gone: Mutex<VecDeque<Gone>>,
    /// Serializes adding sandboxes (the count against the quota, the uid slots in use).
    adding: tokio::sync::Mutex<()>,
}

impl Registry {
    pub(crate) fn new(
        records: Arc<Records>,
        driver: DriverHandle,
        networks: Arc<Networks>,
    ) -> Self {
        Self {
            records,
            driver,
            networks,
            sandboxes: Mutex::new(HashMap::new()),
            gone: Mutex::new(VecDeque::new()),
            adding: tokio::sync::Mutex::new(()),
        }
    }

    /// Held while sandboxes are added: what [`Self::slots`] says stays true until it is dropped.
    pub(crate) async fn adding(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.adding.lock().await
    }

    /// How many sandboxes there are, and the uid slots they hold.
    pub(crate) fn slots(&self) -> (usize, Vec<u32>) {
        let map = lock(&self.sandboxes);
        (
            map.len(),
            map.values().map(|e| lock(&e.record).uid_slot).collect(),
        )
    }

    pub(crate) fn insert(&self, id: String, entry: Arc<Entry>) {
        lock(&self.sandboxes).insert(id, entry);
    }

    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Entry>> {
        lock(&self.sandboxes).remove(id)
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        lock(&self.sandboxes).contains_key(id)
    }

    /// Every sandbox, ready or not.
    pub(crate) fn entries(&self) -> Vec<(String, Arc<Entry>)> {
        lock(&self.sandboxes)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The sandboxes callers can see (committed as running).
    pub(crate) fn ready(&self) -> Vec<(String, Arc<Entry>)> {
        lock(&self.sandboxes)
            .iter()
            .filter(|(_, e)| e.ready.load(Ordering::Acquire))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The records of every sandbox, as callers see them.
    pub(crate) fn records(&self) -> Vec<Record> {
        lock(&self.sandboxes).values().map(|e| e.record()).collect()
    }

    /// A sandbox's view with the network its engine gives it.
    pub(crate) fn view(&self, entry: &Entry) -> SandboxView {
        let mut network = self.networks.info();
        network.filtered &= !entry.net.is_loopback_only();
        SandboxView {
            record: entry.record(),
            network,
            usage: None,
            jobs: Vec::new(),
        }
    }

    /// Sandbox `id` if `tenant` may see it (`None`: any tenant) and it is ready.
    pub(crate) fn entry(&self, id: &str, tenant: Option<&str>) -> Result<Arc<Entry>, EngineError> {
        let entry = lock(&self.sandboxes).get(id).cloned();
        match entry {
            Some(e)
                if e.ready.load(Ordering::Acquire)
                    && (tenant.is_none() || lock(&e.record).tenant.as_deref() == tenant) =>
            {
                Ok(e)
            }
            // Another tenant's sandbox answers exactly like one that does not exist.
            _ => Err(EngineError::sandbox_not_found(id)),
        }
    }

    /// Sandbox `id`, ready or not, whoever owns it.
    pub(crate) fn entry_any(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        lock(&self.sandboxes)
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::sandbox_not_found(id))
    }

    /// [`Self::entry`], or, on a driver that shares records, a sandbox another engine replica
    /// made: found where the driver keeps it and adopted into this replica's cache.
    pub(crate) async fn lookup(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Arc<Entry>, EngineError> {
        match self.entry(id, tenant) {
            Err(EngineError::NotFound(_)) if !self.contains(id) => {
                match self.records.find_elsewhere(id).await? {
                    Some(Shared::Live(record)) => self.adopt(record).await?,
                    // To another tenant it answers like any unknown id.
                    Some(Shared::Gone(record, why))
                        if tenant.is_none() || record.tenant.as_deref() == tenant =>
                    {
                        return Err(EngineError::Gone(why));
                    }
                    _ => {
                        if let Some(why) = self.gone_reason(id, tenant) {
                            return Err(EngineError::Gone(why));
                        }
                    }
                }
                self.entry(id, tenant)
            }
            other => other,
        }
    }

    /// Takes a sandbox another replica acknowledged into this replica's cache (as running: its
    /// pod runs). Internal sandboxes (pools, builds) stay their engine's own.
    async fn adopt(&self, mut record: Record) -> Result<(), EngineError> {
        if record.tenant.as_deref().is_some_and(pool::internal) {
            return Ok(());
        }
        let _guard = self.adding().await;
        if self.contains(&record.id) {
            return Ok(());
        }
        let (_, taken) = self.slots();
        record.uid_slot = self.driver.claim_slot(taken).await?;
        record.status = Status::Running;
        self.records.insert(&record).await?;
        let net = self.networks.sandbox_net(&record);
        let id = record.id.clone();
        self.insert(id, Entry::new(record, Runtime::Running, true, net));
        Ok(())
    }

    /// Drops a sandbox that no longer exists where the driver keeps it (killed by another
    /// replica, or its pod deleted or ended) from this replica's cache, remembering `why` for
    /// later calls on it (`None`: in general words).
    pub(crate) async fn forget(&self, id: &str, why: Option<String>) {
        let Some(entry) = self.remove(id) else {
            return;
        };
        let why = why.unwrap_or_else(|| {
            format!(
                "sandbox {id} is gone: it was deleted outside the engine, killed through another engine replica, or ended by its timeout; create a new sandbox"
            )
        });
        {
            let mut gone = lock(&self.gone);
            if gone.len() >= GONE_KEPT {
                gone.pop_front();
            }
            gone.push_back(Gone {
                id: id.to_string(),
                tenant: entry.tenant(),
                why,
            });
        }
        entry.ready.store(false, Ordering::Release);
        entry.net.close();
        *entry.lifecycle.lock().await = Runtime::Killed;
        self.networks.forget(id);
        let _ = self.records.delete(id).await;
        let slot = lock(&entry.record).uid_slot;
        self.driver.release_slot(slot).await;
    }

    /// Why sandbox `id` was forgotten, if it was (and belongs to `tenant`: to another tenant it
    /// answers like any unknown id).
    pub(crate) fn gone_reason(&self, id: &str, tenant: Option<&str>) -> Option<String> {
        lock(&self.gone)
            .iter()
            .rev()
            .find(|g| g.id == id && (tenant.is_none() || g.tenant.as_deref() == tenant))
            .map(|g| g.why.clone())
    }

    /// Brings this replica's cache in line with the sandboxes the driver keeps: adopts those it
    /// does not know, forgets those that are gone (not those it is still creating).
    pub(crate) async fn sync_shared(&self) -> Result<(), EngineError> {
        let Some(records) = self.records.all_elsewhere().await? else {
            return Ok(());
        };
        let live: HashSet<String> = records.iter().map(|r| r.id.clone()).collect();
        let stale: Vec<String> = self
            .ready()
            .into_iter()
            .filter(|(id, e)| !live.contains(id) && !e.internal())
            .map(|(id, _)| id)
            .collect();
        for id in stale {
            self.forget(&id, None).await;
        }
        for record in records {
            if !self.contains(&record.id) {
                self.adopt(record).await?;
            }
        }
        Ok(())
    }

    /// The sandboxes this engine knows of, newest first.
    pub(crate) fn list(
        &self,
        status: Option<Status>,
        metadata: &[(String, String)],
        tenant: Option<&str>,
    ) -> Vec<Record> {
        let mut out: Vec<Record> = self
            .ready()
            .into_iter()
            .map(|(_, e)| e.record())
            .filter(|r| !r.tenant.as_deref().is_some_and(pool::internal))
            .filter(|r| tenant.is_none() || r.tenant.as_deref() == tenant)
            .filter(|r| status.is_none_or(|s| r.status == s))
            .filter(|r| metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
            .collect();
        out.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        out
    }
}
