//! The engine side of the namespaces driver: storage layout, cgroups, launching, and reaching the
//! agent. See [`super::launcher`] for what happens inside the new process.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt;

use super::cgroups::{Cgroups, Layout, Limits};
use super::disk::{self, DiskLimits, Store};
use super::launcher::Report;
use super::plan::{self, PlanInput};
use crate::engine::driver::{AgentConn, Driver, DriverError, Liveness, StartSpec, Usage};

/// How long a launch may take before it is abandoned.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);

pub struct NamespacesDriver {
    sandboxes_dir: PathBuf,
    layout: Layout,
    /// Where sandbox directories live: btrfs subvolumes with disk limits, or plain directories.
    store: Store,
    /// The binary to re-execute as the launcher (this one, normally).
    exe: PathBuf,
    uid: u32,
    gid: u32,
}

fn io_err(what: &str, e: impl std::fmt::Display) -> DriverError {
    DriverError::Io(format!("{what}: {e}"))
}

impl NamespacesDriver {
    pub fn new(
        sandboxes_dir: PathBuf,
        exe: PathBuf,
        disk_limits: DiskLimits,
    ) -> Result<Self, DriverError> {
        let path = sandboxes_dir.to_string_lossy();
        // Overlay mount options are comma- and colon-separated; such paths cannot be expressed.
        if path.contains([',', ':', '\n']) {
            return Err(DriverError::Unsupported(format!(
                "the data directory path {path} contains ',' or ':'; choose another SANDBOX_MCP_DATA_DIR"
            )));
        }
        // A unix socket path must fit in 108 bytes: <dir>/sbx_<26>/agent.sock.
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
            .map_err(|e| io_err("create sandboxes directory", e))?;
        let _ = fs::set_permissions(&sandboxes_dir, fs::Permissions::from_mode(0o711));
        let store = disk::open(&sandboxes_dir, disk_limits)
            .map_err(|e| io_err("set up the sandbox store", e))?;
        if let Store::Plain(why) = &store {
            tracing::warn!("sandbox disk use is reported but not enforced: {why}");
        }
        let layout = Layout::detect();
        if !layout.enforced() {
            tracing::warn!(
                "no usable cgroups: sandboxes run without memory, CPU and process limits, and cannot be paused"
            );
        }
        Ok(Self {
            sandboxes_dir,
            layout,
            store,
            exe,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        })
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.sandboxes_dir.join(id)
    }

    fn cgroups(&self, id: &str) -> Cgroups {
        self.layout.sandbox(id)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Creates the sandbox's directories (idempotent; a restart reuses them).
    fn prepare_dirs(&self, spec: &StartSpec) -> io::Result<()> {
        let dir = self.dir(&spec.id);
        disk::create_dir(
            &self.store,
            &self.sandboxes_dir,
            &spec.id,
            spec.shape.disk_mb.saturating_mul(1024 * 1024),
        )?;
        let owner = (self.uid == 0).then(|| plan::uid_base(spec.uid_slot));
        let mut targets = vec!["/".to_string()];
        targets.extend(
            spec.template
                .host_dirs
                .iter()
                .map(|d| d.display().to_string()),
        );
        for target in &targets {
            let staging = plan::staging_dir(&dir, target);
            if !staging.exists() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&staging)?;
            }
            for path in [plan::upper_dir(&dir, target), plan::work_dir(&dir, target)] {
                if !path.exists() {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o755)
                        .create(&path)?;
                    if let Some(uid) = owner {
                        // The overlay is mounted by the sandbox's root (this host id), which
                        // must own its upper and work directories.
                        std::os::unix::fs::chown(&path, Some(uid), Some(uid))?;
                    }
                }
            }
        }
        // The upper root becomes the sandbox's `/`: keep the template's mode.
        let _ = fs::set_permissions(
            plan::upper_dir(&dir, "/"),
            fs::Permissions::from_mode(0o755),
        );
        let rootfs = dir.join("rootfs");
        if !rootfs.exists() {
            fs::DirBuilder::new().mode(0o755).create(&rootfs)?;
        }
        Ok(())
    }

    async fn launch(&self, spec: &StartSpec) -> Result<i32, DriverError> {
        let dir = self.dir(&spec.id);
        let cg = self.cgroups(&spec.id);
        if self.layout.enforced() {
            cg.create(&Limits {
                memory_bytes: spec.shape.memory_mb * 1024 * 1024,
                max_pids: spec.shape.max_pids,
                vcpus: spec.shape.vcpus,
            })
            .map_err(|e| {
                DriverError::Launch(format!("cannot create the sandbox's cgroups: {e}"))
            })?;
        }
        let plan = plan::build(&PlanInput {
            sandbox_id: &spec.id,
            sandbox_dir: &dir,
            template_rootfs: &spec.template.rootfs,
            host_dirs: &spec.template.host_dirs,
            uid_slot: spec.uid_slot,
            host_uid: self.uid,
            host_gid: self.gid,
            cgroup_procs: if self.layout.enforced() {
                cg.procs_files()
            } else {
                Vec::new()
            },
            env: &spec.env,
            memory_bytes: spec.shape.memory_mb * 1024 * 1024,
        });
        let input = serde_json::to_vec(&plan).map_err(|e| io_err("encode launch plan", e))?;
        let mut child = tokio::process::Command::new(&self.exe)
            .arg("__launch")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                DriverError::Launch(format!(
                    "cannot run the launcher {}: {e}",
                    self.exe.display()
                ))
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(&input)
                .await
                .map_err(|e| DriverError::Launch(format!("cannot send the launch plan: {e}")))?;
        }
        let output = tokio::time::timeout(LAUNCH_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| DriverError::Launch("the launcher did not finish within 30 s".into()))?
            .map_err(|e| DriverError::Launch(format!("launcher: {e}")))?;
        let report: Report = serde_json::from_slice(&output.stdout).map_err(|_| {
            DriverError::Launch(format!(
                "the launcher failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        })?;
        match (report.ok, report.pid) {
            (true, Some(pid)) => {
                let _ = fs::write(
                    dir.join("agent.pid"),
                    format!("{pid} {}", start_time(pid).unwrap_or(0)),
                );
                Ok(pid)
            }
            _ => Err(DriverError::Launch(format!(
                "cannot start the sandbox: {}",
                report
                    .error
                    .unwrap_or_else(|| "unknown launcher failure".into())
            ))),
        }
    }

    /// The agent's host pid, if it is still the process we launched.
    fn agent_pid(&self, id: &str) -> Option<i32> {
        let text = fs::read_to_string(self.dir(id).join("agent.pid")).ok()?;
        let mut parts = text.split_whitespace();
        let pid: i32 = parts.next()?.parse().ok()?;
        let started: u64 = parts.next()?.parse().ok()?;
        (start_time(pid) == Some(started)).then_some(pid)
    }
}

/// Start time of a process (clock ticks since boot), to tell it from a later one with its pid.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may itself contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Driver for NamespacesDriver {
    fn name(&self) -> &'static str {
        "namespaces"
    }

    fn limits_enforced(&self) -> bool {
        self.layout.enforced()
    }

    fn disk_limits_enforced(&self) -> bool {
        self.store.enforced()
    }

    fn start<'a>(&'a self, spec: &'a StartSpec) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            self.prepare_dirs(spec).map_err(|e| {
                DriverError::Launch(format!("cannot create the sandbox's directories: {e}"))
            })?;
            self.launch(spec).await.map(|_| ())
        })
    }

    fn connect<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<AgentConn, DriverError>> {
        Box::pin(async move {
            let path = self.dir(id).join("agent.sock");
            let stream = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::net::UnixStream::connect(&path),
            )
            .await
            .map_err(|_| {
                DriverError::Agent(
                    "the sandbox's agent did not accept a connection within 5 s".into(),
                )
            })?
            .map_err(|e| DriverError::Agent(format!("cannot reach the sandbox's agent: {e}")))?;
            Ok(Box::new(stream) as AgentConn)
        })
    }

    fn liveness<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Liveness> {
        Box::pin(async move {
            if self.layout.enforced()
                && self.cgroups(id).is_frozen()
                && !self.cgroups(id).pids().is_empty()
            {
                return Liveness::Frozen;
            }
            let path = self.dir(id).join("agent.sock");
            match tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::UnixStream::connect(&path),
            )
            .await
            {
                Ok(Ok(_)) => Liveness::Running,
                _ => Liveness::Stopped,
            }
        })
    }

    fn freeze(&self, id: &str) -> Result<(), DriverError> {
        if !self.layout.enforced() {
            return Err(DriverError::Unsupported(
                "pausing needs cgroups, which this engine cannot use (run it as root, or with a delegated cgroup)".into(),
            ));
        }
        self.cgroups(id).freeze().map_err(|e| io_err("freeze", e))
    }

    fn thaw(&self, id: &str) -> Result<(), DriverError> {
        if !self.layout.enforced() {
            return Ok(());
        }
        self.cgroups(id).thaw().map_err(|e| io_err("thaw", e))
    }

    fn stop(&self, id: &str) -> Result<(), DriverError> {
        if self.layout.enforced() {
            self.cgroups(id)
                .kill_all()
                .map_err(|e| io_err("kill processes", e))?;
        }
        // Killing the sandbox's init takes every process in its pid namespace with it.
        if let Some(pid) = self.agent_pid(id) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        let _ = fs::remove_file(self.dir(id).join("agent.pid"));
        Ok(())
    }

    fn destroy(&self, id: &str) -> Result<(), DriverError> {
        self.stop(id)?;
        if self.layout.enforced() {
            // The cgroups empty out asynchronously after the last process dies.
            let cg = self.cgroups(id);
            let mut last = Ok(());
            for _ in 0..100 {
                last = cg.remove();
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            last.map_err(|e| io_err("remove cgroups", e))?;
        }
        disk::remove_dir(&self.store, &self.sandboxes_dir, id)
            .map_err(|e| io_err("delete the sandbox's files", e))
    }

    fn usage(&self, id: &str) -> Usage {
        let s = self.cgroups(id).stats();
        Usage {
            cpu_seconds: s.cpu_seconds,
            memory_bytes: s.memory_bytes,
            memory_peak_bytes: s.memory_peak_bytes,
            memory_limit_bytes: s.memory_limit_bytes,
            pids: s.pids,
            pids_limit: s.pids_limit,
            oom_kills: s.oom_kills,
        }
    }

    fn disk_bytes(&self, id: &str) -> u64 {
        disk_usage(&self.dir(id).join("upper"))
    }
}

/// Bytes allocated under `dir` (st_blocks, so sparse files count what they use), without
/// following symlinks. Stops counting after a million entries.
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 1_000_000 {
                return total;
            }
            let Ok(m) = entry.path().symlink_metadata() else {
                continue;
            };
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}
