//! The sandbox launcher: the outside half of building a sandbox. Security-critical; keep it small.
//!
//! The engine (a multi-threaded tokio process) never forks into a sandbox itself. It re-executes
//! this binary as `sandbox-mcp __launch`, a fresh single-threaded process, and passes the
//! [`LaunchPlan`] on stdin. This process then:
//!
//! 1. joins the sandbox's cgroups, so everything it creates is limited and accounted;
//! 2. binds the agent's listening socket on the host (the engine connects to it; the sandbox never
//!    sees the path, the agent just inherits the descriptor);
//! 3. as root, takes the agent's own host id (outside the range mapped into the sandbox) as its
//!    effective id for one call, and forks the sandbox's init with new user, mount, pid, net,
//!    ipc, uts and cgroup namespaces (as root, the network namespace is made and configured
//!    first, under the host's user namespace: [`netns`]): the user namespace is then *owned* by
//!    that id, so the kernel
//!    charges the sandbox's per-user budgets to it rather than to root, and the init runs as an id
//!    no capability inside the sandbox applies to;
//! 4. from outside, writes the child's uid/gid maps (an unprivileged host range, never 0→0) and,
//!    as root, attaches id-mapped read-only copies of the lower layers inside the child's mount
//!    namespace (the kernel lets only a namespace's owner stack overlays on its mounts, and only
//!    real root may create id-mapped mounts, so the parent builds them and hands them over);
//! 5. waits for the agent to report `ready`, reports the child's pid to the engine and exits.
//!
//! The child execs the agent at once, while the host's root is still its root: the dynamic loader
//! and every library the agent uses are mapped from the host before the sandbox's filesystem
//! exists, so nothing the sandbox can write (its `/usr`, its `/etc/ld.so.preload`) is ever loaded
//! into the agent, on the first start or on a restart. The agent then builds the sandbox from the
//! inside ([`super::inside`]) and serves. Its environment is empty: the sandbox's variables travel
//! in the plan, so none of them (`LD_PRELOAD`…) can reach the host's loader.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, socketpair};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::Serialize;

use super::netns;
use super::plan::{IdMap, LaunchPlan};
use super::step::{BuildError, ctx};
use sandbox_mcp_sys::syscalls as sys;

/// The agent's listening socket is always this descriptor in the agent.
pub const AGENT_LISTEN_FD: RawFd = 3;
/// Where the agent reports `ready` (or why it failed) once it accepts connections, then closes.
pub const AGENT_STATUS_FD: RawFd = 4;
/// The launch plan (a memfd) the agent builds the sandbox from.
pub const AGENT_PLAN_FD: RawFd = 5;
/// The sandbox's directory on the host, opened by the launcher: the agent may be unable to
/// reach it by path (a data dir under a 0700 home, say).
pub const AGENT_DIR_FD: RawFd = 6;

/// Longest launch plan accepted (environment variables make up most of it).
pub const MAX_PLAN: u64 = 32 * 1024 * 1024;
/// Most bytes of the agent's start-up report read: enough for any error, never a flood.
pub const MAX_STATUS: u64 = 4096;

/// What the launcher prints on stdout for the engine.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Report {
    pub ok: bool,
    pub pid: Option<i32>,
    pub error: Option<String>,
}

/// Entry point of `sandbox-mcp __launch`. Never returns.
pub fn main() -> ! {
    let report = match launch() {
        Ok(pid) => Report {
            ok: true,
            pid: Some(pid),
            error: None,
        },
        Err(e) => Report {
            ok: false,
            pid: None,
            error: Some(e.to_string()),
        },
    };
    let ok = report.ok;
    let mut out = io::stdout();
    let _ = serde_json::to_writer(&mut out, &report);
    let _ = out.flush();
    std::process::exit(if ok { 0 } else { 1 });
}

fn launch() -> Result<i32, BuildError> {
    let mut input = Vec::new();
    ctx(
        io::stdin().take(MAX_PLAN + 1).read_to_end(&mut input),
        "read plan",
    )?;
    if input.len() as u64 > MAX_PLAN {
        return Err(BuildError::Refused(format!(
            "the launch plan is over {MAX_PLAN} bytes"
        )));
    }
    let plan: LaunchPlan = ctx(serde_json::from_slice(&input), "parse plan")?;

    // 1. Join the cgroups first: the child is created inside them.
    let me = std::process::id().to_string();
    for procs in &plan.cgroup_procs {
        ctx(
            fs::write(procs, &me),
            &format!("join cgroup {}", procs.display()),
        )?;
    }

    // 2. What the agent inherits: its binary, the plan, the sandbox's directory, its socket.
    let exe = ctx(
        fs::File::open("/proc/self/exe").map(OwnedFd::from),
        "open own executable",
    )?;
    let plan_fd = ctx(sys::memfd_with(c"sandbox-plan", &input), "store plan")?;
    let _ = fs::remove_file(&plan.socket_path);
    let listener = ctx(UnixListener::bind(&plan.socket_path), "bind agent socket")?;
    ctx(
        fs::set_permissions(&plan.socket_path, fs::Permissions::from_mode(0o600)),
        "chmod agent socket",
    )?;

    let (status_read, status_write) = ctx(
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC),
        "status pipe",
    )?;
    let (parent_end, child_end) = ctx(
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        ),
        "socketpair",
    )?;

    // 3. The namespaces, created under the agent's own id (root only): that id becomes the user
    //    namespace's owner and the child's identity. Real and effective ids change, the saved id
    //    stays root, so the privileges come back right after the fork.
    let mut flags = (libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP) as u64;
    if plan.privileged {
        // As root, the network namespace is made here, before the user namespace, so the host's
        // user namespace owns it: nothing inside can change its routes or the rules that steer
        // its traffic to the engine (see `netns`). The child inherits it.
        ctx(
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET),
            "create the network namespace",
        )?;
        ctx(netns::configure(), "configure the network namespace")?;
    } else {
        // Unprivileged, it belongs to the sandbox's user namespace: loopback only (the agent
        // brings it up).
        flags |= libc::CLONE_NEWNET as u64;
    }
    if let Some(agent) = plan.agent_id {
        ctx(sys::set_ids(agent, agent, 0), "take the agent's id")?;
    }
    // SAFETY: this process is single-threaded (a fresh exec that spawned no threads).
    let forked = unsafe { sys::clone3_fork(flags) };
    if plan.agent_id.is_some() && !matches!(forked, Ok(0)) {
        ctx(sys::set_ids(0, 0, 0), "take back root")?;
    }
    let pid = ctx(forked, "create namespaces")?;
    if pid == 0 {
        drop(parent_end);
        drop(status_read);
        let fds = Inherited {
            exe,
            listen: OwnedFd::from(listener),
            status: status_write,
            plan: plan_fd,
        };
        let error = child(&plan, &child_end, fds).to_string();
        let _ = nix::sys::socket::send(child_end.as_raw_fd(), error.as_bytes(), MsgFlags::empty());
        // SAFETY: _exit is always safe; skip destructors and atexit handlers of the parent's state.
        unsafe { libc::_exit(1) }
    }
    drop(child_end);
    drop(listener);
    drop(status_write);

    match parent(&plan, pid, &parent_end).and_then(|()| agent_ready(status_read)) {
        Ok(()) => Ok(pid),
        Err(e) => {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid), None);
            Err(e)
        }
    }
}

/// Waits for the agent's own report: it writes `ready` once it accepts connections. Reads at
/// most [`MAX_STATUS`] bytes: the other end runs inside the sandbox.
fn agent_ready(status: OwnedFd) -> Result<(), BuildError> {
    let mut bytes = Vec::new();
    let _ = fs::File::from(status)
        .take(MAX_STATUS)
        .read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    match text.trim() {
        "ready" => Ok(()),
        "" => Err(BuildError::Refused(
            "the agent exited before it was ready".into(),
        )),
        other => Err(BuildError::Refused(format!(
            "the agent failed to start: {other}"
        ))),
    }
}

fn write_map(pid: i32, file: &str, map: IdMap) -> Result<(), BuildError> {
    let line = format!("{} {} {}\n", map.inside, map.outside, map.count);
    ctx(
        fs::write(format!("/proc/{pid}/{file}"), line),
        &format!("write {file}"),
    )
}

/// The outside half: id maps, id-mapped lower layers, then wait for the exec.
fn parent(plan: &LaunchPlan, pid: i32, sync: &OwnedFd) -> Result<(), BuildError> {
    // The child first makes its mounts private, so nothing attached below can propagate back to
    // the host's mount namespace.
    let mut buf = vec![0u8; 4096];
    let n = ctx(
        nix::sys::socket::recv(sync.as_raw_fd(), &mut buf, MsgFlags::empty()),
        "wait for child",
    )?;
    if &buf[..n] != b"ready" {
        return Err(BuildError::Refused(
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ));
    }
    if !plan.privileged {
        // Unprivileged: setgroups must be denied before a gid map can be written.
        ctx(
            fs::write(format!("/proc/{pid}/setgroups"), "deny"),
            "deny setgroups",
        )?;
    }
    write_map(pid, "uid_map", plan.uid_map)?;
    write_map(pid, "gid_map", plan.gid_map)?;

    if plan.privileged {
        let userns = ctx(
            fs::File::open(format!("/proc/{pid}/ns/user")),
            "open child user namespace",
        )?;
        // A fork's files keep the host ids of the sandbox they came from: its directory is
        // mounted id-mapped from that range onto this one's (every id of the range, the agent's
        // too). Ids outside it stay unmapped, so they can be neither used nor forged.
        let own_dir = match plan.disk_ids {
            Some(from) => {
                let map = format!("{from} {} {}", plan.uid_map.outside, super::plan::UID_RANGE);
                let ns = ctx(
                    sys::userns_with_map(&map),
                    "make the id map of the sandbox's files",
                )?;
                let dir = sandbox_dir(plan)?.to_string_lossy().into_owned();
                Some(ctx(
                    sys::idmapped_tree_rw(&dir, ns.as_raw_fd()),
                    "id-map the sandbox's directory",
                )?)
            }
            None => None,
        };
        // Each lower with whether it is one of the sandbox's own earlier layers.
        let lowers: Vec<(&PathBuf, &PathBuf, bool)> = plan
            .layers
            .iter()
            .flat_map(|layer| {
                layer
                    .lowers
                    .iter()
                    .zip(&layer.staging)
                    .enumerate()
                    .map(|(i, (lower, staging))| (lower, staging, i < layer.stacked))
            })
            .collect();
        // Those are stored as its directory is, under its files' range (its own, or the one a
        // fork's files came from): mapped from that range onto this one's, every id of it.
        let stored = match lowers.iter().any(|l| l.2) {
            true => {
                let from = plan.disk_ids.unwrap_or(plan.uid_map.outside);
                let map = format!("{from} {} {}", plan.uid_map.outside, super::plan::UID_RANGE);
                Some(ctx(
                    sys::userns_with_map(&map),
                    "make the id map of the sandbox's layers",
                )?)
            }
            false => None,
        };
        let trees = lowers
            .iter()
            .map(|(lower, _, own)| {
                let ns = match (own, &stored) {
                    (true, Some(ns)) => ns.as_raw_fd(),
                    _ => userns.as_raw_fd(),
                };
                let lower = lower.to_string_lossy();
                ctx(sys::idmapped_tree(&lower, ns), &format!("id-map {lower}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let volumes = plan
            .volumes
            .iter()
            .map(|v| {
                ctx(
                    sys::idmapped_volume(
                        &v.source.to_string_lossy(),
                        userns.as_raw_fd(),
                        v.read_only,
                    ),
                    &format!("id-map the volume for {}", v.target),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Enter the child's mount namespace (this process exits right after) and attach them.
        let mntns = ctx(
            fs::File::open(format!("/proc/{pid}/ns/mnt")),
            "open child mount namespace",
        )?;
        ctx(
            nix::sched::setns(&mntns, nix::sched::CloneFlags::CLONE_NEWNS),
            "enter child mount namespace",
        )?;
        if let Some(tree) = &own_dir {
            // First: the lower layers' staging directories are inside it.
            ctx(
                sys::move_mount_to(tree, &sandbox_dir(plan)?.to_string_lossy()),
                "attach the id-mapped sandbox directory",
            )?;
        }
        for (tree, (lower, staging, _)) in trees.iter().zip(&lowers) {
            ctx(
                sys::move_mount_to(tree, &staging.to_string_lossy()),
                &format!("attach id-mapped {}", lower.display()),
            )?;
        }
        for (tree, v) in volumes.iter().zip(&plan.volumes) {
            ctx(
                sys::move_mount_to(tree, &v.staging.to_string_lossy()),
                &format!("attach the volume for {}", v.target),
            )?;
        }
        // The sandbox's directory, opened here for the child: its own id may be unable to reach
        // it by path (a data dir under a 0700 home, say), and the overlay needs its upper
        // directory on a mount of the child's own namespace, which this descriptor is.
        let dir = ctx(
            open_dir_path(sandbox_dir(plan)?),
            "open the sandbox's directory",
        )?;
        let fds = [dir.as_raw_fd()];
        ctx(
            nix::sys::socket::sendmsg::<()>(
                sync.as_raw_fd(),
                &[io::IoSlice::new(b"go")],
                &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            ),
            "signal child",
        )?;
    } else {
        ctx(
            nix::sys::socket::send(sync.as_raw_fd(), b"go", MsgFlags::empty()),
            "signal child",
        )?;
    }

    // The child's end is close-on-exec: EOF means it exec'd the agent; a message is its error.
    let n = ctx(
        nix::sys::socket::recv(sync.as_raw_fd(), &mut buf, MsgFlags::empty()),
        "wait for child",
    )?;
    if n > 0 {
        return Err(BuildError::Refused(
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ));
    }
    match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => Ok(()),
        Ok(status) => Err(BuildError::Refused(format!(
            "the sandbox's init exited at startup: {status:?}"
        ))),
        Err(e) => ctx(Err(e), "wait for child"),
    }
}

fn sandbox_dir(plan: &LaunchPlan) -> Result<&std::path::Path, BuildError> {
    plan.rootfs
        .parent()
        .ok_or_else(|| BuildError::Refused("the sandbox's rootfs has no parent directory".into()))
}

/// A path-only descriptor of a directory (enough to `fchdir` into it).
fn open_dir_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .map(OwnedFd::from)
}

/// Descriptors the child hands to the agent.
struct Inherited {
    exe: OwnedFd,
    listen: OwnedFd,
    status: OwnedFd,
    plan: OwnedFd,
}

/// The inside half before the exec. Returns only on failure, with the reason.
fn child(plan: &LaunchPlan, sync: &OwnedFd, fds: Inherited) -> BuildError {
    let sent = match wait_for_maps(sync) {
        Ok(sent) => sent,
        Err(e) => return e,
    };
    // Unprivileged, this process has the caller's own id and reaches the directory by path.
    let dir = match sent {
        Some(dir) => dir,
        None => match sandbox_dir(plan)
            .and_then(|d| ctx(open_dir_path(d), "open the sandbox's directory"))
        {
            Ok(dir) => dir,
            Err(e) => return e,
        },
    };
    // Identity for the exec. As root this process is the agent's id, which has no id inside the
    // sandbox and so is not root there: an exec would drop the capabilities the agent needs to
    // build the sandbox, unless they are ambient. Unprivileged, it becomes the namespace's root.
    let identity = if plan.privileged {
        ctx(nix::unistd::setgroups(&[]), "clear supplementary groups")
            .and_then(|()| ctx(sys::keep_caps_across_exec(), "keep capabilities"))
    } else {
        let root = nix::unistd::Uid::from_raw(0);
        let root_gid = nix::unistd::Gid::from_raw(0);
        ctx(
            nix::unistd::setresgid(root_gid, root_gid, root_gid),
            "setresgid",
        )
        .and_then(|()| ctx(nix::unistd::setresuid(root, root, root), "setresuid"))
    };
    if let Err(e) = identity {
        return e;
    }
    // Descriptors at fixed numbers, /dev/null on 0-2, everything else closed on exec (including
    // the sync socket, whose closing tells the parent the exec happened). Every descriptor kept is
    // first moved above the fixed numbers, so placing one cannot clobber another (the executable
    // may well be open as descriptor 3 right now).
    let high = |fd: OwnedFd| -> Result<OwnedFd, BuildError> {
        let moved = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))
            // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
            .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) });
        ctx(moved, "move descriptor")
    };
    let moved = [fds.listen, fds.status, fds.plan, dir]
        .into_iter()
        .map(high)
        .collect::<Result<Vec<_>, _>>();
    let (exe, moved) = match (high(fds.exe), moved) {
        (Ok(exe), Ok(moved)) => (exe, moved),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let targets = [
        AGENT_LISTEN_FD,
        AGENT_STATUS_FD,
        AGENT_PLAN_FD,
        AGENT_DIR_FD,
    ];
    for (fd, target) in moved.iter().zip(targets) {
        // SAFETY: dup2 of a descriptor we own onto a fixed number; the copy is not close-on-exec.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return BuildError::Step {
                step: format!("place descriptor {target}"),
                source: io::Error::last_os_error().into(),
            };
        }
    }
    if let Ok(null) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors; `null` stays open until the end.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    if let Err(e) = ctx(
        sys::cloexec_from(AGENT_DIR_FD as u32 + 1),
        "close descriptors",
    ) {
        return e;
    }
    let err = sys::exec_fd(&exe, &["sandbox-agent", "__agent"], &[]);
    BuildError::Step {
        step: "exec agent".into(),
        source: err.into(),
    }
}

/// Makes every mount private (nothing mounted from here on may propagate back to the host; the
/// new user namespace grants full capabilities over the new mount namespace even before the id
/// maps exist), then waits while the parent writes the id maps and attaches the lower layers.
/// Returns the sandbox's directory when the parent sent it.
fn wait_for_maps(sync: &OwnedFd) -> Result<Option<OwnedFd>, BuildError> {
    ctx(
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
            None::<&str>,
        ),
        "make mounts private",
    )?;
    ctx(
        nix::sys::socket::send(sync.as_raw_fd(), b"ready", MsgFlags::empty()),
        "signal parent",
    )?;
    let mut buf = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = ctx(
        nix::sys::socket::recvmsg::<()>(
            sync.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ),
        "wait for parent",
    )?;
    let mut dir = None;
    for cmsg in ctx(msg.cmsgs(), "wait for parent")? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: the kernel just installed this descriptor for us.
                dir = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    let n = msg.bytes;
    if &buf[..n] == b"go" {
        Ok(dir)
    } else {
        Err(BuildError::Refused("the launcher gave up".into()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_on_the_status_pipe_is_read_only_up_to_the_bound() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // 32 MiB of junk from "the agent": the writer fails once the reader has had enough.
        let writer = std::thread::spawn(move || {
            let mut w = fs::File::from(write);
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..32 {
                if w.write_all(&chunk).is_err() {
                    return false;
                }
            }
            true
        });
        let error = agent_ready(read).unwrap_err().to_string();
        assert!(
            error.len() < MAX_STATUS as usize + 100,
            "{} bytes",
            error.len()
        );
        assert!(!writer.join().unwrap(), "the flood was read whole");
    }

    #[test]
    fn the_agent_says_ready_or_why_not() {
        for (said, ok) in [
            (&b"ready\n"[..], true),
            (b"", false),
            (b"no overlay\n", false),
        ] {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
            fs::File::from(write).write_all(said).unwrap();
            assert_eq!(agent_ready(read).is_ok(), ok);
        }
    }
}
