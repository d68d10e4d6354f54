//! The driver interface: what a driver can do ([`Capabilities`], data read once), how it isolates
//! sandboxes ([`Isolation`]), where it keeps their files ([`Storage`]) and, for a driver whose
//! engine replicas share sandboxes, their records ([`SharedRecords`]); a [`Driver`] bundles them.
//! The engine sees drivers only through these, so a microVM driver (agent over vsock) can be
//! added as the Kubernetes driver (agent in a pod) was, without touching it. Operations that may
//! block (cgroup writes, directory walks) are synchronous and called from blocking threads (the
//! engine's `DriverHandle` does, and nothing else); starting a sandbox and reaching its agent are
//! async.

use std::path::PathBuf;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The host cannot do this (e.g. pause without a cgroup freezer); says what would.
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox could not be started: the launcher's report, meant for the caller.
    #[error("{0}")]
    Launch(String),
    /// The agent could not be reached or broke the protocol.
    #[error("{0}")]
    Agent(String),
    /// The sandbox no longer exists where the driver keeps it (its pod was deleted or ended):
    /// why, in words for the caller.
    #[error("{0}")]
    Gone(String),
    /// The host has nothing left of something every sandbox needs (uid ranges, ptys): what
    /// frees some, in words for the caller.
    #[error("{0}")]
    Exhausted(String),
    /// An operation on the host failed (a cgroup, the store, the registry).
    #[error("cannot {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl DriverError {
    /// Names the host operation an I/O error belongs to.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
    }
}

pub use crate::record::Shape;

/// A template as the driver needs it: the overlays that make a sandbox's filesystem.
#[derive(Debug, Clone)]
pub struct TemplateLayout {
    pub name: String,
    /// The root (`/`) first, then directories mounted below it (a host's /usr, say).
    pub mounts: Vec<MountLayers>,
}

/// One overlay: read-only directories stacked at `target`, the sandbox's own upper on top.
#[derive(Debug, Clone, PartialEq)]
pub struct MountLayers {
    /// Mount point inside the sandbox (`/` for the root).
    pub target: String,
    /// Lower directories on the host, top first (overlayfs' `lowerdir` order).
    pub lowers: Vec<PathBuf>,
}

/// Everything needed to start (or restart) one sandbox.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub id: String,
    /// Index of the sandbox's host uid range, unique among live sandboxes.
    pub uid_slot: u32,
    pub shape: Shape,
    pub template: TemplateLayout,
    pub env: Vec<(String, String)>,
    /// Working directory of commands that name none (`/root` when `None`).
    pub workdir: Option<String>,
    /// uid and gid commands run as (root when `None`).
    pub user: Option<(u32, u32)>,
    /// Named volumes to bind-mount (workspaces are overlays of `template`).
    pub volumes: Vec<VolumeBind>,
    /// The sandbox's record, for drivers that keep it with the sandbox (see
    /// [`Driver::shared`]).
    pub record: crate::record::Record,
    /// This start continues the last run (a hibernated sandbox waking: its processes come
    /// back): the driver keeps what tells one boot from another, such as the boot id.
    pub same_boot: bool,
}

/// A named volume mounted into a sandbox: the driver's key for it, where, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeBind {
    pub key: String,
    pub target: String,
    pub read_only: bool,
}

/// A filesystem the driver keeps: a sandbox's (`slot` given) or a snapshot's.
#[derive(Debug, Clone)]
pub struct FsRef {
    pub name: String,
    /// The sandbox's uid slot; `None` for a snapshot.
    pub slot: Option<u32>,
}

/// A filesystem's layers as they lie on the host, to compare two without entering either.
#[derive(Debug, Clone)]
pub struct FsLayers {
    /// Per overlay: its target inside the sandbox, its upper directory, its lowers (top first).
    pub mounts: Vec<(String, PathBuf, Vec<PathBuf>)>,
    /// As root, the first host id the uppers' files are stored under; `None`: ids as they are.
    pub id_base: Option<u32>,
    /// How many of each mount's lowers, the first ones, are the sandbox's own earlier files:
    /// layers a fork or snapshot froze (stored as its upper is, under `id_base`), not the
    /// template's.
    pub stacked: usize,
}

/// What [`Storage::clone_fs`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneKind {
    /// A sandbox snapshot: read-only, kept until deleted.
    Snapshot,
    /// A new sandbox's directory, limited to this many bytes.
    Sandbox { limit_bytes: u64 },
}

/// How a filesystem was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMethod {
    /// A copy-on-write snapshot of the store (btrfs): milliseconds whatever the size.
    Snapshot,
    /// A file-by-file copy of the sandbox's own changes (no btrfs store).
    Copy,
    /// No copy: the sandbox's own files became a read-only layer shared by it and its copies,
    /// each writing on a new empty layer above it (no btrfs store).
    Layers,
}

impl CloneMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            CloneMethod::Snapshot => "btrfs",
            CloneMethod::Copy => "copy",
            CloneMethod::Layers => "layers",
        }
    }
}

/// A sandbox found where a driver that shares records keeps it.
#[derive(Debug, Clone)]
pub enum Shared {
    /// Acknowledged and running.
    Live(crate::record::Record),
    /// It ended outside the engine (its record, for its tenant; why, for the caller).
    Gone(crate::record::Record, String),
}

/// What the driver sees of a sandbox's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The agent answers.
    Running,
    /// Processes exist but are frozen.
    Frozen,
    /// No agent: the sandbox must be started before use.
    Stopped,
    /// The sandbox no longer exists where the driver keeps it (a deleted pod): nothing to
    /// start again.
    Gone,
}

/// Resource use of one sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub memory_peak_bytes: u64,
    pub memory_limit_bytes: u64,
    pub pids: u64,
    pub pids_limit: u64,
    pub oom_kills: u64,
}

/// A connection to a sandbox's agent.
pub trait AgentStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AgentStream for T {}
pub type AgentConn = Box<dyn AgentStream>;

/// What a driver can do, decided once when it is made: data the engine reads, not probes it
/// calls.
#[derive(Debug, Clone, Default)]
pub struct Capabilities {
    /// Short name reported by the health endpoint.
    pub name: &'static str,
    /// Resource limits are enforced (cgroups, or a cluster's pod limits).
    pub limits_enforced: bool,
    /// Each sandbox's disk use is capped at its shape's `disk_mb`.
    pub disk_limits_enforced: bool,
    /// Sandboxes' DNS and TCP go through the engine under their policy (otherwise they have
    /// loopback only).
    pub egress: bool,
    /// Sandboxes reach a network the engine does not filter (a cluster's pod network): egress
    /// rules and brokered secrets are then refused rather than ignored.
    pub network_unfiltered: bool,
    /// The engine can reach a port inside a sandbox (for preview URLs): in its network
    /// namespace, or by way of the agent ([`Isolation::connect_port`]).
    pub serves_ports: bool,
    /// A stopped sandbox (no agent, its files kept) can be started again. Without it, a stopped
    /// sandbox is gone: its files went with it (a deleted pod).
    pub restarts_stopped: bool,
    /// A sandbox's timeout can be moved later than it is. Not on Kubernetes: a pod's
    /// `activeDeadlineSeconds`, the kubelet's own kill at the timeout, can only be shortened.
    pub timeouts_extend: bool,
    /// The templates this driver serves instead of the engine's own (the kubernetes driver's
    /// images, by template name); `None`: the engine's templates.
    pub image_templates: Option<Vec<(String, String)>>,
    /// Whether running processes can be checkpointed and restored (forks with memory).
    pub live_state: LiveState,
    /// Why named volumes cannot be mounted, for the caller; `None`: they can.
    pub volumes_refused: Option<String>,
    /// Why workspaces (host folders) cannot be mounted; `None`: they can.
    pub workspaces_refused: Option<String>,
    /// A volume's size is its limit (a btrfs quota, a claim's capacity): `size_mb` is kept.
    pub volume_quotas: bool,
}

/// Whether a driver can carry running processes from one sandbox to another, and in words what
/// does it (`criu 4.2 at /usr/local/sbin/criu`) or what is missing and how to get it.
#[derive(Debug, Clone, Default)]
pub struct LiveState {
    pub available: bool,
    pub detail: String,
}

/// What a checkpoint or a restore of a sandbox's processes did: the process trees carried (a
/// code context, a job), and those left behind with why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveReport {
    pub carried: Vec<String>,
    pub skipped: Vec<String>,
}

/// How sandboxes are isolated and reached: their processes, limits and agents.
pub trait Isolation: Send + Sync + 'static {
    /// Reserves the identity slots of `count` new sandboxes (all or none): each unique among
    /// every live sandbox the driver knows of (host-wide for the namespaces driver). `taken`:
    /// this engine's slots.
    fn claim_slots(&self, taken: &[u32], count: usize) -> Result<Vec<u32>, DriverError>;
    /// [`Self::claim_slots`] for one sandbox.
    fn claim_slot(&self, taken: &[u32]) -> Result<u32, DriverError> {
        self.claim_slots(taken, 1)?
            .pop()
            .ok_or_else(|| DriverError::Launch("no identity slot is free".into()))
    }
    /// Gives back the slot of a sandbox that is gone.
    fn release_slot(&self, slot: u32);
    /// After a restart: the slots this engine's sandboxes hold, so stale claims are released.
    fn reconcile_slots(&self, held: &[u32]);
    /// The engine is stopping (its sandboxes paused): let go of what the driver holds on the
    /// host, such as the mount of the sandbox store.
    fn close(&self);
    /// Creates the sandbox's storage if needed and starts its agent. Resolves once the agent
    /// accepts connections.
    fn start<'a>(&'a self, spec: &'a StartSpec) -> BoxFuture<'a, Result<(), DriverError>>;
    /// Opens a connection to the agent.
    fn connect<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<AgentConn, DriverError>>;
    /// Whether the sandbox's agent is alive, frozen, or gone.
    fn liveness<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Liveness>;
    fn freeze(&self, id: &str) -> Result<(), DriverError>;
    fn thaw(&self, id: &str) -> Result<(), DriverError>;
    /// Kills every process; keeps the filesystem.
    fn stop(&self, id: &str) -> Result<(), DriverError>;
    /// Kills every process and deletes the sandbox's filesystem and cgroups.
    fn destroy(&self, id: &str) -> Result<(), DriverError>;
    fn usage(&self, id: &str) -> Usage;
    /// [`Self::usage`]'s `cpu_seconds`, `memory_bytes` and `pids` (the rest may be zero), where
    /// reading fewer is cheaper: what a sandbox's description shows, read on every `sandbox_info`,
    /// on the engine's async threads when no walk of its files is due: it must not block (a few
    /// small kernel files at most).
    fn usage_brief(&self, id: &str) -> Usage {
        self.usage(id)
    }
    /// Processes the sandbox has (not threads, not exited ones awaiting their parent).
    fn processes(&self, id: &str) -> u64 {
        self.usage(id).pids
    }
    /// [`Self::usage`]'s `oom_kills` alone, cheap enough to read around every command.
    fn oom_kills(&self, id: &str) -> u64 {
        self.usage(id).oom_kills
    }
    /// The sockets through which the running sandbox's DNS queries and outbound connections
    /// reach the engine, made anew (after a start or an engine restart). `None`: this driver
    /// gives sandboxes no egress (they have loopback only).
    fn egress_sockets<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EgressSockets>, DriverError>> {
        let _ = id;
        Box::pin(async { Ok(None) })
    }
    /// Dumps the running sandbox's process trees (code contexts, background jobs) as checkpoint
    /// `name` (kept where only the engine reads it), leaving them stopped until
    /// [`Self::continue_processes`]. Trees that cannot be carried are reported, not fatal.
    fn checkpoint<'a>(
        &'a self,
        id: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<LiveReport, DriverError>> {
        let _ = (id, name);
        Box::pin(async { Err(DriverError::Unsupported(self.no_live_state())) })
    }
    /// Continues every stopped process of the sandbox (after a checkpoint and the copy of its
    /// files).
    fn continue_processes(&self, id: &str) {
        let _ = id;
    }
    /// Restores checkpoint `name` into the running sandbox `id`, whose agent takes the trees
    /// over.
    fn restore_checkpoint<'a>(
        &'a self,
        id: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<LiveReport, DriverError>> {
        let _ = (id, name);
        Box::pin(async { Err(DriverError::Unsupported(self.no_live_state())) })
    }
    /// Whether checkpoint `name` exists (a hibernated sandbox's, a memory snapshot's).
    fn has_checkpoint(&self, name: &str) -> bool {
        self.checkpoint_bytes(name).is_some()
    }
    /// The bytes checkpoint `name` takes on disk; `None` if there is none.
    fn checkpoint_bytes(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }
    /// Deletes checkpoint `name` (nothing if there is none).
    fn drop_checkpoint(&self, name: &str) {
        let _ = name;
    }
    /// Why this driver carries no processes.
    fn no_live_state(&self) -> String {
        "this driver cannot checkpoint running processes".into()
    }
    /// Copies checkpoint `from` as checkpoint `to` (a new name), without copying its images'
    /// bytes where the store can: each may then be restored and dropped on its own.
    fn copy_checkpoint(&self, from: &str, to: &str) -> Result<(), DriverError> {
        let _ = (from, to);
        Err(DriverError::Unsupported(self.no_live_state()))
    }
    /// TCP connections in the running sandbox's network that a restore of its processes would
    /// close (any but listening and closed sockets); `None`: this driver cannot tell.
    fn open_connections(&self, id: &str) -> Option<u64> {
        let _ = id;
        None
    }
    /// Connects to `127.0.0.1:port` inside the sandbox by way of its agent (for drivers whose
    /// engine cannot enter the sandbox's network namespace). `ConnectionRefused`: nothing listens.
    fn connect_port<'a>(
        &'a self,
        _id: &'a str,
        _port: u16,
    ) -> BoxFuture<'a, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(async { Err(std::io::ErrorKind::Unsupported.into()) })
    }
}

/// Where sandboxes' files are kept, and what the engine can do with them from outside: measure,
/// capture, copy, compare. Every method but [`Self::disk_bytes`] has a default that refuses (or,
/// for what never existed, does nothing): a driver that keeps no files the engine can reach
/// implements only that.
pub trait Storage: Send + Sync + 'static {
    /// The driver's name, for refusals.
    fn name(&self) -> &'static str;

    /// Bytes the sandbox has written to its filesystem (walks its upper layers).
    fn disk_bytes(&self, id: &str) -> u64;

    /// Bytes the store charges to sandbox `id`'s disk limit, its snapshots' share included,
    /// when the store keeps that count itself (btrfs simple quotas): read in constant time.
    /// `None`: the engine measures the files and adds its snapshots up.
    fn disk_charge(&self, id: &str) -> Option<u64> {
        let _ = id;
        None
    }

    /// Copies the sandbox's writable layers (of the overlays at `targets`) into `dest`, a new
    /// layer directory, with ids as the sandbox sees them. The sandbox is stopped or frozen.
    /// Returns the bytes of file content copied.
    fn capture(
        &self,
        id: &str,
        slot: u32,
        targets: &[String],
        dest: &std::path::Path,
    ) -> Result<u64, DriverError> {
        let _ = (id, slot, targets, dest);
        Err(DriverError::Unsupported(format!(
            "the {} driver cannot capture a sandbox's filesystem",
            self.name()
        )))
    }

    /// Copies the filesystem `from` (a sandbox's, stopped or frozen, or a snapshot's) to the new
    /// name `to`: a read-only snapshot, or the directory of a new sandbox with its disk limit.
    fn clone_fs(
        &self,
        from: &FsRef,
        to: &str,
        kind: CloneKind,
    ) -> Result<CloneMethod, DriverError> {
        let _ = (from, to, kind);
        Err(no_snapshots(self.name()))
    }

    /// Copies `from` to each of `to` (new sandboxes' directories, each with its disk limit), as
    /// [`Self::clone_fs`] would one by one: a store that does better with copies made together
    /// (btrfs commits snapshots made together in one transaction) overrides it. All or an error.
    fn clone_many(&self, from: &FsRef, to: &[(String, u64)]) -> Result<CloneMethod, DriverError> {
        let mut method = CloneMethod::Snapshot;
        for (name, limit_bytes) in to {
            method = self.clone_fs(
                from,
                name,
                CloneKind::Sandbox {
                    limit_bytes: *limit_bytes,
                },
            )?;
        }
        Ok(method)
    }

    /// Whether [`Self::stack_fs`] would stack `from`'s files rather than decline, and nothing
    /// but its agent runs in it (so stopping it for that ends nothing).
    fn can_stack(&self, from: &FsRef) -> bool {
        let _ = from;
        false
    }

    /// Whether [`Self::stack_fs`] would stack `from`'s files once it is stopped, whatever runs
    /// in it now (its processes are then the caller's to carry over the stop).
    fn can_stack_stopped(&self, from: &FsRef) -> bool {
        let _ = from;
        false
    }

    /// Without copying a file: makes the stopped sandbox `from`'s own files a read-only layer,
    /// which it and each of `to` (new sandboxes' directories, or one snapshot's) then share
    /// beneath a new empty writable layer of their own. `None`: the store does better by
    /// cloning (btrfs), or `from` already sits on as many layers as an overlay should stack.
    fn stack_fs(
        &self,
        from: &FsRef,
        to: &[(String, CloneKind)],
    ) -> Result<Option<CloneMethod>, DriverError> {
        let _ = (from, to);
        Ok(None)
    }

    /// Makes the stopped sandbox `id`'s filesystem a copy of `from` in one step: its old files
    /// are gone only once the new ones are in place.
    fn replace_fs(
        &self,
        id: &str,
        from: &FsRef,
        limit_bytes: u64,
    ) -> Result<CloneMethod, DriverError> {
        let _ = (id, from, limit_bytes);
        Err(no_snapshots(self.name()))
    }

    /// Deletes a snapshot's files. A driver without snapshots never made any: nothing to
    /// delete (so a failed snapshot's row, and the sandbox it belongs to, can go).
    fn remove_fs(&self, name: &str) -> Result<(), DriverError> {
        let _ = name;
        Ok(())
    }

    /// Makes named volume `key` (one path component the engine chose): an empty directory
    /// sandboxes mount, limited to `quota_bytes` when given. Idempotent.
    fn create_volume(&self, key: &str, quota_bytes: Option<u64>) -> Result<(), DriverError> {
        let _ = (key, quota_bytes);
        Err(DriverError::Unsupported(format!(
            "the {} driver has no volumes",
            self.name()
        )))
    }

    /// Makes volume `to` a copy of volume `from` (copy-on-write where the store can), limited to
    /// `quota_bytes` when given.
    fn copy_volume(
        &self,
        from: &str,
        to: &str,
        quota_bytes: Option<u64>,
    ) -> Result<(), DriverError> {
        let _ = (from, to, quota_bytes);
        Err(DriverError::Unsupported(format!(
            "the {} driver cannot copy volumes; fork with volumes=share",
            self.name()
        )))
    }

    /// Makes volume `key`'s files those of volume `from`, in place (its mounts stay); nothing
    /// when there is no `from`.
    fn refill_volume(&self, key: &str, from: &str) -> Result<(), DriverError> {
        let _ = (key, from);
        Ok(())
    }

    /// Bytes volume `key` holds.
    fn volume_bytes(&self, key: &str) -> u64 {
        let _ = key;
        0
    }

    /// Deletes volume `key` and its files (nothing to do if it does not exist).
    fn remove_volume(&self, key: &str) -> Result<(), DriverError> {
        let _ = key;
        Ok(())
    }

    /// The filesystem `fs` as its layers lie on the host, for a diff.
    fn fs_layers(&self, fs: &FsRef, template: &TemplateLayout) -> Result<FsLayers, DriverError> {
        let _ = (fs, template);
        Err(no_snapshots(self.name()))
    }
}

/// Where a driver whose sandboxes outlive any one engine replica keeps their records (pod
/// annotations), so that every replica creates, sees and kills the same sandboxes. A record is
/// found there only once it is acknowledged.
pub trait SharedRecords: Send + Sync + 'static {
    /// Every acknowledged record kept there (uid slots are the caller's to give).
    fn all(&self) -> BoxFuture<'_, Result<Vec<crate::record::Record>, DriverError>>;
    /// Sandbox `id` as kept there: its acknowledged record, or the record of one that ended and
    /// why; `None` if it does not exist (or is not acknowledged yet).
    fn find<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Shared>, DriverError>>;
    /// Stores `record` with the sandbox and marks it acknowledged (after create, after update).
    fn acknowledge<'a>(
        &'a self,
        record: &'a crate::record::Record,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
}

/// A driver, as the engine holds it: what it can do, how it isolates sandboxes, where it keeps
/// their files, and — for a driver whose sandboxes several engine replicas share — where it
/// keeps their records.
#[derive(Clone)]
pub struct Driver {
    pub capabilities: Capabilities,
    pub isolation: std::sync::Arc<dyn Isolation>,
    pub storage: std::sync::Arc<dyn Storage>,
    pub shared: Option<std::sync::Arc<dyn SharedRecords>>,
}

/// Storage for a driver that keeps no sandbox files the engine can reach (the kubernetes
/// driver's are in pods): disk use is not measured, and every copy is refused.
pub struct NoStorage(pub &'static str);

impl Storage for NoStorage {
    fn name(&self) -> &'static str {
        self.0
    }

    fn disk_bytes(&self, _id: &str) -> u64 {
        0
    }
}

/// What a driver without snapshots answers to a snapshot, fork, restore, merge or diff.
fn no_snapshots(driver: &str) -> DriverError {
    DriverError::Unsupported(format!(
        "the {driver} driver cannot snapshot or fork a sandbox's filesystem"
    ))
}

/// The two sockets the engine owns inside a sandbox's network namespace.
#[derive(Debug)]
pub struct EgressSockets {
    /// Listening on 127.0.0.1:`EGRESS_PORT`: every TCP connection to a non-local address.
    pub tcp: std::net::TcpListener,
    /// Bound to 127.0.0.1:`DNS_PORT`: every DNS query.
    pub dns: std::net::UdpSocket,
    /// The namespace itself (`/proc/<agent>/ns/net`), where previews connect to the sandbox's
    /// ports. Held open, it names this namespace even if the agent's pid is reused. None when
    /// the engine cannot enter it (unprivileged: the sandbox's user namespace owns it).
    pub netns: Option<std::fs::File>,
}
