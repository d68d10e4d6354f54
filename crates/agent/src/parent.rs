//! The command parent: one process in the commands' Landlock domain that starts every command,
//! so that all of a sandbox's commands share one domain.
//!
//! Landlock confines signals and ptrace-style access to a domain and the domains nested in it.
//! A command that entered a domain of its own between fork and exec could not signal what an
//! earlier command left running: `kill` or `pkill` of a server started in an earlier call got
//! `EPERM`. The agent itself must stay outside every domain, so that no command can signal or
//! trace it. So, once at start and while it is still one thread, the agent forks a process that
//! enters the domain, keeps no capability the sandbox does not have, gives up every descriptor
//! but its channel to the agent, and becomes non-dumpable. The agent hands it each command (its
//! program, arguments, environment, working directory, account, and descriptors over
//! `SCM_RIGHTS`); it starts the command with `CLONE_PARENT`, so the command is the agent's child
//! as before: the agent's reaper sees its exit and a call waits for it as it did.
//!
//! Code in the sandbox may stop or kill the command parent (it is the sandbox's root, in the
//! same domain). A command it can no longer take then starts as before, in a domain of its own.

use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use serde::{Deserialize, Serialize};

/// Largest command the channel carries (its arguments and environment, as JSON); a larger one
/// starts without the command parent.
const MAX_ORDER: usize = 1 << 20;
/// Most descriptors a command is given: stdin, stdout, stderr and the extra ones.
const MAX_FDS: usize = 16;
/// How long a start may take before the command parent counts as stopped (a start waits for the
/// command's exec, which a busy machine may slow down).
const ANSWER_WITHIN_SECS: i64 = 30;

/// One command to start: the descriptors travel beside it (stdin, stdout, stderr, then extra
/// ones placed at 3, 4, …).
#[derive(Serialize, Deserialize)]
pub(crate) struct Order {
    pub program: String,
    pub args: Vec<String>,
    pub cwd: String,
    /// The whole environment, each name once.
    pub env: Vec<(String, String)>,
    /// uid and gid to run as, when not the sandbox's root.
    pub user: Option<(u32, u32)>,
    /// stdin is a terminal that becomes the command's controlling terminal.
    pub controlling: bool,
}

struct Parent {
    channel: OwnedFd,
    pid: i32,
    gone: AtomicBool,
}

static PARENT: OnceLock<Parent> = OnceLock::new();

/// Forks the command parent (once; nothing when the agent already has threads, which a fork
/// would leave holding locks). `caps`: what commands may hold; `landlock`: their ruleset.
pub(crate) fn begin(caps: u64, landlock: RawFd) {
    if PARENT.get().is_some() || !single_threaded() {
        return;
    }
    let Ok((agent_end, parent_end)) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    ) else {
        return;
    };
    let big = MAX_ORDER as i32 * 2;
    // SAFETY: setsockopt on a socket we own, with an int option value.
    unsafe {
        set_int(&agent_end, libc::SO_SNDBUF, big);
        set_int(&parent_end, libc::SO_RCVBUF, big);
    }
    let timeout = libc::timeval {
        tv_sec: ANSWER_WITHIN_SECS,
        tv_usec: 0,
    };
    // SAFETY: SO_RCVTIMEO on a socket we own, with a timeval.
    unsafe {
        libc::setsockopt(
            agent_end.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
    // SAFETY: the agent is one thread here (checked above), so the child may run any code.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(agent_end);
            let code = match become_parent(caps, landlock, parent_end) {
                Ok(channel) => serve(channel),
                Err(_) => 1,
            };
            // SAFETY: leaving the forked child without running the agent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(parent_end);
            let _ = PARENT.set(Parent {
                channel: agent_end,
                pid: child.as_raw(),
                gone: AtomicBool::new(false),
            });
        }
        Err(_) => {}
    }
}

/// The command parent's pid, while it serves.
pub(crate) fn pid() -> Option<i32> {
    PARENT
        .get()
        .filter(|p| !p.gone.load(Ordering::Relaxed))
        .map(|p| p.pid)
}

/// Starts `order` through the command parent: `None` when it is not there (start it directly),
/// else the command's pid or why it could not start.
pub(crate) fn start(order: &Order, fds: &[BorrowedFd<'_>]) -> Option<std::io::Result<i32>> {
    let parent = PARENT.get().filter(|p| !p.gone.load(Ordering::Relaxed))?;
    let body = serde_json::to_vec(order).ok()?;
    if body.len() > MAX_ORDER || fds.len() > MAX_FDS {
        return None;
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    match sendmsg::<()>(
        parent.channel.as_raw_fd(),
        &[IoSlice::new(&body)],
        &rights,
        MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        Ok(_) => {}
        Err(
            nix::errno::Errno::EPIPE
            | nix::errno::Errno::ECONNRESET
            | nix::errno::Errno::ECONNREFUSED
            | nix::errno::Errno::ENOTCONN,
        ) => {
            // Gone before it took the command: nothing was started.
            parent.give_up();
            return None;
        }
        // Too large for the channel, or out of buffers: this one starts directly.
        Err(_) => return None,
    }
    let mut answer = [0u8; 4];
    let got = loop {
        match nix::sys::socket::recv(parent.channel.as_raw_fd(), &mut answer, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    match got {
        Ok(4) => {
            let v = i32::from_ne_bytes(answer);
            Some(if v > 0 {
                Ok(v)
            } else {
                Err(std::io::Error::from_raw_os_error(-v))
            })
        }
        _ => {
            // Stopped or killed after it took the command: it may have started it, so the call
            // fails rather than start it twice.
            parent.give_up();
            Some(Err(std::io::Error::other(
                "the sandbox's command parent stopped answering (something in the sandbox \
                 stopped or killed it); commands start without it from now on, try again",
            )))
        }
    }
}

impl Parent {
    fn give_up(&self) {
        if !self.gone.swap(true, Ordering::Relaxed) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::SIGKILL,
            );
        }
    }
}

fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1)
}

/// # Safety
/// `fd` must be a socket.
unsafe fn set_int(fd: &OwnedFd, option: libc::c_int, value: libc::c_int) {
    // SAFETY: the caller's socket; an int option.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// In the forked child: the sandbox's root in the commands' domain, with the sandbox's
/// capabilities at most, no descriptor but `channel` (returned where it moved), non-dumpable,
/// ending with the agent.
fn become_parent(caps: u64, landlock: RawFd, channel: OwnedFd) -> std::io::Result<OwnedFd> {
    use sandbox_mcp_sys::syscalls as sys;
    super::spawn::confine(caps, Some(landlock), None)?;
    let held = sys::caps_get()?;
    sys::caps_set(sys::CapSets {
        effective: held.permitted & caps,
        permitted: held.permitted & caps,
        inheritable: 0,
    })?;
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::from)?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::SIGKILL).map_err(std::io::Error::from)?;
    if let Ok(name) = CString::new(sandbox_mcp_protocol::COMMAND_PARENT) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    // The channel moves above the standard descriptors; every other descriptor the agent had
    // (its socket and status pipe, the ruleset once entered) closes; the standard ones are
    // /dev/null, so a command given fewer cannot write into anything.
    // SAFETY: descriptor calls on numbers; none of the closed ones is used here afterwards.
    unsafe {
        // Closed below with the rest: no longer owned here.
        let old = std::os::fd::IntoRawFd::into_raw_fd(channel);
        let moved = libc::fcntl(old, libc::F_DUPFD_CLOEXEC, 3);
        if moved < 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_close_range, 0u32, moved as u32 - 1, 0u32);
        libc::syscall(libc::SYS_close_range, moved as u32 + 1, u32::MAX, 0u32);
        for _ in 0..3 {
            if libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(OwnedFd::from_raw_fd(moved))
    }
}

/// Takes commands until the agent goes away.
fn serve(channel: OwnedFd) -> i32 {
    let mut buf = vec![0u8; MAX_ORDER];
    loop {
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let (bytes, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(
                channel.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(m) => m,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return 0,
            };
            let mut fds = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for cmsg in cmsgs {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: descriptors just received, owned by nobody else here.
                        fds.extend(
                            received
                                .into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
            }
            (msg.bytes, fds)
        };
        if bytes == 0 {
            return 0;
        }
        let answer = match serde_json::from_slice::<Order>(&buf[..bytes]) {
            Ok(order) if fds.len() >= 3 => match launch(&order, &fds) {
                Ok(pid) => pid,
                Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
            },
            _ => -libc::EINVAL,
        };
        drop(fds);
        if nix::sys::socket::send(
            channel.as_raw_fd(),
            &answer.to_ne_bytes(),
            MsgFlags::MSG_NOSIGNAL,
        )
        .is_err()
        {
            return 0;
        }
    }
}

/// The program's path: as given when it names a directory, else the first executable file of
/// that name on the command's PATH.
fn resolve(program: &str, env: &[(String, String)]) -> std::io::Result<CString> {
    let c = |s: &str| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    if program.contains('/') {
        return c(program);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(super::spawn::PATH, |(_, v)| v.as_str());
    let mut denied = false;
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = c(&format!("{dir}/{program}"))?;
        // SAFETY: access on a NUL-terminated path.
        if unsafe { libc::access(candidate.as_ptr(), libc::X_OK) } == 0 {
            let is_file = std::fs::metadata(format!("{dir}/{program}")).is_ok_and(|m| m.is_file());
            if is_file {
                return Ok(candidate);
            }
        } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EACCES) {
            denied = true;
        }
    }
    Err(std::io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

/// Starts one command as the agent's child (`CLONE_PARENT`); its pid once it has exec'd.
fn launch(order: &Order, fds: &[OwnedFd]) -> std::io::Result<i32> {
    let c = |s: &str| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let path = resolve(&order.program, &order.env)?;
    let argv: Vec<CString> = std::iter::once(order.program.as_str())
        .chain(order.args.iter().map(String::as_str))
        .map(c)
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = order
        .env
        .iter()
        .map(|(k, v)| c(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // A file without `#!` runs with /bin/sh, as execvp runs it.
    let shell = c("/bin/sh")?;
    let mut shell_argv: Vec<*const libc::c_char> = vec![shell.as_ptr(), path.as_ptr()];
    shell_argv.extend(argv.iter().skip(1).map(|a| a.as_ptr()));
    shell_argv.push(std::ptr::null());
    let ready = Prepared {
        fds: fds.iter().map(|f| f.as_raw_fd()).collect(),
        cwd: c(&order.cwd)?,
        controlling: order.controlling,
        user: order.user,
        path: &path,
        argv: &argv_ptrs,
        envp: &envp_ptrs,
        shell: &shell,
        shell_argv: &shell_argv,
    };
    let (report_r, report_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    // SAFETY: a fork-like clone whose parent is the agent; this process is one thread, and the
    // child runs only system calls on memory prepared above before it execs or exits.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the child, system calls only (see `child`).
        let errno = unsafe { child(&ready) };
        // SAFETY: reporting the failure to the parent, then leaving without cleanup.
        unsafe {
            libc::write(
                report_w.as_raw_fd(),
                (&errno as *const i32).cast(),
                std::mem::size_of::<i32>(),
            );
            libc::_exit(127);
        }
    }
    drop(report_w);
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        // SAFETY: reading into a local buffer.
        let n = unsafe {
            libc::read(
                report_r.as_raw_fd(),
                errno[got..].as_mut_ptr().cast(),
                4 - got,
            )
        };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    if got == 4 {
        // The child exits (127); the agent reaps it as an unknown pid.
        return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
    }
    Ok(pid as i32)
}

/// What the child of a clone needs, made before the clone.
struct Prepared<'a> {
    fds: Vec<RawFd>,
    cwd: CString,
    controlling: bool,
    user: Option<(u32, u32)>,
    path: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    /// `/bin/sh` and its arguments, for a file without `#!`.
    shell: &'a CString,
    shell_argv: &'a [*const libc::c_char],
}

/// Between clone and exec: the descriptors in place, the working directory, a session of its
/// own (and its terminal), the account, then exec. Returns the errno of what failed.
///
/// # Safety
/// Only in the child of [`launch`]'s clone: system calls only, on memory prepared before it.
unsafe fn child(ready: &Prepared<'_>) -> i32 {
    let Prepared {
        fds,
        cwd,
        controlling,
        user,
        path,
        argv,
        envp,
        shell,
        shell_argv,
    } = ready;
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: system calls on integers and on memory prepared before the clone.
    unsafe {
        // A clean signal state: nothing blocked, SIGPIPE at its default (Rust ignores it).
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // Move every descriptor above its target first, so placing one cannot clobber another.
        let mut high = [0 as RawFd; MAX_FDS];
        for (i, fd) in fds.iter().enumerate().take(MAX_FDS) {
            let h = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 64);
            if h < 0 {
                return errno();
            }
            high[i] = h;
        }
        for (i, h) in high.iter().enumerate().take(fds.len().min(MAX_FDS)) {
            if libc::dup2(*h, i as RawFd) < 0 {
                return errno();
            }
        }
        if libc::chdir(cwd.as_ptr()) < 0 {
            return errno();
        }
        if libc::setsid() < 0 {
            return errno();
        }
        if *controlling && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return errno();
        }
        if let Some((uid, gid)) = user.filter(|u| *u != (0, 0)) {
            libc::setgroups(1, &gid);
            if libc::setresgid(gid, gid, gid) < 0 || libc::setresuid(uid, uid, uid) < 0 {
                return errno();
            }
        }
        libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
        let failed = errno();
        if failed == libc::ENOEXEC {
            libc::execve(shell.as_ptr(), shell_argv.as_ptr(), envp.as_ptr());
        }
        failed
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::resolve;

    fn env(path: &str) -> Vec<(String, String)> {
        vec![("PATH".to_string(), path.to_string())]
    }

    #[test]
    fn a_program_is_found_on_the_commands_own_path() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // A directory of the same name earlier on the PATH is passed over.
        let earlier = tempfile::tempdir().unwrap();
        std::fs::create_dir(earlier.path().join("tool")).unwrap();
        let path = format!("{}:{}", earlier.path().display(), dir.path().display());
        assert_eq!(
            resolve("tool", &env(&path)).unwrap().to_str().unwrap(),
            tool.to_str().unwrap()
        );
        // The last PATH given wins; a path with a slash is taken as it is.
        let twice = vec![
            ("PATH".to_string(), "/nowhere".to_string()),
            ("PATH".to_string(), dir.path().display().to_string()),
        ];
        assert!(resolve("tool", &twice).is_ok());
        assert_eq!(
            resolve("./x/y", &env("/nowhere"))
                .unwrap()
                .to_str()
                .unwrap(),
            "./x/y"
        );
    }

    #[test]
    fn a_missing_or_bad_program_is_refused_with_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().display().to_string();
        let missing = resolve("no-such-tool", &env(&path)).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
        let nul = resolve("a\0b", &env(&path)).unwrap_err();
        assert_eq!(nul.raw_os_error(), Some(libc::EINVAL));
    }
}
