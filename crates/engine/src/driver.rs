//! The driver as the engine's services call it: every operation async, whatever blocks (cgroup
//! writes, the uid registry, copying files) run on the blocking pool here and nowhere else, and
//! the driver's capabilities at hand as data.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sandbox_mcp_model::driver::{
    AgentConn, Capabilities, CloneKind, CloneMethod, Driver, DriverError, FsLayers, FsRef,
    Isolation, Liveness, SharedRecords, StartSpec, Storage, TemplateLayout, Usage,
};
use sandbox_mcp_model::ids;

use crate::disk_meter::{DiskMeter, Measured};
use crate::error::EngineError;

/// Runs `f` on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EngineError> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

/// A driver call that panicked or was cancelled with the runtime, as the driver's error (its
/// operation's outcome is unknown, as after any failure of the host).
fn unfinished(e: tokio::task::JoinError) -> DriverError {
    DriverError::Io {
        what: "finish a call of the driver",
        source: std::io::Error::other(e),
    }
}

/// The driver an engine runs its sandboxes with.
#[derive(Clone)]
pub struct DriverHandle {
    capabilities: Arc<Capabilities>,
    isolation: Arc<dyn Isolation>,
    storage: Arc<dyn Storage>,
    shared: Option<Arc<dyn SharedRecords>>,
    disk: Arc<DiskMeter>,
}

impl DriverHandle {
    pub fn new(driver: Driver) -> Self {
        Self {
            capabilities: Arc::new(driver.capabilities),
            isolation: driver.isolation,
            storage: driver.storage,
            shared: driver.shared,
            disk: Arc::default(),
        }
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// The driver's isolation itself, for callers off the runtime (a test's cleanup on drop,
    /// say): its calls block.
    pub fn isolation(&self) -> &dyn Isolation {
        &*self.isolation
    }

    /// Where the driver shares records between engine replicas, if it does.
    pub(crate) fn shared_records(&self) -> Option<&Arc<dyn SharedRecords>> {
        self.shared.as_ref()
    }

    /// Runs `f` with the isolation on the blocking pool.
    async fn isolated<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Isolation) -> Result<T, DriverError> + Send + 'static,
    ) -> Result<T, DriverError> {
        let isolation = self.isolation.clone();
        tokio::task::spawn_blocking(move || f(&*isolation))
            .await
            .unwrap_or_else(|e| Err(unfinished(e)))
    }

    /// Runs `f` with the storage on the blocking pool.
    async fn stored<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Storage) -> Result<T, DriverError> + Send + 'static,
    ) -> Result<T, DriverError> {
        let storage = self.storage.clone();
        tokio::task::spawn_blocking(move || f(&*storage))
            .await
            .unwrap_or_else(|e| Err(unfinished(e)))
    }

    pub(crate) async fn claim_slots(
        &self,
        taken: Vec<u32>,
        count: usize,
    ) -> Result<Vec<u32>, DriverError> {
        self.isolated(move |d| d.claim_slots(&taken, count)).await
    }

    pub(crate) async fn claim_slot(&self, taken: Vec<u32>) -> Result<u32, DriverError> {
        self.isolated(move |d| d.claim_slot(&taken)).await
    }

    pub(crate) async fn release_slot(&self, slot: u32) {
        let _ = self
            .isolated(move |d| {
                d.release_slot(slot);
                Ok(())
            })
            .await;
    }

    pub(crate) async fn reconcile_slots(&self, held: Vec<u32>) {
        let _ = self
            .isolated(move |d| {
                d.reconcile_slots(&held);
                Ok(())
            })
            .await;
    }

    pub(crate) async fn close(&self) {
        let _ = self
            .isolated(|d| {
                d.close();
                Ok(())
            })
            .await;
    }

    pub(crate) async fn start(&self, spec: &StartSpec) -> Result<(), DriverError> {
        self.isolation.start(spec).await
    }

    pub(crate) async fn connect(&self, id: &str) -> Result<AgentConn, DriverError> {
        self.isolation.connect(id).await
    }

    pub(crate) async fn liveness(&self, id: &str) -> Liveness {
        self.isolation.liveness(id).await
    }

    pub(crate) async fn freeze(&self, id: &str) -> Result<(), DriverError> {
        let id = id.to_string();
        self.isolated(move |d| d.freeze(&id)).await
    }

    pub(crate) async fn thaw(&self, id: &str) -> Result<(), DriverError> {
        let id = id.to_string();
        self.isolated(move |d| d.thaw(&id)).await
    }

    pub(crate) async fn stop(&self, id: &str) -> Result<(), DriverError> {
        let id = id.to_string();
        self.isolated(move |d| d.stop(&id)).await
    }

    pub(crate) async fn destroy(&self, id: &str) -> Result<(), DriverError> {
        let id = id.to_string();
        let meter = self.disk.clone();
        self.isolated(move |d| {
            let destroyed = d.destroy(&id);
            meter.forget(&id);
            destroyed
        })
        .await
    }

    /// Sandbox `id`'s resource use (all of it, or `brief`ly: what its description shows) and
    /// what its files take, in one trip to the blocking pool. The walk of its files is left out
    /// where a recent one may stand for it, unless the caller wants the figure as of now
    /// (`fresh`): see [`crate::disk_meter`]. `last_active`: when a call of the engine last
    /// started or ended in it, `None` while one is under way.
    pub(crate) async fn usage_and_disk(
        &self,
        id: &str,
        brief: bool,
        fresh: bool,
        last_active: Option<i64>,
    ) -> (Usage, u64) {
        let (usage, bytes) = self.measure(id, Some(brief), fresh, last_active).await;
        (usage.unwrap_or_default(), bytes)
    }

    /// What sandbox `id`'s files take as of now (a walk begun after this call, perhaps another
    /// caller's).
    pub(crate) async fn disk_bytes(&self, id: &str) -> u64 {
        self.measure(id, None, true, None).await.1
    }

    async fn measure(
        &self,
        id: &str,
        usage: Option<bool>,
        fresh: bool,
        last_active: Option<i64>,
    ) -> (Option<Usage>, u64) {
        let asked = Instant::now();
        let slot = self.disk.slot(id);
        let last = slot.lock().await;
        let reused = last.filter(|m| m.serves(asked, fresh, last_active));
        // With no walk to make, what is left is at most a description's three small cgroup
        // files, which never block: read in place (like `oom_kills_now`), not worth a trip to
        // the blocking pool and back.
        if let Some(disk) = reused
            && usage != Some(false)
        {
            drop(last);
            let usage = usage.map(|_| self.isolation.usage_brief(id));
            return (usage, disk.bytes);
        }
        // With nothing to write back, other callers need not wait for this one.
        let mut last = reused.is_none().then_some(last);
        let (isolation, storage, id) =
            (self.isolation.clone(), self.storage.clone(), id.to_string());
        let measured = tokio::task::spawn_blocking(move || {
            let usage = usage.map(|brief| match brief {
                true => isolation.usage_brief(&id),
                false => isolation.usage(&id),
            });
            let disk = reused.unwrap_or_else(|| {
                let (started, started_ms) = (Instant::now(), ids::now_ms());
                let bytes = storage.disk_bytes(&id);
                Measured {
                    started,
                    started_ms,
                    took: started.elapsed(),
                    bytes,
                }
            });
            (usage, disk)
        })
        .await;
        let Ok((usage, disk)) = measured else {
            return (None, 0);
        };
        if let Some(last) = &mut last {
            **last = Some(disk);
        }
        (usage, disk.bytes)
    }

    pub(crate) async fn processes(&self, id: &str) -> u64 {
        let id = id.to_string();
        self.isolated(move |d| Ok(d.processes(&id)))
            .await
            .unwrap_or_default()
    }

    /// OOM kills so far, read in place: one small cgroup file, which never blocks, costs less
    /// than a trip to the blocking pool and back (it is read before and after every command).
    pub(crate) fn oom_kills_now(&self, id: &str) -> u64 {
        self.isolation.oom_kills(id)
    }

    pub(crate) async fn checkpoint(
        &self,
        id: &str,
        name: &str,
    ) -> Result<sandbox_mcp_model::driver::LiveReport, DriverError> {
        self.isolation.checkpoint(id, name).await
    }

    pub(crate) async fn continue_processes(&self, id: &str) {
        let id = id.to_string();
        let _ = self
            .isolated(move |d| {
                d.continue_processes(&id);
                Ok(())
            })
            .await;
    }

    pub(crate) async fn restore_checkpoint(
        &self,
        id: &str,
        name: &str,
    ) -> Result<sandbox_mcp_model::driver::LiveReport, DriverError> {
        self.isolation.restore_checkpoint(id, name).await
    }

    pub(crate) async fn checkpoint_bytes(&self, name: &str) -> Option<u64> {
        let name = name.to_string();
        self.isolated(move |d| Ok(d.checkpoint_bytes(&name)))
            .await
            .ok()
            .flatten()
    }

    pub(crate) async fn has_checkpoint(&self, name: &str) -> bool {
        let name = name.to_string();
        self.isolated(move |d| Ok(d.has_checkpoint(&name)))
            .await
            .unwrap_or(false)
    }

    pub(crate) async fn drop_checkpoint(&self, name: &str) {
        let name = name.to_string();
        let _ = self
            .isolated(move |d| {
                d.drop_checkpoint(&name);
                Ok(())
            })
            .await;
    }

    pub(crate) async fn copy_checkpoint(&self, from: &str, to: &str) -> Result<(), DriverError> {
        let (from, to) = (from.to_string(), to.to_string());
        self.isolated(move |d| d.copy_checkpoint(&from, &to)).await
    }

    pub(crate) async fn open_connections(&self, id: &str) -> Option<u64> {
        let id = id.to_string();
        self.isolated(move |d| Ok(d.open_connections(&id)))
            .await
            .ok()
            .flatten()
    }

    pub(crate) async fn egress_sockets(
        &self,
        id: &str,
    ) -> Result<Option<sandbox_mcp_model::driver::EgressSockets>, DriverError> {
        self.isolation.egress_sockets(id).await
    }

    pub(crate) async fn connect_port(
        &self,
        id: &str,
        port: u16,
    ) -> std::io::Result<tokio::net::TcpStream> {
        self.isolation.connect_port(id, port).await
    }

    pub(crate) async fn disk_charge(&self, id: &str) -> Option<u64> {
        let id = id.to_string();
        self.stored(move |s| Ok(s.disk_charge(&id)))
            .await
            .unwrap_or_default()
    }

    pub(crate) async fn capture(
        &self,
        id: &str,
        slot: u32,
        targets: Vec<String>,
        dest: PathBuf,
    ) -> Result<u64, DriverError> {
        let id = id.to_string();
        self.stored(move |s| s.capture(&id, slot, &targets, &dest))
            .await
    }

    pub(crate) async fn clone_fs(
        &self,
        from: FsRef,
        to: &str,
        kind: CloneKind,
    ) -> Result<CloneMethod, DriverError> {
        let to = to.to_string();
        self.stored(move |s| s.clone_fs(&from, &to, kind)).await
    }

    pub(crate) async fn clone_many(
        &self,
        from: FsRef,
        to: Vec<(String, u64)>,
    ) -> Result<CloneMethod, DriverError> {
        self.stored(move |s| s.clone_many(&from, &to)).await
    }

    pub(crate) async fn can_stack(&self, from: FsRef) -> bool {
        self.stored(move |s| Ok(s.can_stack(&from)))
            .await
            .unwrap_or(false)
    }

    pub(crate) async fn can_stack_stopped(&self, from: FsRef) -> bool {
        self.stored(move |s| Ok(s.can_stack_stopped(&from)))
            .await
            .unwrap_or(false)
    }

    pub(crate) async fn stack_fs(
        &self,
        from: FsRef,
        to: Vec<(String, CloneKind)>,
    ) -> Result<Option<CloneMethod>, DriverError> {
        self.stored(move |s| s.stack_fs(&from, &to)).await
    }

    pub(crate) async fn replace_fs(
        &self,
        id: &str,
        from: FsRef,
        limit_bytes: u64,
    ) -> Result<CloneMethod, DriverError> {
        let id = id.to_string();
        let meter = self.disk.clone();
        self.stored(move |s| {
            let replaced = s.replace_fs(&id, &from, limit_bytes);
            meter.forget(&id);
            replaced
        })
        .await
    }

    pub(crate) async fn remove_fs(&self, name: &str) -> Result<(), DriverError> {
        let name = name.to_string();
        let meter = self.disk.clone();
        self.stored(move |s| {
            let removed = s.remove_fs(&name);
            meter.forget(&name);
            removed
        })
        .await
    }

    pub(crate) async fn fs_layers(
        &self,
        fs: FsRef,
        template: TemplateLayout,
    ) -> Result<FsLayers, DriverError> {
        self.stored(move |s| s.fs_layers(&fs, &template)).await
    }

    pub(crate) async fn create_volume(
        &self,
        key: &str,
        quota_bytes: Option<u64>,
    ) -> Result<(), DriverError> {
        let key = key.to_string();
        self.stored(move |s| s.create_volume(&key, quota_bytes))
            .await
    }

    pub(crate) async fn copy_volume(
        &self,
        from: &str,
        to: &str,
        quota_bytes: Option<u64>,
    ) -> Result<(), DriverError> {
        let (from, to) = (from.to_string(), to.to_string());
        self.stored(move |s| s.copy_volume(&from, &to, quota_bytes))
            .await
    }

    pub(crate) async fn refill_volume(&self, key: &str, from: &str) -> Result<(), DriverError> {
        let (key, from) = (key.to_string(), from.to_string());
        self.stored(move |s| s.refill_volume(&key, &from)).await
    }

    pub(crate) async fn volume_bytes(&self, key: &str) -> u64 {
        let key = key.to_string();
        self.stored(move |s| Ok(s.volume_bytes(&key)))
            .await
            .unwrap_or(0)
    }

    pub(crate) async fn remove_volume(&self, key: &str) -> Result<(), DriverError> {
        let key = key.to_string();
        self.stored(move |s| s.remove_volume(&key)).await
    }
}
