//! Launching a sandbox: its directories, the launcher process and its report, and what the
//! agent hands over afterwards (descriptors, its pid).
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::time::Duration;

use sandbox_mcp_model::driver::{DriverError, EgressSockets, FsRef, StartSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::NamespacesDriver;
use crate::cgroups::Limits;
use crate::disk;
use crate::launcher::Report;
use crate::plan::{self, PlanInput};

/// How long a launch may take before it is abandoned.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes read of the launcher's report and of its stderr (it relays the agent's words).
const LAUNCHER_OUTPUT: u64 = 64 * 1024;

/// Where the engine keeps what it writes for each sandbox when starting it (the agent's socket
/// and pid, the boot id): in the data dir, beside the sandboxes' store and outside their disk
/// quotas, so that a sandbox that filled its disk still starts; the engine's alone (0700).
pub(super) const AGENTS_DIR: &str = "agents";

impl NamespacesDriver {
    /// The engine's file `name` of sandbox `id`, in [`AGENTS_DIR`].
    pub(super) fn agent_file(&self, id: &str, name: &str) -> std::path::PathBuf {
        let base = self.sandboxes_dir.parent().unwrap_or(&self.sandboxes_dir);
        base.join(AGENTS_DIR).join(format!("{id}.{name}"))
    }

    /// The agent's socket. One started by an engine from before [`AGENTS_DIR`] listens in the
    /// sandbox's directory, and is reached there until it is started again.
    pub(super) fn agent_socket(&self, id: &str) -> std::path::PathBuf {
        let path = self.agent_file(id, "sock");
        let old = self.dir(id).join("agent.sock");
        if !path.exists() && old.exists() {
            old
        } else {
            path
        }
    }

    fn boot_id_file(&self, id: &str) -> std::path::PathBuf {
        self.agent_file(id, "boot_id")
    }

    /// The sandbox's boot id for this start: the last one's when `same_boot` (and it is known),
    /// else a new random one, which is kept for next time.
    fn boot_id(&self, id: &str, same_boot: bool) -> io::Result<String> {
        let file = self.boot_id_file(id);
        if same_boot
            && let Ok(kept) = fs::read_to_string(&file)
            && kept.len() == 37
        {
            return Ok(kept);
        }
        let new = fs::read_to_string("/proc/sys/kernel/random/uuid")?;
        fs::write(&file, &new)?;
        Ok(new)
    }

    /// Forgets a destroyed sandbox's files in [`AGENTS_DIR`].
    pub(super) fn drop_agent_files(&self, id: &str) {
        for name in ["sock", "pid", "boot_id"] {
            let _ = fs::remove_file(self.agent_file(id, name));
        }
    }

    /// Creates the sandbox's directories (idempotent; a restart reuses them).
    pub(super) fn prepare_dirs(&self, spec: &StartSpec) -> io::Result<()> {
        let dir = self.dir(&spec.id);
        disk::create_dir(
            &self.store,
            &self.sandboxes_dir,
            &spec.id,
            spec.shape.disk_mb.saturating_mul(1024 * 1024),
        )?;
        let owner = self.disk_ids(&FsRef {
            name: spec.id.clone(),
            slot: Some(spec.uid_slot),
        });
        let stacked = self.stack_of(&spec.id)?;
        for mount in &spec.template.mounts {
            let target = &mount.target;
            for layer in &stacked {
                // A layer holds a tree for each overlay its sandbox had; one added to the
                // template since is empty in it.
                let tree = self.layer_dir(layer).join(plan::layer_name(target));
                if !tree.exists() {
                    fs::DirBuilder::new().mode(0o755).create(&tree)?;
                }
            }
            for index in 0..stacked.len() + mount.lowers.len() {
                let staging = plan::staging_dir(&dir, target, index);
                if !staging.exists() {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o755)
                        .create(&staging)?;
                }
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
        for index in 0..spec.volumes.len() {
            let staging = plan::volume_staging(&dir, index);
            if !staging.exists() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&staging)?;
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

    pub(super) async fn launch(&self, spec: &StartSpec) -> Result<i32, DriverError> {
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
        let volumes = spec
            .volumes
            .iter()
            .map(|v| {
                let source = self.volume_dir(&v.key);
                if source.is_dir() {
                    Ok((source, v.target.clone(), v.read_only))
                } else {
                    Err(DriverError::Launch(format!(
                        "the volume mounted at {} no longer exists",
                        v.target
                    )))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let stacked: Vec<std::path::PathBuf> = self
            .stack_of(&spec.id)
            .map_err(DriverError::io("read the sandbox's layers"))?
            .iter()
            .map(|l| self.layer_dir(l))
            .collect();
        let boot_id = self
            .boot_id(&spec.id, spec.same_boot)
            .map_err(DriverError::io("choose the sandbox's boot id"))?;
        let plan = plan::build(&PlanInput {
            sandbox_id: &spec.id,
            sandbox_dir: &dir,
            mounts: &spec.template.mounts,
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
            pty_max: self.ptys_of(spec.uid_slot),
            workdir: spec.workdir.as_deref(),
            user: spec.user,
            disk_ids: self.disk_ids(&FsRef {
                name: spec.id.clone(),
                slot: Some(spec.uid_slot),
            }),
            volumes: &volumes,
            stacked: &stacked,
            boot_id: &boot_id,
            socket: &self.agent_file(&spec.id, "sock"),
        });
        let input = serde_json::to_vec(&plan)
            .map_err(|e| DriverError::io("encode the launch plan")(e.into()))?;
        let mut launcher = tokio::process::Command::new(&self.exe);
        launcher
            .arg("__launch")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: `restore` makes system calls only (no allocation, no lock), as is required
        // between fork and exec in a multi-threaded process.
        unsafe {
            launcher.pre_exec(sandbox_mcp_sys::budget::restore);
        }
        let mut child = launcher.spawn().map_err(|e| {
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
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let finished = async {
            // Read no more than a report can hold: the launcher relays words from inside the
            // sandbox, and its output must never grow the engine.
            let (out, err) = tokio::join!(read_bounded(stdout), read_bounded(stderr));
            (child.wait().await, out, err)
        };
        let (status, stdout, stderr) = tokio::time::timeout(LAUNCH_TIMEOUT, finished)
            .await
            .map_err(|_| DriverError::Launch("the launcher did not finish within 30 s".into()))?;
        let status = status.map_err(|e| DriverError::Launch(format!("launcher: {e}")))?;
        let report: Report = serde_json::from_slice(&stdout).map_err(|_| {
            DriverError::Launch(format!(
                "the launcher failed ({status}): {}",
                sandbox_mcp_model::clip(String::from_utf8_lossy(&stderr).trim())
            ))
        })?;
        match (report.ok, report.pid) {
            (true, Some(pid)) => {
                let _ = fs::write(
                    self.agent_file(&spec.id, "pid"),
                    format!("{pid} {}", start_time(pid).unwrap_or(0)),
                );
                Ok(pid)
            }
            _ => Err(DriverError::Launch(format!(
                "cannot start the sandbox: {}",
                sandbox_mcp_model::clip(
                    &report
                        .error
                        .unwrap_or_else(|| "unknown launcher failure".into())
                )
            ))),
        }
    }

    /// Connects to the sandbox's agent and sends `call`: the connection, and the most of an
    /// answer to read.
    async fn send<C>(&self, id: &str, call: C) -> io::Result<(tokio::net::UnixStream, usize)>
    where
        C: sandbox_mcp_protocol::Call,
    {
        let limit = call.reply_limit();
        let mut conn = tokio::net::UnixStream::connect(self.agent_socket(id)).await?;
        let request: sandbox_mcp_protocol::Request = call.into();
        sandbox_mcp_protocol::write_frame(&mut conn, &request).await?;
        Ok((conn, limit))
    }

    /// Sends `call` to the sandbox's agent and reads its reply (an agent error as an `Other`
    /// error with its message).
    pub(super) async fn ask<C>(&self, id: &str, call: C) -> io::Result<C::Reply>
    where
        C: sandbox_mcp_protocol::Call,
    {
        let (mut conn, limit) = self.send(id, call).await?;
        read_reply::<C::Reply>(&mut conn, limit).await
    }

    /// Sends `call` to the sandbox's agent and takes the descriptors it passes (one byte with
    /// SCM_RIGHTS, ahead of its reply frame): how an unprivileged engine gets sockets made in a
    /// namespace it cannot enter.
    pub(super) async fn ask_for_fds<C>(
        &self,
        id: &str,
        call: C,
    ) -> io::Result<(Vec<OwnedFd>, C::Reply)>
    where
        C: sandbox_mcp_protocol::Call,
    {
        let (conn, limit) = self.send(id, call).await?;
        let fds = loop {
            conn.readable().await?;
            let got = conn.try_io(tokio::io::Interest::READABLE, || {
                let mut byte = [0u8; 1];
                let mut iov = [io::IoSliceMut::new(&mut byte)];
                let mut space = nix::cmsg_space!([std::os::fd::RawFd; 8]);
                let msg = nix::sys::socket::recvmsg::<()>(
                    conn.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map_err(io::Error::from)?;
                let mut got = Vec::new();
                for cmsg in msg.cmsgs().map_err(io::Error::from)? {
                    if let nix::sys::socket::ControlMessageOwned::ScmRights(raw) = cmsg {
                        // SAFETY: the kernel just installed these descriptors for us.
                        got.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                Ok((msg.bytes, got))
            });
            match got {
                Ok((0, _)) => return Err(io::Error::other("the agent hung up")),
                Ok((_, got)) => break got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        let mut conn = conn;
        Ok((fds, read_reply::<C::Reply>(&mut conn, limit).await?))
    }

    /// Unprivileged: the sockets the agent made in the sandbox's namespace (which the sandbox's
    /// user namespace owns, so the engine cannot enter it).
    pub(super) async fn handed_egress_sockets(
        &self,
        id: &str,
    ) -> Result<Option<EgressSockets>, DriverError> {
        use sandbox_mcp_protocol::HandOverEgress;
        let (fds, reply) = tokio::time::timeout(
            Duration::from_secs(5),
            self.ask_for_fds(id, HandOverEgress {}),
        )
        .await
        .map_err(|_| {
            DriverError::Agent("the agent did not hand over its egress sockets within 5 s".into())
        })?
        .map_err(|e| {
            DriverError::Agent(format!("cannot get the egress sockets from the agent: {e}"))
        })?;
        if let Some(why) = reply.why_not {
            tracing::warn!(sandbox = %id, "the sandbox has loopback only: {why}");
            return Ok(None);
        }
        let mut fds = fds.into_iter();
        let (Some(tcp), Some(dns), None) = (fds.next(), fds.next(), fds.next()) else {
            return Err(DriverError::Agent(
                "the agent handed over the wrong descriptors".into(),
            ));
        };
        let (tcp, dns) = crate::netns::check_handed_sockets(tcp, dns)
            .map_err(DriverError::io("check the agent's egress sockets"))?;
        Ok(Some(EgressSockets {
            tcp,
            dns,
            netns: None,
        }))
    }

    /// The agent's host pid, if it is still the process we launched.
    pub(super) fn agent_pid(&self, id: &str) -> Option<i32> {
        let text = fs::read_to_string(self.agent_file(id, "pid"))
            .or_else(|_| fs::read_to_string(self.dir(id).join("agent.pid")))
            .ok()?;
        let mut parts = text.split_whitespace();
        let pid: i32 = parts.next()?.parse().ok()?;
        let started: u64 = parts.next()?.parse().ok()?;
        (start_time(pid) == Some(started)).then_some(pid)
    }
}

/// The agent's reply frame to a request: its answer, or its error as an `Other` error.
async fn read_reply<R: serde::de::DeserializeOwned>(
    conn: &mut tokio::net::UnixStream,
    limit: usize,
) -> io::Result<R> {
    use sandbox_mcp_protocol::{Frame, read_frame_limited};
    match read_frame_limited::<_, Frame<R>>(conn, limit).await? {
        Some(Frame::Reply(reply)) => Ok(reply),
        Some(Frame::Error(e)) => Err(io::Error::other(e.message)),
        _ => Err(io::Error::other("the agent did not answer as it should")),
    }
}

/// Reads a pipe to its end, keeping at most [`LAUNCHER_OUTPUT`] bytes (the rest is discarded, so
/// the writer never blocks).
async fn read_bounded(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = (LAUNCHER_OUTPUT as usize).saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// Start time of a process (clock ticks since boot), to tell it from a later one with its pid.
fn start_time(pid: i32) -> Option<u64> {
    crate::procs::stat_field(pid, 19)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn launcher_output_is_read_only_up_to_the_bound() {
        let mut child = tokio::process::Command::new("head")
            .args(["-c", "100000000", "/dev/zero"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let kept = read_bounded(child.stdout.take()).await;
        assert_eq!(kept.len() as u64, LAUNCHER_OUTPUT);
        assert!(
            child.wait().await.unwrap().success(),
            "the writer was drained, not stalled"
        );
    }
}
