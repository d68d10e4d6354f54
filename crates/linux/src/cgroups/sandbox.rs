//! One sandbox's cgroups: made under [`PARENT`] with its limits (memory without swap, pids, CPU
//! quota), frozen and thawed (v2 `cgroup.freeze` first, the v1 freezer else), killed
//! (`cgroup.kill`, else every process while frozen, so nothing forks away), removed, and read for
//! usage and OOM kills.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox_mcp_model::driver::Usage;

use super::{Cgroups, FreezeMethod, Layout, Limits, OpenDir, PARENT, read_keyed, read_u64, write};

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
        self.read_usage(true)
    }

    /// What `sandbox_info` shows, CPU time, memory now and processes: three files, where
    /// [`Self::usage`] opens ten on a hybrid host (limits, peak and OOM kills too).
    pub fn usage_brief(&self) -> Usage {
        self.read_usage(false)
    }

    fn read_usage(&self, full: bool) -> Usage {
        let mut s = Usage::default();
        match &self.layout {
            Layout::None => {}
            Layout::V2 { .. } => {
                if let Some(d) = self.v2_dir().and_then(|d| OpenDir::open(&d)) {
                    s.cpu_seconds = d.keyed("cpu.stat", "usage_usec").unwrap_or(0) as f64 / 1e6;
                    s.memory_bytes = d.u64("memory.current").unwrap_or(0);
                    s.pids = d.u64("pids.current").unwrap_or(0);
                    if full {
                        s.memory_peak_bytes = d.u64("memory.peak").unwrap_or(s.memory_bytes);
                        s.memory_limit_bytes = d.u64("memory.max").unwrap_or(0);
                        s.pids_limit = d.u64("pids.max").unwrap_or(0);
                        s.oom_kills = d.keyed("memory.events", "oom_kill").unwrap_or(0);
                    }
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
                if !full {
                    // One file each: opening the directory first would be a second open.
                    let one = |dir: &Option<PathBuf>, name: &str| {
                        self.dir(dir).and_then(|d| read_u64(&d.join(name)))
                    };
                    s.memory_bytes = one(memory, "memory.usage_in_bytes").unwrap_or(0);
                    s.pids = one(pids, "pids.current").unwrap_or(0);
                    return s;
                }
                if let Some(d) = self.dir(memory).and_then(|d| OpenDir::open(&d)) {
                    s.memory_bytes = d.u64("memory.usage_in_bytes").unwrap_or(0);
                    s.memory_peak_bytes = d.u64("memory.max_usage_in_bytes").unwrap_or(0);
                    s.memory_limit_bytes = d.u64("memory.limit_in_bytes").unwrap_or(0);
                    s.oom_kills = d.keyed("memory.oom_control", "oom_kill").unwrap_or(0);
                }
                if let Some(d) = self.dir(pids).and_then(|d| OpenDir::open(&d)) {
                    s.pids = d.u64("pids.current").unwrap_or(0);
                    s.pids_limit = d.u64("pids.max").unwrap_or(0);
                }
            }
        }
        s
    }
}
