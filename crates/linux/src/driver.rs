//! The engine side of the namespaces driver: storage layout, cgroups, launching, and reaching the
//! agent. See [`super::launcher`] for what happens inside the new process.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;

use super::cgroups::{Cgroups, Layout};
use super::disk::{self, DiskLimits, Store};
use super::plan::{self};
use super::uids::{self, Registry};
use std::sync::Arc;

use sandbox_mcp_model::driver::EgressSockets;
use sandbox_mcp_model::driver::{
    AgentConn, Capabilities, CloneKind, CloneMethod, Driver, DriverError, FsLayers, FsRef,
    Isolation, Liveness, StartSpec, Storage, TemplateLayout, Usage,
};
use sandbox_mcp_sys::layers::TooDeep;

/// In a sandbox's directory, as root: the first host id its files are stored under, when that
/// is not its own range's (see [`NamespacesDriver::disk_ids`]).
const IDS_FILE: &str = "ids";
/// Beside a sandbox's directory: the tree a restore or merge is about to swap in, or the old
/// tree a restore has put aside (see [`Storage::replace_fs`](sandbox_mcp_model::driver::Storage::replace_fs)).
const NEW_SUFFIX: &str = ".new";

/// How to set up the namespaces driver.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where sandbox directories live (`<data dir>/sandboxes`).
    pub sandboxes_dir: PathBuf,
    /// The binary to re-execute as the launcher (this one, normally).
    pub exe: PathBuf,
    pub disk_limits: DiskLimits,
    /// Most sandboxes that exist at once: each gets that share of the host's ptys.
    pub max_sandboxes: usize,
    /// The host-wide registry of uid ranges (used as root).
    pub uid_registry: PathBuf,
    /// Turn on the host cgroup2 hierarchy's `favordynmods` (as root).
    pub favordynmods: bool,
    /// Where CRIU is, for forks that carry running processes.
    pub criu: sandbox_mcp_model::config::CriuSetting,
}

pub struct NamespacesDriver {
    sandboxes_dir: PathBuf,
    layout: Layout,
    /// Where sandbox directories live: btrfs subvolumes with disk limits, or plain directories.
    store: Store,
    /// The binary to re-execute as the launcher (this one, normally).
    exe: PathBuf,
    uid: u32,
    gid: u32,
    /// How this host freezes a cgroup, probed once (two lookups in /sys) rather than each time
    /// a sandbox's cgroups are named: `sandbox_info` names them on every call.
    freeze: crate::cgroups::FreezeMethod,
    /// As root, uid ranges are allocated host-wide; unprivileged, there is only the caller's id.
    registry: Option<Registry>,
    /// A sandbox's share of the ptys (see [`plan::pty_share`]), and the pool it is drawn from.
    pty_max: u32,
    pty_pool: u32,
    /// CRIU, checked at start, or why processes cannot be carried.
    criu: Result<crate::criu::Criu, String>,
    /// Held while layers are stacked or collected: a collection must never see a stack file
    /// before its layer, nor a layer before its stack file.
    stacking: std::sync::Mutex<()>,
}

impl NamespacesDriver {
    pub fn new(options: Options) -> Result<Self, DriverError> {
        let Options {
            sandboxes_dir,
            exe,
            disk_limits,
            max_sandboxes,
            uid_registry,
            favordynmods,
            criu,
        } = options;
        let path = sandboxes_dir.to_string_lossy();
        // Overlay mount options are comma- and colon-separated; such paths cannot be expressed.
        if path.contains([',', ':', '\n']) {
            return Err(DriverError::Unsupported(format!(
                "the data directory path {path} contains ',' or ':'; choose another SANDBOX_MCP_DATA_DIR"
            )));
        }
        // A unix socket path must fit in 108 bytes: <dir>/sbx_<26>/agent.sock, as an engine from
        // before `agents/` made them (the longer), and <data>/agents/sbx_<26>.sock.
        if path.len() + 1 + 30 + 11 > 107 {
            return Err(DriverError::Unsupported(format!(
                "the data directory path {path} is too long for unix sockets; choose a shorter SANDBOX_MCP_DATA_DIR"
            )));
        }
        // Sandbox roots (unprivileged host ids) must be able to traverse down to their own
        // directories to mount them: execute-only, never readable.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&sandboxes_dir)
            .map_err(DriverError::io("create the sandboxes directory"))?;
        let _ = fs::set_permissions(&sandboxes_dir, fs::Permissions::from_mode(0o711));
        let store = disk::open(&sandboxes_dir, disk_limits)
            .map_err(DriverError::io("set up the sandbox store"))?;
        if let Store::Plain(why) = &store {
            tracing::warn!("sandbox disk use is reported but not enforced: {why}");
        }
        put_back_aside_trees(&sandboxes_dir);
        if let Some(data) = sandboxes_dir.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(data.join(launch::AGENTS_DIR))
                .map_err(DriverError::io("create the agents' directory"))?;
        }
        // A fork's checkpoint lives only while the fork runs: one left is from a crash.
        // (Hibernated sandboxes' are kept until they wake or are killed.)
        if let Some(data) = sandboxes_dir.parent()
            && let Ok(entries) = fs::read_dir(data.join("live"))
        {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("fork-") {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        let layout = Layout::detect();
        if !layout.enforced() {
            tracing::warn!(
                "no usable cgroups: sandboxes run without memory, CPU and process limits, and cannot be paused"
            );
        }
        let uid = nix::unistd::getuid().as_raw();
        if favordynmods && uid == 0 && layout.enforced() {
            match super::cgroups::favor_dynamic_moves() {
                Ok(Some(mount)) => tracing::info!(
                    "turned on favordynmods for the cgroup2 hierarchy at {} (sandboxes start without waiting for an RCU grace period; --favordynmods off leaves it)",
                    mount.display()
                ),
                Ok(None) => {}
                Err(e) => tracing::debug!("favordynmods not turned on: {e}"),
            }
        }
        let registry = if uid == 0 {
            Some(
                Registry::new(uid_registry, &sandboxes_dir)
                    .map_err(DriverError::io("open the uid range registry"))?,
            )
        } else {
            None
        };
        let criu = match (&criu, uid) {
            (sandbox_mcp_model::config::CriuSetting::Off, _) => {
                Err("checkpointing processes is turned off (--criu off)".to_string())
            }
            (_, uid) if uid != 0 => Err(
                "checkpointing processes needs the engine to run as root (CRIU reads and restores other users' processes)".to_string(),
            ),
            (sandbox_mcp_model::config::CriuSetting::Path(p), _) => crate::criu::probe(Some(p)),
            (sandbox_mcp_model::config::CriuSetting::Auto, _) => crate::criu::probe(None),
        };
        if let Err(why) = &criu {
            tracing::info!("forks copy files only: {why}");
        }
        let pty_pool = plan::pty_pool();
        let pty_max = plan::pty_share(pty_pool, max_sandboxes);
        let driver = Self {
            sandboxes_dir,
            freeze: layout.freeze_method(),
            layout,
            store,
            exe,
            uid,
            gid: nix::unistd::getgid().as_raw(),
            registry,
            pty_max,
            pty_pool,
            criu,
            stacking: std::sync::Mutex::new(()),
        };
        driver.finish_stacking();
        Ok(driver)
    }

    /// The ptys a sandbox's devpts may hand out: as root, what the registry granted its slot.
    fn ptys_of(&self, slot: u32) -> u32 {
        match &self.registry {
            Some(registry) => match registry.ptys(slot) {
                Ok(Some(granted)) => granted,
                Ok(None) => self.pty_max,
                Err(e) => {
                    tracing::warn!(slot, "cannot read the uid range registry: {e}");
                    self.pty_max
                }
            },
            None => self.pty_max,
        }
    }

    /// Where named volumes are: in the sandbox store, so a btrfs store limits them too.
    fn volumes_dir(&self) -> PathBuf {
        self.sandboxes_dir.join(".volumes")
    }

    fn volume_dir(&self, key: &str) -> PathBuf {
        self.volumes_dir().join(key)
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.sandboxes_dir.join(id)
    }

    fn cgroups(&self, id: &str) -> Cgroups {
        self.layout.sandbox_with(id, self.freeze)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// As root, the first host id the files of `fs` are stored under: what its `ids` file says
    /// (a fork's or a restored sandbox's files keep the ids of the sandbox they came from), else
    /// the sandbox's own range. `None` unprivileged: every file is the engine user's.
    fn disk_ids(&self, fs: &FsRef) -> Option<u32> {
        if self.uid != 0 {
            return None;
        }
        match fs::read_to_string(self.dir(&fs.name).join(IDS_FILE)) {
            Ok(text) => match text.trim().parse() {
                Ok(ids) => Some(ids),
                Err(_) => {
                    tracing::warn!(fs = %fs.name, "unreadable ids file; assuming the sandbox's own range");
                    fs.slot.map(plan::uid_base)
                }
            },
            Err(_) => fs.slot.map(plan::uid_base),
        }
    }

    /// Writes down which host ids a sandbox's files are stored under before they are copied,
    /// so the copy carries it along.
    fn ensure_ids(&self, fs: &FsRef) -> io::Result<()> {
        let path = self.dir(&fs.name).join(IDS_FILE);
        match (self.disk_ids(fs), path.exists()) {
            (Some(ids), false) => sandbox_mcp_sys::durable::replace_with(&path, 0o600, |f, _| {
                use std::io::Write;
                f.write_all(ids.to_string().as_bytes())
            }),
            _ => Ok(()),
        }
    }

    /// Makes `to` a btrfs snapshot of `from` (a sandbox's files when `limit` is given, capped at
    /// it); `false` when the store cannot (not btrfs, or `from` is not a subvolume).
    fn snapshot_tree(
        &self,
        from: &FsRef,
        to: &str,
        limit: Option<u64>,
    ) -> Result<bool, DriverError> {
        self.ensure_ids(from)
            .map_err(DriverError::io("record the ids of the sandbox's files"))?;
        let made = disk::snapshot(&self.store, &self.sandboxes_dir, &from.name, to, limit)
            .map_err(DriverError::io("snapshot the sandbox's files"))?;
        if made && limit.is_some() {
            // The copy is a new sandbox: nothing of the old one's processes comes with it (an
            // engine from before `agents/` kept the agent's socket and pid in the tree).
            let _ = fs::remove_file(self.dir(to).join("agent.pid"));
            let _ = fs::remove_file(self.dir(to).join("agent.sock"));
        }
        Ok(made)
    }

    /// Copies `from`'s own files (its uppers) into `to`, a new directory.
    fn copy_fs(&self, from: &FsRef, to: &str) -> io::Result<()> {
        let (src, dst) = (self.dir(&from.name), self.dir(to));
        let owners = if self.uid == 0 {
            sandbox_mcp_sys::layers::Owners::Same
        } else {
            sandbox_mcp_sys::layers::Owners::Keep
        };
        if src.join("upper").is_dir() {
            sandbox_mcp_sys::layers::copy_tree(&src.join("upper"), &dst.join("upper"), owners)
                .map_err(
                    |e| match e.get_ref().and_then(|i| i.downcast_ref::<TooDeep>()) {
                        Some(deep) => io::Error::new(io::ErrorKind::InvalidData, deep.to_string()),
                        None => e,
                    },
                )?;
        }
        // The layers beneath are shared, never copied: the copy stacks on them too.
        for file in [IDS_FILE, stack::STACK_FILE] {
            if src.join(file).exists() {
                fs::copy(src.join(file), dst.join(file))?;
            }
        }
        // Acknowledged means on disk: a snapshot of the store commits itself, a copy does not.
        let dir = fs::File::open(&dst)?;
        nix::unistd::syncfs(&dir).map_err(io::Error::from)
    }
}

/// A copy of a sandbox's trees that failed: a tree nested too deep is the sandbox's own doing,
/// which the caller can fix, said in full; anything else is the engine's, doing `what`.
fn tree_error(what: &'static str) -> impl FnOnce(io::Error) -> DriverError {
    move |e| match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<TooDeep>())
    {
        Some(deep) => DriverError::Unsupported(deep.to_string()),
        None => DriverError::io(what)(e),
    }
}

/// After a crash in a restore on the btrfs store: a sandbox's old tree put aside (`<id>.new`)
/// while no tree has its name goes back under it (the restore was never acknowledged).
fn put_back_aside_trees(sandboxes_dir: &Path) {
    let Ok(entries) = fs::read_dir(sandboxes_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(NEW_SUFFIX)) else {
            continue;
        };
        let own = sandboxes_dir.join(id);
        if !own.exists()
            && let Err(e) = fs::rename(entry.path(), &own)
        {
            tracing::warn!(sandbox = %id, "cannot put the sandbox's files back in place: {e}");
        }
    }
}

mod isolation;
mod launch;
mod live;
mod stack;
mod storage;

pub use stack::MAX_STACK;

impl NamespacesDriver {
    /// The driver as the engine holds it: its capabilities, decided once, and this driver as both
    /// its isolation and its storage. (Its sandboxes belong to this engine: no shared records.)
    pub fn into_driver(self) -> Driver {
        let capabilities = Capabilities {
            name: NAME,
            limits_enforced: self.layout.enforced(),
            disk_limits_enforced: self.store.enforced(),
            // As root the launcher makes each sandbox's network namespace under the host's user
            // namespace and steers its traffic to the engine (`netns`); unprivileged, the agent
            // does it from inside (`netns::configure_unprivileged`).
            egress: true,
            network_unfiltered: false,
            serves_ports: true,
            restarts_stopped: true,
            timeouts_extend: true,
            image_templates: None,
            live_state: match &self.criu {
                Ok(c) => sandbox_mcp_model::driver::LiveState {
                    available: true,
                    detail: format!("criu {} at {}", c.version, c.path.display()),
                },
                Err(why) => sandbox_mcp_model::driver::LiveState {
                    available: false,
                    detail: why.clone(),
                },
            },
            volumes_refused: None,
            workspaces_refused: None,
            volume_quotas: self.store.enforced(),
        };
        let this = Arc::new(self);
        Driver {
            capabilities,
            isolation: this.clone(),
            storage: this,
            shared: None,
        }
    }
}

/// This driver's name, as the health endpoint and refusals show it.
const NAME: &str = "namespaces";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_put_aside_by_an_interrupted_restore_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str, file: &str| {
            fs::create_dir(dir.path().join(name)).unwrap();
            fs::write(dir.path().join(name).join(file), name).unwrap();
        };
        // Interrupted between the rename and the snapshot: only the old tree, aside.
        make("sbx_a.new", "old");
        // Interrupted after the snapshot: the restored tree stays, the aside one is left for
        // the next restore or the kill to delete.
        make("sbx_b", "restored");
        make("sbx_b.new", "old");
        put_back_aside_trees(dir.path());
        let read = |p: &str| fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("sbx_a/old"), "sbx_a.new");
        assert!(!dir.path().join("sbx_a.new").exists());
        assert_eq!(read("sbx_b/restored"), "sbx_b");
        assert_eq!(read("sbx_b.new/old"), "sbx_b.new");
    }
}
