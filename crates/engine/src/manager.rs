//! Sandbox lifecycles: create, find, pause, resume, kill; quotas; idle and expiry timers; and
//! recovery after a restart. Every operation on a sandbox's contents goes to its agent, resuming
//! the sandbox first if it is paused.
//!
//! Invariants:
//! - A sandbox is visible (list, get, exec) only once its record is committed as `running`.
//! - Lifecycle transitions of one sandbox are serialized by its `lifecycle` lock; contents
//!   operations (exec, files) run concurrently, outside it.
//! - The in-memory runtime state can always be rebuilt from the database and the driver.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;

use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::records::Records;
use crate::state::{NetworkRules, Record, Status, Store};
pub use import::import;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_model::driver::{
    AgentConn, Driver, DriverError, Liveness, Shared, StartSpec, Usage,
};
use sandbox_mcp_model::ids;
use sandbox_mcp_network::log as netlog;
use sandbox_mcp_network::{EgressDefault, Hub, SandboxNet};
use sandbox_mcp_protocol::{
    AgentError, Call, ExecOutcome, ExecSpec, Frame, JobInfo, KillAll, ListJobs, Output, Ping,
    read_frame_limited, write_frame,
};
use sandbox_mcp_storage::templates::Template;
pub(crate) use templates::{ShapeRequest, Step, TemplateRequest};

mod desktop;
mod import;
mod pool;
mod previews;
mod secrets;
mod snapshots;
mod templates;
pub(crate) use desktop::{ActionRequest, DISPLAY, parse_resolution};
pub(crate) use previews::{PreviewError, PreviewView, TOKEN_PARAM};
pub(crate) use secrets::SecretView;
use secrets::bound_env;
pub(crate) use snapshots::{Diffed, MAX_LABELS, MAX_SNAPSHOTS, Restored};

/// Cap on each of stdout and stderr in an exec result.
pub(crate) const EXEC_OUTPUT_CAP: u64 = 32 * 1024;
/// Largest file `read_file` returns.
pub(crate) const READ_LIMIT: u64 = 1024 * 1024;
/// Largest decoded file `write_file` accepts.
pub(crate) const WRITE_LIMIT: usize = 8 * 1024 * 1024;
/// Largest zip `download_dir` returns.
pub(crate) const ZIP_LIMIT: u64 = 10 * 1024 * 1024;
/// Most entries `list_files` returns.
pub(crate) const LIST_LIMIT: u64 = 1000;
/// Slack over an exec's own timeout before the engine gives up on the agent.
pub(crate) const EXEC_GRACE: Duration = Duration::from_secs(10);
/// Most output returned by one job status call.
pub(crate) const JOB_PAGE: u64 = 32 * 1024;
/// Deadline for agent operations other than exec.
const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the processes of a sandbox are doing, as far as the engine knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Running,
    Frozen,
    Stopped,
    Killed,
}

struct Entry {
    record: Mutex<Record>,
    lifecycle: tokio::sync::Mutex<Runtime>,
    /// Mirror of `lifecycle` readable without awaiting (for listings).
    visible_status: Mutex<Status>,
    ready: AtomicBool,
    last_active: AtomicI64,
    active_dirty: AtomicBool,
    inflight: AtomicUsize,
    /// The sandbox's network: policy, resolved names, open connections.
    net: Arc<SandboxNet>,
    /// Its ports served as preview URLs, by port.
    previews: Mutex<BTreeMap<u16, previews::Live>>,
    /// Times the engine stopped the sandbox's processes on purpose (a restore, a merge, a kill):
    /// a call whose agent hangs up across one was interrupted, not crashed.
    interruptions: AtomicU64,
    /// Set when a kill begins.
    killing: AtomicBool,
}

impl Entry {
    fn new(record: Record, runtime: Runtime, ready: bool, net: Arc<SandboxNet>) -> Arc<Self> {
        let last = record.last_active_at;
        let status = if runtime == Runtime::Running {
            Status::Running
        } else {
            Status::Paused
        };
        Arc::new(Self {
            record: Mutex::new(record),
            lifecycle: tokio::sync::Mutex::new(runtime),
            visible_status: Mutex::new(status),
            ready: AtomicBool::new(ready),
            last_active: AtomicI64::new(last),
            active_dirty: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            net,
            previews: Mutex::new(BTreeMap::new()),
            interruptions: AtomicU64::new(0),
            killing: AtomicBool::new(false),
        })
    }

    fn record(&self) -> Record {
        let mut r = lock(&self.record).clone();
        r.last_active_at = self.last_active.load(Ordering::Relaxed);
        r.status = *lock(&self.visible_status);
        r
    }

    fn set_visible(&self, runtime: Runtime) {
        *lock(&self.visible_status) = if runtime == Runtime::Running {
            Status::Running
        } else {
            Status::Paused
        };
    }

    fn touch(&self) {
        self.last_active.store(ids::now_ms(), Ordering::Relaxed);
        self.active_dirty.store(true, Ordering::Relaxed);
    }
}

use sandbox_mcp_sys::lock;

/// Counts an operation in flight for the idle timer, and refreshes activity on both ends.
struct InFlight(Arc<Entry>);

impl InFlight {
    fn new(entry: Arc<Entry>) -> Self {
        entry.inflight.fetch_add(1, Ordering::Relaxed);
        entry.touch();
        Self(entry)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request to create a sandbox, validated by the API layer.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub name: Option<String>,
    pub template: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub env: Vec<(String, String)>,
    pub timeout_seconds: Option<u64>,
    pub tenant: Option<String>,
    pub network: NetworkRules,
    /// Environment variable → secret name.
    pub secrets: BTreeMap<String, String>,
    /// Limits asked for, at most the template's.
    pub shape: ShapeRequest,
    /// A desktop of this size (create_computer); none for a plain sandbox.
    pub desktop: Option<sandbox_mcp_protocol::Screen>,
}

/// A sandbox as the API reports it.
#[derive(Debug, Clone)]
pub struct SandboxView {
    pub record: Record,
    pub network: NetworkInfo,
    pub usage: Option<(Usage, u64)>,
    pub jobs: Vec<JobInfo>,
}

/// What the engine gives every sandbox's network, beside the sandbox's own rules.
#[derive(Debug, Clone, Copy)]
pub struct NetworkInfo {
    pub default: EgressDefault,
    /// Traffic goes through the engine under the sandbox's policy (false: loopback only).
    pub filtered: bool,
}

/// A page of a sandbox's network log.
#[derive(Debug, Clone)]
pub(crate) struct NetworkLogPage {
    pub entries: Vec<netlog::Stored>,
    pub next_cursor: Option<i64>,
}

/// Resource use and limits of one sandbox.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub status: Status,
    pub usage: Usage,
    pub disk_bytes: u64,
    pub disk_limit_bytes: u64,
    pub limits_enforced: bool,
    pub disk_limit_enforced: bool,
}

/// What a streamed call yields: output as it arrives, then the reply.
#[derive(Debug, Clone)]
pub enum Event<R> {
    Output(Output),
    Reply(R),
}

/// An exec's outcome plus what the engine learned about memory.
#[derive(Debug, Clone)]
pub struct ExecResult {
    pub outcome: ExecOutcome,
    pub oom_killed: bool,
}

pub struct Manager {
    config: EngineConfig,
    driver: DriverHandle,
    store: Arc<Store>,
    /// Where records are kept beyond `store` (for drivers whose engine replicas share them).
    records: Records,
    templates: std::sync::RwLock<Vec<Arc<Template>>>,
    /// Serializes making and deleting templates (names, layer collection).
    template_lock: tokio::sync::Mutex<()>,
    /// Builds running now (layers are not collected meanwhile).
    builds: AtomicUsize,
    /// Started, idle sandboxes per template, for `create` to hand out.
    pools: Mutex<HashMap<String, pool::Pool>>,
    sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    /// Sandboxes this replica forgot because they went where the driver keeps them (a pod
    /// deleted or ended): (id, tenant, why), newest last, a few hundred at most. A later call
    /// on one gets why, not "no such sandbox".
    gone: Mutex<VecDeque<(String, Option<String>, String)>>,
    create_lock: tokio::sync::Mutex<()>,
    hub: Arc<Hub>,
    /// Secrets, sealed at rest, for the egress path to swap in.
    secrets: Arc<sandbox_mcp_network::secrets::SecretStore>,
    /// Cancelled when the engine stops: builds and pool refills end with it.
    stopping: tokio_util::sync::CancellationToken,
    /// This manager, for background work started from `&self` (warm pools).
    me: std::sync::OnceLock<std::sync::Weak<Manager>>,
    /// How preview URLs are written, once the preview listener is bound.
    preview_urls: std::sync::OnceLock<previews::Urls>,
}

pub(crate) use crate::driver::blocking;

/// One exchange with an agent on `conn` (see [`sandbox_mcp_protocol::exchange`]), its
/// broken connection or protocol as the driver's error.
pub(crate) async fn exchange<C: Call>(
    conn: &mut AgentConn,
    call: C,
) -> Result<Result<C::Reply, AgentError>, DriverError> {
    sandbox_mcp_protocol::exchange(conn, call)
        .await
        .map_err(|e| DriverError::Agent(e.to_string()))
}

impl Manager {
    /// Opens the state, loads templates and recovers every sandbox that existed.
    pub async fn open(config: EngineConfig, driver: Driver) -> Result<Arc<Self>, EngineError> {
        let driver = DriverHandle::new(driver);
        let db = config.state_db();
        let store = Arc::new(blocking(move || Store::open(&db)).await??);
        let (templates_dir, layers_dir) = (
            config.templates_dir(),
            sandbox_mcp_sys::layers::dir(&config.data_dir),
        );
        let templates = match driver.capabilities().image_templates.clone() {
            // The driver's images are its templates: nothing is built on this host.
            Some(images) => images
                .into_iter()
                .map(|(name, image)| {
                    sandbox_mcp_storage::templates::image_template(
                        &templates_dir,
                        &layers_dir,
                        &name,
                        &image,
                    )
                })
                .collect(),
            None => {
                blocking(move || sandbox_mcp_storage::templates::load(&templates_dir, &layers_dir))
                    .await?
                    .map_err(EngineError::Templates)?
            }
        };
        if let Some(name) = &config.default_template {
            match templates.iter().find(|t| &t.name == name) {
                Some(t) if t.status() == sandbox_mcp_storage::templates::TemplateStatus::Ready => {}
                Some(_) => {
                    return Err(EngineError::InvalidArgument(format!(
                        "the default template {name} is not ready (it failed to build); pick another with --default-template"
                    )));
                }
                None => {
                    return Err(EngineError::InvalidArgument(format!(
                        "the default template {name} does not exist; templates: {}",
                        templates
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        let templates = templates.into_iter().map(Arc::new).collect();
        let (db, legacy) = (config.network_log_db(), config.state_db());
        let log = blocking(move || netlog::NetLog::open(&db, Some(&legacy))).await??;
        let (db, key) = (config.state_db(), config.data_dir.join("secrets.key"));
        let secrets = Arc::new(
            blocking(move || sandbox_mcp_network::secrets::SecretStore::open(&db, &key))
                .await?
                .map_err(|e| EngineError::Unavailable {
                    what: "the secrets store cannot be opened",
                    source: e.into(),
                })?,
        );
        let (dir, extra) = (config.data_dir.clone(), config.network.egress_ca.clone());
        let interceptor =
            blocking(move || sandbox_mcp_network::intercept::Interceptor::open(&dir, &extra))
                .await?
                .map_err(|e| EngineError::Unavailable {
                    what: "the egress CA cannot be set up",
                    source: e.into(),
                })?;
        if driver.capabilities().image_templates.is_none() {
            sandbox_mcp_storage::templates::trust(&config.templates_dir(), interceptor.ca_pem())
                .map_err(EngineError::Templates)?;
        }
        // The engine's own budgets: every descriptor the hard limit allows (a share of them for
        // sandbox traffic), and large buffers that go back to the kernel when freed.
        let nofile = sandbox_mcp_sys::budget::raise_nofile();
        sandbox_mcp_sys::budget::tune_allocator();
        let hub = Hub::new(
            config.network.clone(),
            log,
            secrets.clone(),
            Some(Arc::new(interceptor)),
            sandbox_mcp_sys::budget::Descriptors::new(nofile),
        );
        let manager = Arc::new(Self {
            config,
            records: Records::new(driver.shared_records().cloned()),
            driver,
            store,
            templates: std::sync::RwLock::new(templates),
            template_lock: tokio::sync::Mutex::new(()),
            builds: AtomicUsize::new(0),
            pools: Mutex::new(HashMap::new()),
            sandboxes: Mutex::new(HashMap::new()),
            gone: Mutex::new(VecDeque::new()),
            create_lock: tokio::sync::Mutex::new(()),
            hub,
            secrets,
            preview_urls: std::sync::OnceLock::new(),
            me: std::sync::OnceLock::new(),
            stopping: tokio_util::sync::CancellationToken::new(),
        });
        let _ = manager.me.set(Arc::downgrade(&manager));
        manager.recover().await?;
        manager.restart_internal().await;
        Ok(manager)
    }

    pub(crate) fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn driver(&self) -> &DriverHandle {
        &self.driver
    }

    /// The engine's descriptors that sandbox traffic (relayed connections, previews) may use.
    pub(crate) fn descriptors(&self) -> &Arc<sandbox_mcp_sys::budget::Descriptors> {
        self.hub.fds()
    }

    /// After a restart: finish interrupted creates and kills; every other sandbox comes back
    /// paused — frozen with its processes if they survived, stopped (files kept) if not.
    async fn recover(&self) -> Result<(), EngineError> {
        let store = self.store.clone();
        let records = blocking(move || store.all()).await??;
        // Slots still in use: those of sandboxes that stay, and of any whose cleanup failed (its
        // files or processes may still hold the ids, so the range must not be handed out again).
        let mut held = Vec::new();
        for record in records {
            let id = record.id.clone();
            match record.status {
                Status::Creating | Status::Killing => {
                    let cleaned = match self.destroy_with_snapshots(&id).await {
                        Err(e) => {
                            tracing::warn!(sandbox = %id, "cleanup after restart failed: {e}");
                            false
                        }
                        Ok(()) => {
                            let (store, rid) = (self.store.clone(), id.clone());
                            let _ = blocking(move || store.delete(&rid)).await;
                            true
                        }
                    };
                    if !cleaned {
                        held.push(record.uid_slot);
                    }
                }
                Status::Running | Status::Paused => {
                    let runtime = match self.driver.liveness(&id).await {
                        Liveness::Gone => {
                            // Killed by another replica, or deleted behind the engine's back.
                            let store = self.store.clone();
                            let rid = id.clone();
                            blocking(move || store.delete(&rid)).await??;
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
                    let store = self.store.clone();
                    let rid = id.clone();
                    blocking(move || store.set_status(&rid, status)).await??;
                    let mut record = record;
                    record.status = status;
                    let net = self.sandbox_net(&record);
                    let entry = Entry::new(record, runtime, true, net);
                    if runtime != Runtime::Stopped {
                        // The agent survived the engine: serve its network again.
                        self.reattach_network(&id, &entry).await;
                    }
                    lock(&self.sandboxes).insert(id, entry);
                }
            }
        }
        // The registry of uid ranges must agree: slots of sandboxes cleaned up above (or lost
        // with a crash) are released, and those still held stay claimed.
        held.extend(
            lock(&self.sandboxes)
                .values()
                .map(|e| lock(&e.record).uid_slot),
        );
        self.driver.reconcile_slots(held).await;
        if self.records.local_only() {
            // Logs of sandboxes that went while no engine ran (or in a crash mid-kill) go too.
            let live = lock(&self.sandboxes).keys().cloned().collect();
            self.hub.log().retain(live);
        }
        self.recover_snapshots().await?;
        self.recover_previews().await
    }

    /// The policy of egress rules a caller gave. Rules are refused on a driver whose sandboxes
    /// reach a network the engine does not filter: they could not be honoured.
    fn rules(
        &self,
        rules: &NetworkRules,
    ) -> Result<sandbox_mcp_network::policy::Policy, EngineError> {
        if self.driver.capabilities().network_unfiltered
            && !(rules.allow_out.is_empty() && rules.deny_out.is_empty())
        {
            return Err(EngineError::InvalidArgument(format!(
                "the {} driver cannot apply egress rules: its sandboxes' egress is the cluster's NetworkPolicy; leave network rules out",
                self.driver.capabilities().name
            )));
        }
        self.hub
            .policy(&rules.allow_out, &rules.deny_out)
            .map_err(EngineError::InvalidArgument)
    }

    /// A sandbox's network state from its stored rules. Rules stored by an earlier engine that no
    /// longer parse (a changed default cannot make them, but a hand-edited database could) fall
    /// back to none, with a warning.
    fn sandbox_net(&self, record: &Record) -> Arc<SandboxNet> {
        let policy = self
            .hub
            .policy(&record.network.allow_out, &record.network.deny_out)
            .unwrap_or_else(|e| {
                tracing::warn!(sandbox = %record.id, "stored network rules ignored: {e}");
                self.hub.default_policy()
            });
        let net = SandboxNet::new(&record.id, policy);
        net.set_bindings(self.net_bindings(record));
        net
    }

    /// Opens the running sandbox's egress sockets and serves them.
    async fn attach_network(&self, id: &str, entry: &Arc<Entry>) -> Result<(), DriverError> {
        match self.driver.egress_sockets(id).await? {
            Some(sockets) => self
                .hub
                .attach(&entry.net, sockets)
                .map_err(DriverError::io("serve the sandbox's network")),
            None => {
                entry.net.set_loopback_only();
                Ok(())
            }
        }
    }

    /// [`Self::attach_network`] for a sandbox that already exists: a failure leaves it without
    /// a network (its connections fail), which the log says.
    async fn reattach_network(&self, id: &str, entry: &Arc<Entry>) {
        if let Err(e) = self.attach_network(id, entry).await {
            tracing::warn!(sandbox = %id, "the sandbox has no network: {e}");
        }
    }

    /// What the engine gives sandboxes' networks.
    pub(crate) fn network_info(&self) -> NetworkInfo {
        NetworkInfo {
            default: self.hub.config().egress,
            filtered: self.driver.capabilities().egress,
        }
    }

    fn view(&self, entry: &Entry) -> SandboxView {
        let mut network = self.network_info();
        network.filtered &= !entry.net.is_loopback_only();
        SandboxView {
            record: entry.record(),
            network,
            usage: None,
            jobs: Vec::new(),
        }
    }

    fn entry(&self, id: &str, tenant: Option<&str>) -> Result<Arc<Entry>, EngineError> {
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

    /// [`Self::entry`], or, on a driver that shares records, a sandbox another engine replica
    /// made: found where the driver keeps it and adopted into this replica's cache.
    async fn lookup(&self, id: &str, tenant: Option<&str>) -> Result<Arc<Entry>, EngineError> {
        match self.entry(id, tenant) {
            Err(EngineError::NotFound(_)) if !lock(&self.sandboxes).contains_key(id) => {
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
        let _guard = self.create_lock.lock().await;
        if lock(&self.sandboxes).contains_key(&record.id) {
            return Ok(());
        }
        let taken: Vec<u32> = lock(&self.sandboxes)
            .values()
            .map(|e| lock(&e.record).uid_slot)
            .collect();
        record.uid_slot = self.driver.claim_slot(taken).await?;
        record.status = Status::Running;
        let store = self.store.clone();
        let r = record.clone();
        blocking(move || store.insert(&r)).await??;
        let net = self.sandbox_net(&record);
        let id = record.id.clone();
        lock(&self.sandboxes).insert(id, Entry::new(record, Runtime::Running, true, net));
        Ok(())
    }

    /// Drops a sandbox that no longer exists where the driver keeps it (killed by another
    /// replica, or its pod deleted or ended) from this replica's cache, remembering `why` for
    /// later calls on it (`None`: in general words).
    async fn forget(&self, id: &str, why: Option<String>) {
        let Some(entry) = lock(&self.sandboxes).remove(id) else {
            return;
        };
        let why = why.unwrap_or_else(|| {
            format!(
                "sandbox {id} is gone: it was deleted outside the engine, killed through another engine replica, or ended by its timeout; create a new sandbox"
            )
        });
        {
            let mut gone = lock(&self.gone);
            if gone.len() >= 512 {
                gone.pop_front();
            }
            gone.push_back((id.to_string(), lock(&entry.record).tenant.clone(), why));
        }
        entry.ready.store(false, Ordering::Release);
        entry.net.close();
        *entry.lifecycle.lock().await = Runtime::Killed;
        self.hub.log().forget(id);
        let store = self.store.clone();
        let sid = id.to_string();
        let _ = blocking(move || store.delete(&sid)).await;
        let slot = lock(&entry.record).uid_slot;
        self.driver.release_slot(slot).await;
    }

    /// Why sandbox `id` was forgotten, if it was (and belongs to `tenant`: to another tenant it
    /// answers like any unknown id).
    fn gone_reason(&self, id: &str, tenant: Option<&str>) -> Option<String> {
        lock(&self.gone)
            .iter()
            .rev()
            .find(|(gid, owner, _)| gid == id && (tenant.is_none() || owner.as_deref() == tenant))
            .map(|(_, _, why)| why.clone())
    }

    /// Brings this replica's cache in line with the sandboxes the driver keeps: adopts those it
    /// does not know, forgets those that are gone (not those it is still creating).
    async fn sync_shared(&self) -> Result<(), EngineError> {
        let Some(records) = self.records.all_elsewhere().await? else {
            return Ok(());
        };
        let live: std::collections::HashSet<String> =
            records.iter().map(|r| r.id.clone()).collect();
        let stale: Vec<String> = lock(&self.sandboxes)
            .iter()
            .filter(|(id, e)| e.ready.load(Ordering::Acquire) && !live.contains(*id))
            .filter(|(_, e)| {
                !lock(&e.record)
                    .tenant
                    .as_deref()
                    .is_some_and(pool::internal)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            self.forget(&id, None).await;
        }
        for record in records {
            if !lock(&self.sandboxes).contains_key(&record.id) {
                self.adopt(record).await?;
            }
        }
        Ok(())
    }

    fn start_spec(&self, record: &Record) -> Result<StartSpec, EngineError> {
        let template = self.template(&record.template)?;
        Ok(StartSpec {
            id: record.id.clone(),
            uid_slot: record.uid_slot,
            shape: record.shape,
            template: template.layout.clone(),
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
        })
    }

    pub(crate) async fn create(&self, req: CreateRequest) -> Result<SandboxView, EngineError> {
        let template_name = req
            .template
            .clone()
            .unwrap_or_else(|| self.default_template());
        let template = self.ready_template(req.tenant.as_deref(), &template_name)?;
        let shape = req.shape.within(&template)?;
        // A pooled sandbox has the template's shape: only a request for that one takes it.
        if shape == template.shape
            && let Some(view) = self.take_warm(&template, &req).await?
        {
            return Ok(view);
        }
        self.create_from(req, &template, shape).await
    }

    /// Creates a sandbox from `template` (ready or, for a build sandbox, building).
    async fn create_from(
        &self,
        req: CreateRequest,
        template: &Template,
        shape: sandbox_mcp_model::driver::Shape,
    ) -> Result<SandboxView, EngineError> {
        let policy = self.rules(&req.network)?;
        let now = ids::now_ms();
        let record = {
            let _guard = self.create_lock.lock().await;
            let (count, used_slots): (usize, Vec<u32>) = {
                let map = lock(&self.sandboxes);
                (
                    map.len(),
                    map.values().map(|e| lock(&e.record).uid_slot).collect(),
                )
            };
            if count >= self.config.max_sandboxes {
                return Err(EngineError::QuotaExceeded(format!(
                    "the engine allows at most {} sandboxes and {count} exist",
                    self.config.max_sandboxes
                )));
            }
            let uid_slot = self.driver.claim_slot(used_slots).await?;
            let record = Self::record_of(
                &req,
                ids::sandbox_id(),
                &template.key,
                shape,
                uid_slot,
                Status::Creating,
                now,
                self.bind_new(req.tenant.as_deref(), &req.secrets)?,
            );
            let store = self.store.clone();
            let r = record.clone();
            if let Err(e) = blocking(move || store.insert(&r)).await? {
                self.driver.release_slot(uid_slot).await;
                return Err(e.into());
            }
            lock(&self.sandboxes).insert(
                record.id.clone(),
                Entry::new(record.clone(), Runtime::Stopped, false, {
                    let net = SandboxNet::new(&record.id, policy);
                    net.set_bindings(self.net_bindings(&record));
                    net
                }),
            );
            record
        };

        let spec = self.start_spec(&record)?;
        let entry = self.entry_any(&record.id)?;
        let started = match self.driver.start(&spec).await {
            Ok(()) => match self.attach_network(&record.id, &entry).await {
                Ok(()) => {
                    let mut acked = record.clone();
                    acked.status = Status::Running;
                    self.records.acknowledge(&acked).await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            entry.net.close();
            self.discard(&record.id, record.uid_slot).await;
            return Err(e.into());
        }
        let store = self.store.clone();
        let id = record.id.clone();
        blocking(move || store.set_status(&id, Status::Running)).await??;
        *entry.lifecycle.lock().await = Runtime::Running;
        entry.set_visible(Runtime::Running);
        lock(&entry.record).status = Status::Running;
        entry.ready.store(true, Ordering::Release);
        Ok(self.view(&entry))
    }

    /// The record of a sandbox made for `req` (a new one, or a pooled one it adopts), with the
    /// secret bindings already made for it.
    #[allow(clippy::too_many_arguments)]
    fn record_of(
        req: &CreateRequest,
        id: String,
        template: &str,
        shape: sandbox_mcp_model::driver::Shape,
        uid_slot: u32,
        status: Status,
        now: i64,
        secrets: BTreeMap<String, crate::state::Binding>,
    ) -> Record {
        Record {
            id,
            name: req.name.clone(),
            template: template.to_string(),
            status,
            metadata: req.metadata.clone(),
            env: req.env.clone(),
            shape,
            uid_slot,
            created_at: now,
            last_active_at: now,
            expires_at: req.timeout_seconds.map(|s| now + (s as i64) * 1000),
            tenant: req.tenant.clone(),
            network: req.network.clone(),
            secrets,
            desktop: req.desktop,
        }
    }

    fn entry_any(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        lock(&self.sandboxes)
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::sandbox_not_found(id))
    }

    /// [`Self::list`] after taking in what other replicas changed (drivers that share records).
    pub(crate) async fn list_current(
        &self,
        status: Option<Status>,
        metadata: &[(String, String)],
        tenant: Option<&str>,
    ) -> Result<Vec<Record>, EngineError> {
        self.sync_shared().await?;
        Ok(self.list(status, metadata, tenant))
    }

    /// The sandboxes this engine knows of, newest first.
    pub fn list(
        &self,
        status: Option<Status>,
        metadata: &[(String, String)],
        tenant: Option<&str>,
    ) -> Vec<Record> {
        let mut out: Vec<Record> = lock(&self.sandboxes)
            .values()
            .filter(|e| e.ready.load(Ordering::Acquire))
            .map(|e| e.record())
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

    pub(crate) async fn get(
        &self,
        id: &str,
        tenant: Option<&str>,
        with_usage: bool,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.lookup(id, tenant).await?;
        let usage = if with_usage {
            Some((
                self.driver.usage(id).await,
                self.driver.disk_bytes(id).await,
            ))
        } else {
            None
        };
        Ok(SandboxView {
            usage,
            ..self.view(&entry)
        })
    }

    /// Replaces what is given of the metadata and the egress rules. New rules apply to the next
    /// connection and DNS query (connections already open are not cut).
    pub(crate) async fn update(
        &self,
        id: &str,
        tenant: Option<&str>,
        metadata: Option<BTreeMap<String, String>>,
        network: Option<NetworkRules>,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.lookup(id, tenant).await?;
        let policy = network.as_ref().map(|n| self.rules(n)).transpose()?;
        let store = self.store.clone();
        let sid = id.to_string();
        let (m, n) = (metadata.clone(), network.clone());
        blocking(move || store.update(&sid, m.as_ref(), n.as_ref())).await??;
        {
            let mut record = lock(&entry.record);
            if let Some(m) = metadata {
                record.metadata = m;
            }
            if let (Some(n), Some(policy)) = (network, policy) {
                record.network = n;
                entry.net.set_policy(policy);
            }
        }
        {
            // Other replicas read the change from where the driver keeps the record.
            self.records.acknowledge(&entry.record()).await?;
        }
        Ok(self.view(&entry))
    }

    /// A page of the sandbox's network log (readable whatever the sandbox's state).
    pub(crate) async fn network_log(
        &self,
        id: &str,
        tenant: Option<&str>,
        query: netlog::Query,
    ) -> Result<NetworkLogPage, EngineError> {
        self.lookup(id, tenant).await?;
        let limit = query.limit;
        let entries = self.hub.log().read(id, query).await?;
        let next_cursor = if entries.len() == limit {
            entries.last().map(|e| e.id)
        } else {
            None
        };
        Ok(NetworkLogPage {
            entries,
            next_cursor,
        })
    }

    async fn set_status(&self, id: &str, status: Status) -> Result<(), EngineError> {
        let store = self.store.clone();
        let sid = id.to_string();
        blocking(move || store.set_status(&sid, status)).await??;
        Ok(())
    }

    pub(crate) async fn pause(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.lookup(id, tenant).await?;
        self.pause_entry(id, &entry).await?;
        Ok(self.view(&entry))
    }

    async fn pause_entry(&self, id: &str, entry: &Arc<Entry>) -> Result<(), EngineError> {
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

    pub(crate) async fn resume(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.lookup(id, tenant).await?;
        self.ensure_running(id, &entry).await?;
        Ok(self.view(&entry))
    }

    /// Thaws a frozen sandbox or restarts a stopped one.
    async fn ensure_running(&self, id: &str, entry: &Arc<Entry>) -> Result<(), EngineError> {
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
                self.forget(id, Some(why.clone())).await;
                return Err(EngineError::Gone(why));
            }
            Runtime::Stopped => {
                let spec = self.start_spec(&lock(&entry.record))?;
                self.driver.start(&spec).await?;
                // A new agent has a new network namespace.
                self.reattach_network(id, entry).await;
            }
        }
        self.set_status(id, Status::Running).await?;
        *rt = Runtime::Running;
        entry.set_visible(Runtime::Running);
        Ok(())
    }

    /// After the agent hung up on a call: the error to give when the engine stopped the
    /// sandbox's processes on purpose since the call began (`since`); `None` for a real agent
    /// failure, which is noted (see [`Self::note_agent_failure`]).
    async fn interrupted(&self, id: &str, entry: &Arc<Entry>, since: u64) -> Option<EngineError> {
        if entry.interruptions.load(Ordering::Acquire) == since {
            self.note_agent_failure(id, entry).await;
            // Its pod went while the call ran: say so rather than how the connection broke.
            return self
                .gone_reason(id, None)
                .filter(|_| !lock(&self.sandboxes).contains_key(id))
                .map(EngineError::Gone);
        }
        Some(if !entry.killing.load(Ordering::Acquire) {
            EngineError::Conflict(format!(
                "sandbox {id}'s files were replaced (a snapshot restore or a merge) while this call ran, which stopped its processes; run it again"
            ))
        } else {
            EngineError::NotFound(format!("sandbox {id} was killed while this call ran"))
        })
    }

    /// After an agent failure (it hung up, or broke the protocol): an agent that is gone, or that
    /// no longer answers a ping as it should, is not trusted again — its processes are stopped and
    /// the next call starts a fresh one on the sandbox's files.
    async fn note_agent_failure(&self, id: &str, entry: &Arc<Entry>) {
        let liveness = self.driver.liveness(id).await;
        if liveness == Liveness::Gone {
            self.forget(id, None).await;
            return;
        }
        if liveness == Liveness::Stopped || !self.ping(id).await {
            self.stop_agent(id, entry).await;
        }
    }

    /// Stops a running sandbox's processes and marks it so the next call restarts it.
    async fn stop_agent(&self, id: &str, entry: &Arc<Entry>) {
        let mut rt = entry.lifecycle.lock().await;
        if *rt == Runtime::Running {
            let _ = self.driver.stop(id).await;
            *rt = Runtime::Stopped;
            entry.set_visible(Runtime::Stopped);
            let _ = self.set_status(id, Status::Paused).await;
        }
    }

    /// Destroys a sandbox's processes and files, and its snapshots' files (their rows go with
    /// its record).
    async fn destroy_with_snapshots(&self, id: &str) -> Result<(), EngineError> {
        self.driver.destroy(id).await?;
        let (store, sid) = (self.store.clone(), id.to_string());
        for snap in blocking(move || store.snapshots(Some(&sid))).await?? {
            self.driver.remove_fs(&snap.id).await?;
        }
        Ok(())
    }

    /// Takes back a sandbox that was never acknowledged: its processes, files, record and slot
    /// (the slot only once the rest is gone, so its ids are never reused too soon).
    async fn discard(&self, id: &str, slot: u32) {
        if self.driver.destroy(id).await.is_ok() {
            let (store, sid) = (self.store.clone(), id.to_string());
            if let Ok(Ok(())) = blocking(move || store.delete(&sid)).await {
                self.driver.release_slot(slot).await;
            }
        }
        lock(&self.sandboxes).remove(id);
    }

    pub(crate) async fn kill(&self, id: &str, tenant: Option<&str>) -> Result<(), EngineError> {
        let entry = self.lookup(id, tenant).await?;
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
        let (store, sid) = (self.store.clone(), id.to_string());
        blocking(move || store.delete(&sid)).await??;
        self.driver.release_slot(slot).await;
        *rt = Runtime::Killed;
        entry.ready.store(false, Ordering::Release);
        entry.net.close();
        self.hub.log().forget(id);
        lock(&self.sandboxes).remove(id);
        // What the engine held for the sandbox (relay buffers, decrypted connections) goes back
        // to the kernel, not only to the allocator. Its connections end as the network closes.
        tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let _ = blocking(sandbox_mcp_sys::budget::give_back).await;
        });
        Ok(())
    }

    /// Sends `call` to the sandbox's agent (resuming or restarting the sandbox first) and returns
    /// its reply; output frames are skipped. `deadline` bounds the whole exchange.
    pub(crate) async fn call<C: Call>(
        &self,
        id: &str,
        tenant: Option<&str>,
        call: C,
        deadline: Duration,
    ) -> Result<C::Reply, EngineError> {
        let (entry, _inflight, mut conn) = self.agent_conn(id, tenant).await?;
        let mut call = call;
        call.add_env(&bound_env(&entry));
        let since = entry.interruptions.load(Ordering::Acquire);
        let exchange = exchange(&mut conn, call);
        match tokio::time::timeout(deadline, exchange).await {
            Ok(Ok(answer)) => answer.map_err(EngineError::from),
            Ok(Err(e)) => Err(self
                .interrupted(id, &entry, since)
                .await
                .unwrap_or_else(|| e.into())),
            Err(_) => Err(self.timed_out(id, &entry, deadline).await),
        }
    }

    /// The error for a call the agent did not answer in time. The agent is asked once more, with
    /// a ping: one that cannot answer that is wedged and is not trusted again — the sandbox's
    /// processes are stopped, and the next call starts a fresh agent on its files.
    async fn timed_out(&self, id: &str, entry: &Arc<Entry>, deadline: Duration) -> EngineError {
        if self.ping(id).await {
            return EngineError::Timeout(format!(
                "the sandbox did not answer within {} s",
                deadline.as_secs()
            ));
        }
        tracing::warn!(sandbox = %id, "the agent stopped answering; stopping the sandbox");
        self.stop_agent(id, entry).await;
        EngineError::Sandbox(format!(
            "the sandbox's agent stopped answering (no reply within {} s, none to a ping either), so the sandbox's processes were stopped; its files are kept and the next call restarts it",
            deadline.as_secs()
        ))
    }

    /// Whether the agent answers a ping within two seconds.
    async fn ping(&self, id: &str) -> bool {
        let ping = async {
            let mut conn = self.driver.connect(id).await.ok()?;
            exchange(&mut conn, Ping {}).await.ok()?.ok()
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), ping).await,
            Ok(Some(_))
        )
    }

    /// A connection to the sandbox's agent, resuming or restarting the sandbox as needed.
    async fn agent_conn(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<(Arc<Entry>, InFlight, AgentConn), EngineError> {
        let entry = self.lookup(id, tenant).await?;
        let inflight = InFlight::new(entry.clone());
        self.ensure_running(id, &entry).await?;
        // Nothing has been sent if the agent cannot be reached: when it turns out to be dead
        // (crashed, OOM-killed), restart it and go on, so the caller never sees the crash.
        let conn = match self.driver.connect(id).await {
            Ok(conn) => conn,
            Err(DriverError::Gone(why)) => {
                self.forget(id, Some(why.clone())).await;
                return Err(EngineError::Gone(why));
            }
            Err(_) => {
                self.note_agent_failure(id, &entry).await;
                self.ensure_running(id, &entry).await?;
                self.driver.connect(id).await?
            }
        };
        Ok((entry, inflight, conn))
    }

    /// Sends `call` and returns the agent's output as it arrives, ending with the reply.
    /// Dropping the stream closes the connection, which the agent takes as a cancellation.
    pub(crate) async fn stream<C: Call>(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
        call: C,
        deadline: Duration,
    ) -> Result<
        impl Stream<Item = Result<Event<C::Reply>, EngineError>> + Send + 'static,
        EngineError,
    >
    where
        C::Reply: Send + 'static,
    {
        let (entry, inflight, mut conn) = self.agent_conn(id, tenant).await?;
        let mut call = call;
        call.add_env(&bound_env(&entry));
        let limit = call.reply_limit();
        write_frame(&mut conn, &call.into())
            .await
            .map_err(|e| EngineError::Sandbox(format!("the sandbox's agent hung up: {e}")))?;
        let until = tokio::time::Instant::now() + deadline;
        let since = entry.interruptions.load(Ordering::Acquire);
        let state = Some((conn, inflight, entry, self.clone(), id.to_string()));
        Ok(futures::stream::unfold(state, move |state| async move {
            let (mut conn, inflight, entry, manager, id) = state?;
            let frame = tokio::time::timeout_at(
                until,
                read_frame_limited::<_, Frame<C::Reply>>(&mut conn, limit),
            )
            .await;
            match frame {
                Ok(Ok(Some(Frame::Output(output)))) => Some((
                    Ok(Event::Output(output)),
                    Some((conn, inflight, entry, manager, id)),
                )),
                Ok(Ok(Some(Frame::Reply(reply)))) => Some((Ok(Event::Reply(reply)), None)),
                Ok(Ok(Some(Frame::Error(e)))) => Some((Err(EngineError::from(e)), None)),
                Ok(Ok(None)) | Ok(Err(_)) => {
                    let error = manager.interrupted(&id, &entry, since).await.unwrap_or_else(|| {
                        EngineError::Sandbox(
                            "the sandbox's agent closed the connection (it may have run out of memory)".into(),
                        )
                    });
                    Some((Err(error), None))
                }
                Err(_) => Some((Err(manager.timed_out(&id, &entry, deadline).await), None)),
            }
        }))
    }

    /// Oom kills counted so far, to tell whether a command ran out of memory. Read in place:
    /// one small cgroup file, which never blocks, costs less than a trip to the blocking pool
    /// and back (it is read before and after every command).
    pub(crate) fn oom_mark(&self, id: &str) -> u64 {
        self.driver.oom_kills_now(id)
    }

    /// After a command finished: whether the sandbox ran out of memory since `before`; if so,
    /// its remaining processes are killed (v1 cgroups have no oom.group).
    pub(crate) async fn settle_oom(&self, id: &str, tenant: Option<&str>, before: u64) -> bool {
        let oom = self.oom_mark(id) > before;
        if oom {
            let _ = self.call(id, tenant, KillAll {}, AGENT_TIMEOUT).await;
        }
        oom
    }

    /// Background jobs of a running sandbox (a paused one is not woken up to list them).
    pub(crate) async fn jobs(&self, id: &str, tenant: Option<&str>) -> Option<Vec<JobInfo>> {
        let entry = self.lookup(id, tenant).await.ok()?;
        if *lock(&entry.visible_status) != Status::Running {
            return None;
        }
        // Asked directly: looking at a sandbox is not activity, and must not keep it from
        // being paused when idle.
        let mut conn = self.driver.connect(id).await.ok()?;
        match tokio::time::timeout(Duration::from_secs(5), exchange(&mut conn, ListJobs {})).await {
            Ok(Ok(Ok(list))) => Some(list.jobs),
            _ => None,
        }
    }

    /// Runs a command to completion; on an OOM kill, the sandbox's other processes go too (v1
    /// cgroups have no oom.group), so it never limps on half-dead.
    pub(crate) async fn exec(
        &self,
        id: &str,
        tenant: Option<&str>,
        spec: ExecSpec,
    ) -> Result<ExecResult, EngineError> {
        let before = self.oom_mark(id);
        let deadline = Duration::from_millis(spec.timeout_ms) + EXEC_GRACE;
        let outcome = self.call(id, tenant, spec, deadline).await?;
        let oom_killed = self.settle_oom(id, tenant, before).await;
        Ok(ExecResult {
            outcome,
            oom_killed,
        })
    }

    pub(crate) async fn metrics(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Metrics, EngineError> {
        let entry = self.lookup(id, tenant).await?;
        let (usage, disk_bytes) = (
            self.driver.usage(id).await,
            self.driver.disk_bytes(id).await,
        );
        let record = entry.record();
        Ok(Metrics {
            status: record.status,
            usage,
            disk_bytes,
            disk_limit_bytes: record.shape.disk_mb * 1024 * 1024,
            limits_enforced: self.driver.capabilities().limits_enforced,
            disk_limit_enforced: self.driver.capabilities().disk_limits_enforced,
        })
    }

    async fn flush_active(&self, id: &str, entry: &Arc<Entry>) {
        if entry.active_dirty.swap(false, Ordering::Relaxed) {
            let at = entry.last_active.load(Ordering::Relaxed);
            let store = self.store.clone();
            let sid = id.to_string();
            let _ = blocking(move || store.set_last_active(&sid, at)).await;
        }
    }

    /// One pass of the timers: kill expired sandboxes, pause idle ones, persist activity.
    pub(crate) async fn tick(&self) {
        if let Err(e) = self.sync_shared().await {
            tracing::warn!("cannot read the sandboxes other replicas made: {e}");
        }
        let now = ids::now_ms();
        let entries: Vec<(String, Arc<Entry>)> = lock(&self.sandboxes)
            .iter()
            .filter(|(_, e)| e.ready.load(Ordering::Acquire))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, entry) in entries {
            let record = entry.record();
            if record.expires_at.is_some_and(|t| t <= now) {
                tracing::info!(sandbox = %id, "timeout reached; killing");
                if let Err(e) = self.kill(&id, None).await {
                    tracing::warn!(sandbox = %id, "auto-kill failed: {e}");
                }
                continue;
            }
            if let Some(idle) = self.config.idle_pause
                && record.status == Status::Running
                && entry.inflight.load(Ordering::Relaxed) == 0
                && now - entry.last_active.load(Ordering::Relaxed) >= idle.as_millis() as i64
            {
                tracing::info!(sandbox = %id, "idle; pausing");
                if let Err(e) = self.pause_entry(&id, &entry).await {
                    tracing::debug!(sandbox = %id, "auto-pause skipped: {e}");
                }
            }
            self.flush_active(&id, &entry).await;
        }
    }

    /// Runs the timers until `stop` fires.
    pub(crate) async fn run_timers(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut interval = tokio::time::interval(self.config.tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = interval.tick() => self.tick().await,
            }
        }
    }

    /// Clean shutdown: running sandboxes are frozen (their processes and memory are kept, no CPU
    /// is used) and marked paused; the next engine resumes them on first use.
    pub(crate) async fn shutdown(&self) {
        self.stopping.cancel();
        let entries: Vec<(String, Arc<Entry>)> = lock(&self.sandboxes)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, entry) in entries {
            // The engine's own sandboxes (pools, builds) would be killed at the next start
            // anyway: killed now, they leave no frozen processes behind meanwhile.
            let tenant = lock(&entry.record).tenant.clone();
            if tenant.as_deref().is_some_and(pool::internal) {
                if let Err(e) = self.kill(&id, tenant.as_deref()).await {
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
}
