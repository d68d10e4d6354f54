//! The sandbox launcher: the one place where a sandbox is built. Security-critical; keep it small.
//!
//! The engine (a multi-threaded tokio process) never forks into a sandbox itself. It re-executes
//! this binary as `sandbox-mcp __launch`, a fresh single-threaded process, and passes the
//! [`LaunchPlan`] on stdin. This process then:
//!
//! 1. joins the sandbox's cgroups, so everything it creates is limited and accounted;
//! 2. binds the agent's listening socket on the host (the engine connects to it; the sandbox never
//!    sees the path, the agent just inherits the descriptor);
//! 3. forks the sandbox's init with new user, mount, pid, net, ipc, uts and cgroup namespaces;
//! 4. from outside, writes the child's uid/gid maps (an unprivileged host range, never 0→0) and,
//!    as root, attaches id-mapped read-only copies of the lower layers inside the child's mount
//!    namespace (the kernel lets only a namespace's owner stack overlays on its mounts, and only
//!    real root may create id-mapped mounts, so the parent builds them and hands them over);
//! 5. reports the child's pid to the engine and exits. The child outlives it.
//!
//! The child, PID 1 of the new namespaces, mounts its overlay root and /usr, a fresh /proc, a
//! minimal /dev, pivots into the new root, brings loopback up, drops capabilities, sets
//! no_new_privs, applies Landlock and seccomp, and execs the agent from a descriptor opened
//! before the pivot (the binary is not inside the sandbox). Any failure before the exec is sent
//! back over a socketpair and the child exits; the socketpair closing on exec means success.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, socketpair};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::Serialize;

use super::plan::{IdMap, LaunchPlan};
use super::{landlock, seccomp, sys};

/// The agent's listening socket is always this descriptor in the agent.
pub const AGENT_LISTEN_FD: RawFd = 3;
/// Where the agent reports `ready` (or why it failed) once it accepts connections, then closes.
pub const AGENT_STATUS_FD: RawFd = 4;

/// Capabilities the sandbox's root keeps (inside its user namespace only). Roughly Docker's
/// default set minus NET_RAW and MKNOD: enough for package managers and chown/chmod, nothing that
/// mounts, traces, loads modules or administers the network.
const KEPT_CAPS: [u32; 11] = [
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    18, // CAP_SYS_CHROOT
    31, // CAP_SETFCAP
];

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
            error: Some(e),
        },
    };
    let ok = report.ok;
    let mut out = io::stdout();
    let _ = serde_json::to_writer(&mut out, &report);
    let _ = out.flush();
    std::process::exit(if ok { 0 } else { 1 });
}

fn ctx<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

fn launch() -> Result<i32, String> {
    let mut input = String::new();
    ctx(io::stdin().read_to_string(&mut input), "read plan")?;
    let plan: LaunchPlan = ctx(serde_json::from_str(&input), "parse plan")?;

    // 1. Join the cgroups first: the child is created inside them.
    let me = std::process::id().to_string();
    for procs in &plan.cgroup_procs {
        ctx(
            fs::write(procs, &me),
            &format!("join cgroup {}", procs.display()),
        )?;
    }

    // 2. The agent binary, opened now: after pivot_root it is out of reach.
    let exe = ctx(
        fs::File::open("/proc/self/exe").map(OwnedFd::from),
        "open own executable",
    )?;

    // 3. The agent's socket, bound on the host side before any namespace exists.
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

    let flags = (libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP) as u64;
    // SAFETY: this process is single-threaded (a fresh exec that spawned no threads).
    let pid = ctx(unsafe { sys::clone3_fork(flags) }, "create namespaces")?;
    if pid == 0 {
        drop(parent_end);
        drop(status_read);
        let error = child(&plan, &child_end, exe, listener, status_write);
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

/// Waits for the agent's own report: it writes `ready` once it accepts connections.
fn agent_ready(status: OwnedFd) -> Result<(), String> {
    let mut text = String::new();
    let _ = fs::File::from(status).read_to_string(&mut text);
    match text.trim() {
        "ready" => Ok(()),
        "" => Err("the agent exited before it was ready".into()),
        other => Err(format!("the agent failed to start: {other}")),
    }
}

fn write_map(pid: i32, file: &str, map: IdMap) -> Result<(), String> {
    let line = format!("{} {} {}\n", map.inside, map.outside, map.count);
    ctx(
        fs::write(format!("/proc/{pid}/{file}"), line),
        &format!("write {file}"),
    )
}

/// The outside half: id maps, id-mapped lower layers, then wait for the exec.
fn parent(plan: &LaunchPlan, pid: i32, sync: &OwnedFd) -> Result<(), String> {
    // The child first makes its mounts private, so nothing attached below can propagate back to
    // the host's mount namespace.
    let mut buf = vec![0u8; 4096];
    let n = ctx(
        nix::sys::socket::recv(sync.as_raw_fd(), &mut buf, MsgFlags::empty()),
        "wait for child",
    )?;
    if &buf[..n] != b"ready" {
        return Err(String::from_utf8_lossy(&buf[..n]).into_owned());
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
        let trees = plan
            .layers
            .iter()
            .map(|layer| {
                let lower = layer.lower.to_string_lossy();
                ctx(
                    sys::idmapped_tree(&lower, userns.as_raw_fd()),
                    &format!("id-map {lower}"),
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
        for (tree, layer) in trees.iter().zip(&plan.layers) {
            ctx(
                sys::move_mount_to(tree, &layer.staging.to_string_lossy()),
                &format!("attach id-mapped {}", layer.lower.display()),
            )?;
        }
    }
    ctx(
        nix::sys::socket::send(sync.as_raw_fd(), b"go", MsgFlags::empty()),
        "signal child",
    )?;

    // The child's end is close-on-exec: EOF means it exec'd the agent; a message is its error.
    let n = ctx(
        nix::sys::socket::recv(sync.as_raw_fd(), &mut buf, MsgFlags::empty()),
        "wait for child",
    )?;
    if n > 0 {
        return Err(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => Ok(()),
        Ok(status) => Err(format!("the sandbox's init exited at startup: {status:?}")),
        Err(e) => Err(format!("wait for child: {e}")),
    }
}

/// The inside half. Returns only on failure, with the reason.
fn child(
    plan: &LaunchPlan,
    sync: &OwnedFd,
    exe: OwnedFd,
    listener: UnixListener,
    status: OwnedFd,
) -> String {
    match setup(plan, sync) {
        Ok(()) => {}
        Err(e) => return e,
    }
    // Descriptors: the listener at a fixed number, /dev/null on 0-2, everything else closed on
    // exec (including the sync socket, whose closing tells the parent the exec happened).
    // Move every descriptor we keep above the fixed numbers first, so placing one cannot clobber
    // another (the executable may well be open as descriptor 3 right now).
    let high = |fd: OwnedFd| -> Result<OwnedFd, String> {
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))
            // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
            .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) })
            .map_err(|e| format!("move descriptor: {e}"))
    };
    let (exe, listen, status) = match (high(exe), high(OwnedFd::from(listener)), high(status)) {
        (Ok(e), Ok(l), Ok(s)) => (e, l, s),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return e,
    };
    let (listen, status) = (listen.as_raw_fd(), status.as_raw_fd());
    for (fd, target) in [(listen, AGENT_LISTEN_FD), (status, AGENT_STATUS_FD)] {
        // SAFETY: dup2 of a descriptor we own onto a fixed number; the copy is not close-on-exec.
        if unsafe { libc::dup2(fd, target) } < 0 {
            return format!("place descriptor {target}: {}", io::Error::last_os_error());
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
    if let Err(e) = sys::cloexec_from(AGENT_STATUS_FD as u32 + 1) {
        return format!("close descriptors: {e}");
    }
    if let Err(e) = restrict(&exe) {
        return e;
    }
    let err = sys::exec_fd(exe.as_raw_fd(), &["sandbox-agent", "__agent"], &plan.env);
    format!("exec agent: {err}")
}

/// Everything between "go" and the final restrictions: identity, mounts, pivot, network.
fn setup(plan: &LaunchPlan, sync: &OwnedFd) -> Result<(), String> {
    // Nothing mounted from here on may propagate back to the host. (The new user namespace grants
    // full capabilities over the new mount namespace even before the id maps exist.)
    ctx(
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        ),
        "make mounts private",
    )?;
    ctx(
        nix::sys::socket::send(sync.as_raw_fd(), b"ready", MsgFlags::empty()),
        "signal parent",
    )?;
    let mut buf = [0u8; 8];
    let n = ctx(
        nix::sys::socket::recv(sync.as_raw_fd(), &mut buf, MsgFlags::empty()),
        "wait for parent",
    )?;
    if &buf[..n] != b"go" {
        return Err("the launcher gave up".into());
    }

    // From here on this process is the sandbox's root: an unprivileged host uid that may be unable
    // to search the data dir's parents (a data dir under /root, say). So enter the sandbox's own
    // directory now, with the launcher's host identity, and name everything in it relative to it.
    let base = plan
        .rootfs
        .parent()
        .ok_or("the sandbox's rootfs has no parent directory")?;
    ctx(nix::unistd::chdir(base), "enter the sandbox's directory")?;
    let inside = |p: &Path| -> Result<PathBuf, String> {
        p.strip_prefix(base)
            .map(Path::to_path_buf)
            .map_err(|_| format!("{} is outside the sandbox's directory", p.display()))
    };

    // Become root of the new user namespace; drop supplementary groups inherited from the host.
    if plan.privileged {
        ctx(nix::unistd::setgroups(&[]), "clear supplementary groups")?;
    }
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    ctx(
        nix::unistd::setresgid(root_gid, root_gid, root_gid),
        "setresgid",
    )?;
    ctx(
        nix::unistd::setresuid(root_uid, root_uid, root_uid),
        "setresuid",
    )?;

    let rootfs = inside(&plan.rootfs)?;
    let rootfs = rootfs.as_path();
    for layer in &plan.layers {
        // As root the lower layer is the id-mapped copy the parent attached; otherwise the host
        // directory itself (whose files then stay read-only inside the sandbox).
        let lower = if plan.privileged {
            inside(&layer.staging)?
        } else {
            layer.lower.clone()
        };
        let lower = lower.display();
        let target = if layer.target == "/" {
            rootfs.to_path_buf()
        } else {
            rootfs.join(layer.target.trim_start_matches('/'))
        };
        let data = format!(
            "lowerdir={lower},upperdir={},workdir={},userxattr",
            inside(&layer.upper)?.display(),
            inside(&layer.work)?.display()
        );
        ctx(
            mount(
                Some("overlay"),
                &target,
                Some("overlay"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(data.as_str()),
            ),
            &format!("mount overlay on {}", layer.target),
        )?;
    }

    let at = |p: &str| rootfs.join(p);
    ctx(
        mount(
            Some("proc"),
            &at("proc"),
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        ),
        "mount /proc",
    )?;
    setup_dev(&at("dev"), plan.shm_bytes)?;

    // Enter the new root; detach the host's.
    ctx(nix::unistd::chdir(rootfs), "enter new root")?;
    ctx(sys::pivot_root_here(), "pivot_root")?;
    ctx(umount2(".", MntFlags::MNT_DETACH), "detach host root")?;
    ctx(nix::unistd::chdir("/"), "chdir /")?;
    ctx(
        mount(
            None::<&str>,
            "/dev",
            None::<&str>,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NOEXEC,
            None::<&str>,
        ),
        "make /dev read-only",
    )?;

    ctx(nix::unistd::sethostname(&plan.hostname), "set hostname")?;
    ctx(sys::loopback_up(), "bring loopback up")?;
    let no_core = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    ctx(no_core, "disable core dumps")?;
    Ok(())
}

/// A minimal /dev: a small tmpfs with the harmless host devices bind-mounted in, a private
/// devpts, and a size-limited /dev/shm.
fn setup_dev(dev: &Path, shm_bytes: u64) -> Result<(), String> {
    ctx(
        mount(
            Some("tmpfs"),
            dev,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=755,size=65536,nr_inodes=64"),
        ),
        "mount /dev",
    )?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(name);
        ctx(fs::File::create(&target), &format!("create /dev/{name}"))?;
        ctx(
            mount(
                Some(&Path::new("/dev").join(name)),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            ),
            &format!("bind /dev/{name}"),
        )?;
    }
    let pts = dev.join("pts");
    ctx(fs::create_dir(&pts), "create /dev/pts")?;
    ctx(
        mount(
            Some("devpts"),
            &pts,
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        ),
        "mount /dev/pts",
    )?;
    let shm = dev.join("shm");
    ctx(fs::create_dir(&shm), "create /dev/shm")?;
    ctx(
        mount(
            Some("tmpfs"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("mode=1777,size={shm_bytes}").as_str()),
        ),
        "mount /dev/shm",
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ctx(
            std::os::unix::fs::symlink(target, dev.join(link)),
            &format!("link /dev/{link}"),
        )?;
    }
    Ok(())
}

/// The last steps before exec, in the only order that works: capabilities (needs nothing),
/// no_new_privs (required by unprivileged Landlock and seccomp), Landlock, then seccomp (which
/// would forbid some of the calls above).
fn restrict(exe: &OwnedFd) -> Result<(), String> {
    let last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in 0..=last_cap {
        if !KEPT_CAPS.contains(&cap) {
            // SAFETY: prctl with integer arguments.
            let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if ret != 0 {
                return Err(format!(
                    "drop capability {cap}: {}",
                    io::Error::last_os_error()
                ));
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    ctx(
        sys::clear_inheritable_caps(),
        "clear inheritable capabilities",
    )?;
    ctx(nix::sys::prctl::set_no_new_privs(), "set no_new_privs")?;
    // Best effort: kernels without Landlock still get everything else.
    let _ = landlock::restrict(exe);
    seccomp::install()
}
