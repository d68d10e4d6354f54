//! Per-sandbox cgroups on cgroup v2, v1 ("hybrid": v1 controllers plus an empty v2 mount, as on
//! these machines), or none (unprivileged without delegation: limits are reported as not enforced).
//!
//! Limits come from the template shape: memory (no swap), pids, CPU quota. Pausing prefers the v2
//! `cgroup.freeze` (also present on a hybrid host's v2 mount, and faster than the v1 freezer);
//! the v1 freezer is the fallback. Killing prefers `cgroup.kill`; without it every process is
//! killed while frozen, so nothing can fork away in between.

use sandbox_mcp_sys::mounts::{MountLine, mounts};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_mcp_model::driver::Usage;

/// Name of the parent cgroup every sandbox cgroup lives under.
pub const PARENT: &str = "sandbox-mcp";

/// Where the cgroup hierarchies are mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Pure cgroup v2 at this mount point.
    V2 { root: PathBuf },
    /// v1 controllers (memory, pids, cpu, cpuacct, freezer) plus, maybe, a v2 mount with no
    /// controllers (used for `cgroup.freeze`, `cgroup.kill` and `cpu.stat`).
    Hybrid {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
        freezer: Option<PathBuf>,
        unified: Option<PathBuf>,
    },
    /// No usable cgroups.
    None,
}

/// Resource limits for one sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub max_pids: u64,
    pub vcpus: f64,
}

/// How to freeze one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeMethod {
    /// `cgroup.freeze` on a v2 (or hybrid unified) cgroup.
    V2,
    /// `freezer.state` on the v1 freezer controller.
    V1,
}

/// The cgroup directories of one sandbox (they may not exist yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    layout: Layout,
    id: String,
    freeze: FreezeMethod,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn read_u64(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    if text == "max" {
        return Some(u64::MAX);
    }
    text.parse().ok()
}

/// `key value` lines (cpu.stat, memory.events, memory.oom_control).
fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key)).then(|| parts.next()?.parse().ok())?
    })
}

impl Layout {
    /// Reads the cgroup mounts from /proc/self/mountinfo and checks that sandbox cgroups can be
    /// created under them.
    pub fn detect() -> Layout {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
            return Layout::None;
        };
        let layout = Self::parse_mountinfo(&info);
        if layout.prepare().is_ok() {
            layout
        } else {
            Layout::None
        }
    }

    /// Parses mountinfo; pure, for tests.
    pub fn parse_mountinfo(info: &str) -> Layout {
        let mut v2 = None;
        let (mut memory, mut pids, mut cpu, mut cpuacct, mut freezer) =
            (None, None, None, None, None);
        let mut any_v1 = false;
        for mount in mounts(info) {
            let mount_point = PathBuf::from(mount.point);
            match mount.fstype {
                "cgroup2" => v2 = Some(mount_point),
                "cgroup" => {
                    any_v1 = true;
                    for opt in mount.super_options.split(',') {
                        match opt {
                            "memory" => memory = Some(mount_point.clone()),
                            "pids" => pids = Some(mount_point.clone()),
                            "cpu" => cpu = Some(mount_point.clone()),
                            "cpuacct" => cpuacct = Some(mount_point.clone()),
                            "freezer" => freezer = Some(mount_point.clone()),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        match (any_v1, v2) {
            (false, Some(root)) => Layout::V2 { root },
            (true, unified) => Layout::Hybrid {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
                unified,
            },
            (false, None) => Layout::None,
        }
    }

    /// Creates the parent cgroups (and, on v2, enables the controllers sandboxes need), and checks
    /// that this process may create sandbox cgroups under them.
    fn prepare(&self) -> io::Result<()> {
        self.create_parents()?;
        for dir in self.parent_dirs() {
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK)
                .map_err(|e| io::Error::other(format!("{}: {e}", dir.display())))?;
        }
        Ok(())
    }

    fn create_parents(&self) -> io::Result<()> {
        match self {
            Layout::None => Err(io::Error::other("no cgroups")),
            Layout::V2 { root } => {
                let parent = root.join(PARENT);
                fs::create_dir_all(&parent)?;
                // Controllers must be enabled at every level down to the sandbox cgroups.
                let _ = write(&root.join("cgroup.subtree_control"), "+cpu +memory +pids");
                write(&parent.join("cgroup.subtree_control"), "+cpu +memory +pids")
            }
            Layout::Hybrid { memory, pids, .. } => {
                if memory.is_none() || pids.is_none() {
                    return Err(io::Error::other(
                        "the memory and pids controllers are required",
                    ));
                }
                for dir in self.parent_dirs() {
                    fs::create_dir_all(dir)?;
                }
                Ok(())
            }
        }
    }

    fn parent_dirs(&self) -> Vec<PathBuf> {
        match self {
            Layout::None => Vec::new(),
            Layout::V2 { root } => vec![root.join(PARENT)],
            Layout::Hybrid {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
                unified,
            } => [memory, pids, cpu, cpuacct, freezer, unified]
                .into_iter()
                .flatten()
                .map(|p| p.join(PARENT))
                .collect(),
        }
    }

    pub fn enforced(&self) -> bool {
        !matches!(self, Layout::None)
    }

    /// Default freeze method on this layout.
    pub fn freeze_method(&self) -> FreezeMethod {
        match self {
            Layout::Hybrid {
                unified: Some(u), ..
            } if u.join("cgroup.freeze").exists()
                || u.join(PARENT).join("cgroup.freeze").exists() =>
            {
                FreezeMethod::V2
            }
            Layout::Hybrid { .. } => FreezeMethod::V1,
            _ => FreezeMethod::V2,
        }
    }

    pub fn sandbox(&self, id: &str) -> Cgroups {
        self.sandbox_with(id, self.freeze_method())
    }

    pub fn sandbox_with(&self, id: &str, freeze: FreezeMethod) -> Cgroups {
        Cgroups {
            layout: self.clone(),
            id: id.to_string(),
            freeze,
        }
    }
}

/// The remount that turns on the kernel's `favordynmods` for the host's cgroup2 hierarchy.
///
/// Why: every sandbox start writes its launcher into the sandbox's `cgroup.procs`, and the
/// kernel makes that write wait for an RCU grace period (5–9 ms measured here during forks, most
/// of an agent's start) unless `favordynmods` is on: the option keeps the lock that write takes
/// in the mode where it never waits (since Linux 6.18, it takes a per-process lock instead); the
/// kernel's documented price is slightly dearer forks and exits host-wide. The lock is shared by
/// every hierarchy, so the cgroup2 mount's option also speeds up a hybrid host's v1 controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remount {
    pub target: PathBuf,
    /// The mount's own flags, kept: a remount sets them anew (nosuid, nodev, noexec, ro).
    pub flags: nix::mount::MsFlags,
    /// The hierarchy's options, kept, plus `favordynmods`: a cgroup2 remount applies the whole
    /// list, so leaving one out (`nsdelegate`, `memory_recursiveprot`) would turn it off.
    pub data: String,
}

/// The remount for the first cgroup2 mount in `info` (mountinfo), if it lacks `favordynmods`.
/// Pure, for tests.
pub fn favordynmods_remount(info: &str) -> Option<Remount> {
    use nix::mount::MsFlags;
    let MountLine {
        point: target,
        options: mount_options,
        super_options,
        ..
    } = mounts(info).find(|m| m.fstype == "cgroup2")?;
    // A mount point with an escaped character (`\040`) would need unescaping: left alone.
    if target.contains('\\') || super_options.split(',').any(|o| o == "favordynmods") {
        return None;
    }
    let mut flags = MsFlags::MS_REMOUNT;
    for option in mount_options.split(',') {
        flags |= match option {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            _ => MsFlags::empty(),
        };
    }
    let data: Vec<&str> = super_options
        .split(',')
        .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
        .chain(["favordynmods"])
        .collect();
    Some(Remount {
        target: PathBuf::from(target),
        flags,
        data: data.join(","),
    })
}

/// Turns on `favordynmods` for the host's cgroup2 hierarchy if it is off (root only; a kernel
/// without the option refuses it, and nothing changes). Returns the mount point changed.
pub fn favor_dynamic_moves() -> io::Result<Option<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    let Some(remount) = favordynmods_remount(&info) else {
        return Ok(None);
    };
    nix::mount::mount(
        None::<&str>,
        &remount.target,
        None::<&str>,
        remount.flags,
        Some(remount.data.as_str()),
    )
    .map_err(|e| io::Error::other(format!("remount {}: {e}", remount.target.display())))?;
    // Outside the host's cgroup namespace (a container) the remount succeeds and changes
    // nothing: only the mount table says whether the option is on.
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    if favordynmods_remount(&info).is_some() {
        return Err(io::Error::other(format!(
            "the kernel did not apply it to {} (not the host's cgroup namespace?)",
            remount.target.display()
        )));
    }
    Ok(Some(remount.target))
}

impl Cgroups {
    fn dir(&self, base: &Option<PathBuf>) -> Option<PathBuf> {
        base.as_ref().map(|b| b.join(PARENT).join(&self.id))
    }

    /// Every directory of this sandbox's cgroups.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.layout
            .parent_dirs()
            .into_iter()
            .map(|p| p.join(&self.id))
            .collect()
    }

    /// The `cgroup.procs` files a process writes itself into to join the sandbox.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Creates the cgroups and applies the limits. Idempotent.
    pub fn create(&self, limits: &Limits) -> io::Result<()> {
        for dir in self.dirs() {
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
            }
        }
        let period: u64 = 100_000;
        let quota = ((limits.vcpus * period as f64) as u64).max(1000);
        match &self.layout {
            Layout::None => {}
            Layout::V2 { root } => {
                let d = root.join(PARENT).join(&self.id);
                write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                let _ = write(&d.join("memory.swap.max"), "0");
                write(&d.join("pids.max"), &limits.max_pids.to_string())?;
                write(&d.join("cpu.max"), &format!("{quota} {period}"))?;
            }
            Layout::Hybrid {
                memory, pids, cpu, ..
            } => {
                if let Some(d) = self.dir(memory) {
                    write(
                        &d.join("memory.limit_in_bytes"),
                        &limits.memory_bytes.to_string(),
                    )?;
                    let memsw = d.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        let _ = write(&memsw, &limits.memory_bytes.to_string());
                    }
                    let _ = write(&d.join("memory.swappiness"), "0");
                }
                if let Some(d) = self.dir(pids) {
                    write(&d.join("pids.max"), &limits.max_pids.to_string())?;
                }
                if let Some(d) = self.dir(cpu) {
                    write(&d.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    fn v2_dir(&self) -> Option<PathBuf> {
        match &self.layout {
            Layout::V2 { root } => Some(root.join(PARENT).join(&self.id)),
            Layout::Hybrid { unified, .. } => self.dir(unified),
            Layout::None => None,
        }
    }

    fn freezer_dir(&self) -> Option<PathBuf> {
        match &self.layout {
            Layout::Hybrid { freezer, .. } => self.dir(freezer),
            _ => None,
        }
    }

    /// Freezes every process; returns once they are frozen.
    pub fn freeze(&self) -> io::Result<()> {
        self.set_frozen(true)
    }

    pub fn thaw(&self) -> io::Result<()> {
        self.set_frozen(false)
    }

    fn set_frozen(&self, frozen: bool) -> io::Result<()> {
        match (self.freeze, self.v2_dir(), self.freezer_dir()) {
            (FreezeMethod::V2, Some(d), _) if d.join("cgroup.freeze").exists() => {
                write(&d.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
                self.wait_until(|| {
                    read_keyed(&d.join("cgroup.events"), "frozen") == Some(u64::from(frozen))
                })
            }
            (_, _, Some(d)) => {
                let state = if frozen { "FROZEN" } else { "THAWED" };
                write(&d.join("freezer.state"), state)?;
                // v1 passes through FREEZING until every task has stopped.
                self.wait_until(|| {
                    fs::read_to_string(d.join("freezer.state")).is_ok_and(|s| s.trim() == state)
                })
            }
            _ => Err(io::Error::other(
                "pausing needs a cgroup freezer, and this engine has no cgroups",
            )),
        }
    }

    pub fn is_frozen(&self) -> bool {
        match (self.freeze, self.v2_dir(), self.freezer_dir()) {
            (FreezeMethod::V2, Some(d), _) => read_u64(&d.join("cgroup.freeze")) == Some(1),
            (_, _, Some(d)) => {
                fs::read_to_string(d.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
            }
            _ => false,
        }
    }

    fn wait_until(&self, done: impl Fn() -> bool) -> io::Result<()> {
        let start = Instant::now();
        while !done() {
            if start.elapsed() > Duration::from_secs(5) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the cgroup freezer did not settle within 5 s",
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }

    /// Pids in the sandbox (as seen from the host).
    pub fn pids(&self) -> Vec<i32> {
        let Some(dir) = self.dirs().into_iter().next() else {
            return Vec::new();
        };
        fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills every process in the sandbox and waits until none is left.
    pub fn kill_all(&self) -> io::Result<()> {
        if let Some(d) = self.v2_dir()
            && d.join("cgroup.kill").exists()
        {
            write(&d.join("cgroup.kill"), "1")?;
        } else {
            // No cgroup.kill: freeze first so nothing can fork while we kill, then thaw so the
            // SIGKILLs are delivered.
            let _ = self.freeze();
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::SIGKILL,
                );
            }
            let _ = self.thaw();
        }
        let start = Instant::now();
        while !self.pids().is_empty() {
            if start.elapsed() > Duration::from_secs(5) {
                return Err(io::Error::other("processes survived a cgroup kill for 5 s"));
            }
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Removes the (empty) cgroups.
    pub fn remove(&self) -> io::Result<()> {
        let _ = self.thaw();
        for dir in self.dirs() {
            match fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
            }
        }
        Ok(())
    }

    /// Resource use read from the cgroups (zero where a controller is missing).
    /// OOM kills so far: [`Self::usage`]'s `oom_kills` alone, one file read (every command reads
    /// it before and after it runs).
    pub fn oom_kills(&self) -> u64 {
        match &self.layout {
            Layout::None => 0,
            Layout::V2 { .. } => self
                .v2_dir()
                .and_then(|d| read_keyed(&d.join("memory.events"), "oom_kill"))
                .unwrap_or(0),
            Layout::Hybrid { memory, .. } => self
                .dir(memory)
                .and_then(|d| read_keyed(&d.join("memory.oom_control"), "oom_kill"))
                .unwrap_or(0),
        }
    }

    pub fn usage(&self) -> Usage {
        let mut s = Usage::default();
        match &self.layout {
            Layout::None => {}
            Layout::V2 { .. } => {
                if let Some(d) = self.v2_dir() {
                    s.cpu_seconds =
                        read_keyed(&d.join("cpu.stat"), "usage_usec").unwrap_or(0) as f64 / 1e6;
                    s.memory_bytes = read_u64(&d.join("memory.current")).unwrap_or(0);
                    s.memory_peak_bytes =
                        read_u64(&d.join("memory.peak")).unwrap_or(s.memory_bytes);
                    s.memory_limit_bytes = read_u64(&d.join("memory.max")).unwrap_or(0);
                    s.pids = read_u64(&d.join("pids.current")).unwrap_or(0);
                    s.pids_limit = read_u64(&d.join("pids.max")).unwrap_or(0);
                    s.oom_kills = read_keyed(&d.join("memory.events"), "oom_kill").unwrap_or(0);
                }
            }
            Layout::Hybrid {
                memory,
                pids,
                cpuacct,
                ..
            } => {
                if let Some(d) = self.dir(cpuacct) {
                    s.cpu_seconds = read_u64(&d.join("cpuacct.usage")).unwrap_or(0) as f64 / 1e9;
                } else if let Some(d) = self.v2_dir() {
                    s.cpu_seconds =
                        read_keyed(&d.join("cpu.stat"), "usage_usec").unwrap_or(0) as f64 / 1e6;
                }
                if let Some(d) = self.dir(memory) {
                    s.memory_bytes = read_u64(&d.join("memory.usage_in_bytes")).unwrap_or(0);
                    s.memory_peak_bytes =
                        read_u64(&d.join("memory.max_usage_in_bytes")).unwrap_or(0);
                    s.memory_limit_bytes = read_u64(&d.join("memory.limit_in_bytes")).unwrap_or(0);
                    s.oom_kills =
                        read_keyed(&d.join("memory.oom_control"), "oom_kill").unwrap_or(0);
                }
                if let Some(d) = self.dir(pids) {
                    s.pids = read_u64(&d.join("pids.current")).unwrap_or(0);
                    s.pids_limit = read_u64(&d.join("pids.max")).unwrap_or(0);
                }
            }
        }
        s
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
35 30 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_hybrid_layout() {
        let layout = Layout::parse_mountinfo(HYBRID);
        let Layout::Hybrid {
            memory,
            unified,
            cpuacct,
            ..
        } = &layout
        else {
            panic!("expected hybrid, got {layout:?}");
        };
        assert_eq!(memory.as_deref(), Some(Path::new("/sys/fs/cgroup/memory")));
        assert_eq!(
            cpuacct.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        assert_eq!(
            unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        let cg = layout.sandbox("sbx_x");
        assert!(cg.procs_files().contains(&PathBuf::from(
            "/sys/fs/cgroup/memory/sandbox-mcp/sbx_x/cgroup.procs"
        )));
    }

    #[test]
    fn parses_pure_v2() {
        let info = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            Layout::parse_mountinfo(info),
            Layout::V2 {
                root: PathBuf::from("/sys/fs/cgroup")
            }
        );
        assert_eq!(Layout::parse_mountinfo(""), Layout::None);
    }

    #[test]
    fn favordynmods_remount_keeps_the_mounts_own_flags_and_options() {
        // This host's hybrid layout: nothing but `rw` to keep.
        let r = favordynmods_remount(HYBRID).unwrap();
        assert_eq!(r.target, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(r.flags, nix::mount::MsFlags::MS_REMOUNT);
        assert_eq!(r.data, "favordynmods");
        // systemd's pure v2 mount: its flags and both hierarchy options survive the remount.
        let systemd = "25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let r = favordynmods_remount(systemd).unwrap();
        use nix::mount::MsFlags as F;
        assert_eq!(
            r.flags,
            F::MS_REMOUNT | F::MS_NOSUID | F::MS_NODEV | F::MS_NOEXEC
        );
        assert_eq!(r.data, "nsdelegate,memory_recursiveprot,favordynmods");
        // Already on, no cgroup2 mount, or a mount point that would need unescaping: nothing.
        let on = systemd.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods");
        assert_eq!(favordynmods_remount(&on), None);
        assert_eq!(
            favordynmods_remount("31 23 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
            None
        );
        let escaped = "25 22 0:22 / /cg\\040x rw - cgroup2 cgroup2 rw\n";
        assert_eq!(favordynmods_remount(escaped), None);
    }
}
