//! Starting processes inside the sandbox: one place that builds the environment, gives each
//! process its own session, wires its pipes, confines it and registers it with the reaper.
//!
//! The agent itself stays outside the confinement: a command is the sandbox's root (the agent
//! runs as an id that is not the sandbox's), keeps only the sandbox's capabilities, and is in a
//! Landlock domain that cannot signal or trace the agent. Commands are started by the command
//! parent ([`super::parent`]), which entered that domain once, so they all share it; without
//! one, a command is confined between fork and exec here, in a domain of its own.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::OnceLock;

use tokio::net::unix::pipe;

use super::accounts::Account;
use super::reaper::{Exit, Reaper};
use super::terminal::{self, Terminal};
use sandbox_mcp_protocol::{AgentError, ErrorKind, TerminalSize};

/// What every command is confined to, set once when the agent starts.
pub struct Confinement {
    /// Capabilities a command may hold (bit mask); every other one leaves its bounding set.
    pub caps: u64,
    /// A prepared Landlock ruleset each command enters (none without kernel support).
    pub landlock: Option<OwnedFd>,
    /// uid and gid commands run as, when not the sandbox's root (an image's `User`).
    pub user: Option<(u32, u32)>,
}

static CONFINEMENT: OnceLock<Confinement> = OnceLock::new();

/// Sets the confinement of every command started from now on (once; later calls are ignored),
/// and starts the command parent that puts them all in one Landlock domain ([`super::parent`]).
/// Call while the agent is still one thread.
pub fn confine_commands(confinement: Confinement) {
    if let Some(ruleset) = &confinement.landlock {
        super::parent::begin(confinement.caps, ruleset.as_raw_fd());
    }
    let _ = CONFINEMENT.set(confinement);
}

/// Becomes the sandbox's root with only the sandbox's capabilities, in the Landlock domain.
/// Runs between fork and exec: raw system calls only, nothing that allocates or locks.
pub(crate) fn confine(
    caps: u64,
    landlock: Option<RawFd>,
    user: Option<(u32, u32)>,
) -> std::io::Result<()> {
    use sandbox_mcp_sys::syscalls as sys;
    let check = |ret: libc::c_long| {
        if ret < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: id-setting system calls on integer arguments.
    unsafe {
        check(libc::setresgid(0, 0, 0).into())?;
        check(libc::setresuid(0, 0, 0).into())?;
    }
    sys::limit_bounding_set(caps)?;
    sys::clear_inheritable_caps()?;
    if let Some(fd) = landlock {
        // SAFETY: landlock_restrict_self on a ruleset descriptor the agent keeps open.
        check(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) })?;
    }
    if let Some((uid, gid)) = user.filter(|u| *u != (0, 0)) {
        // Last, once root's work is done: leaving uid 0 clears every capability.
        // SAFETY: id-setting system calls on integer arguments (and one gid, on the stack).
        unsafe {
            // The account's own group only; refused where the sandbox may not set groups, which
            // leaves root's (none beyond its own).
            libc::setgroups(1, &gid);
            check(libc::setresgid(gid, gid, gid).into())?;
            check(libc::setresuid(uid, uid, uid).into())?;
        }
    }
    Ok(())
}

/// Working directory when none is given, unless the template names another.
const ROOT_HOME: &str = "/root";
static DEFAULT_CWD: OnceLock<String> = OnceLock::new();

/// Sets the working directory of commands that name none (once, at start), making it if it is
/// missing (an image's `WORKDIR` need not exist in its layers).
pub fn set_default_cwd(dir: Option<String>) {
    if let Some(dir) = dir.filter(|d| d.starts_with('/')) {
        let _ = std::fs::create_dir_all(&dir);
        let _ = DEFAULT_CWD.set(dir);
    }
}

/// Working directory of commands that name none.
pub(crate) fn default_cwd() -> &'static str {
    DEFAULT_CWD.get().map_or(ROOT_HOME, String::as_str)
}

/// The PATH every process starts with.
pub(crate) const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment every process starts from (before sandbox and per-call variables).
pub(crate) fn base_env() -> Vec<(String, String)> {
    [
        ("PATH", PATH),
        ("HOME", "/root"),
        ("USER", "root"),
        ("LOGNAME", "root"),
        ("SHELL", "/bin/sh"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("TERM", "dumb"),
        ("PYTHONUNBUFFERED", "1"),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

pub fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError::new(kind, message)
}

/// Checks a working directory and an environment before anything is started.
pub fn check(cwd: &str, env: &[(String, String)]) -> Result<(), AgentError> {
    if cwd.contains('\0') {
        return Err(error(ErrorKind::InvalidArgument, "cwd contains a NUL byte"));
    }
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(error(
                ErrorKind::InvalidArgument,
                format!("cwd is not a directory: {cwd}"),
            ));
        }
        Err(_) => {
            return Err(error(
                ErrorKind::InvalidArgument,
                format!("cwd does not exist (create it first with mkdir -p, or omit cwd): {cwd}"),
            ));
        }
    }
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(error(
                ErrorKind::InvalidArgument,
                format!("invalid environment variable name or value: {k:?}"),
            ));
        }
    }
    Ok(())
}

/// What to start (the defaults: no arguments, nothing extra, stdin from /dev/null, output on two
/// pipes, as the sandbox's user).
#[derive(Default)]
pub struct Launch<'a> {
    pub program: &'a str,
    pub args: &'a [&'a str],
    pub cwd: &'a str,
    /// Sandbox-wide variables, then per-call ones (later wins).
    pub env: &'a [&'a [(String, String)]],
    /// stdout and stderr into one pipe, in the order written (background jobs).
    pub merge_output: bool,
    /// Descriptors to place at 3, 4, … in the child (interpreter control pipes).
    pub extra_fds: &'a [RawFd],
    /// stdin from a pipe (an attached process) instead of /dev/null.
    pub stdin_pipe: bool,
    /// The account to run as, instead of the sandbox's (its root, or its image's user).
    pub user: Option<&'a Account>,
    /// stdin, stdout and stderr on a new terminal of this size (with `stdin_pipe`: its input),
    /// the process's controlling terminal; its output comes out of `stdout`.
    pub terminal: Option<TerminalSize>,
}

/// A started process.
pub struct Started {
    pub pid: i32,
    pub exit: tokio::sync::oneshot::Receiver<Exit>,
    pub stdout: pipe::Receiver,
    /// `None` when output is merged into `stdout`.
    pub stderr: Option<pipe::Receiver>,
    /// The process's stdin, when [`Launch::stdin_pipe`] asked for it.
    pub stdin: Option<pipe::Sender>,
    /// Inodes of the output pipes, to find escaped descendants that still hold them.
    pub pipe_inodes: Vec<u64>,
    /// The process's terminal, when it has one.
    pub terminal: Option<Rc<Terminal>>,
}

fn inode_of(fd: &impl std::os::fd::AsFd) -> u64 {
    nix::sys::stat::fstat(fd).map(|s| s.st_ino).unwrap_or(0)
}

/// Starts a process in its own session with stdin on /dev/null (or a pipe, when asked): through
/// the command parent when there is one (every command in one Landlock domain), else directly.
pub fn start(launch: &Launch<'_>, reaper: &Reaper) -> Result<Started, AgentError> {
    let io_error = |what: &str, e: std::io::Error| error(ErrorKind::Io, format!("{what}: {e}"));
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| io_error("cannot create a pipe", e.into()))
    };
    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| io_error("cannot open a terminal", e))
    };
    let env = environment(launch);
    // The child's stdin, stdout and stderr, and the agent's ends.
    let (term, child_fds, out, err, input) = match launch.terminal {
        Some(size) => {
            let (term, slave) = terminal::open(size)?;
            let fds = [dup(&slave)?, dup(&slave)?, slave];
            (Some(term), fds, None, None, None)
        }
        None => {
            let (stdin, input) = if launch.stdin_pipe {
                let (r, w) = pipe()?;
                (r, Some(w))
            } else {
                let null = std::fs::OpenOptions::new()
                    .read(true)
                    .open("/dev/null")
                    .map_err(|e| io_error("cannot open /dev/null", e))?;
                (OwnedFd::from(null), None)
            };
            if launch.merge_output {
                let (r, w) = pipe()?;
                let w2 = w
                    .try_clone()
                    .map_err(|e| io_error("cannot create a pipe", e))?;
                (None, [stdin, w, w2], Some(r), None, input)
            } else {
                let (out_r, out_w) = pipe()?;
                let (err_r, err_w) = pipe()?;
                (None, [stdin, out_w, err_w], Some(out_r), Some(err_r), input)
            }
        }
    };
    let user = CONFINEMENT
        .get()
        .and_then(|c| launch.user.map(|a| (a.uid, a.gid)).or(c.user));
    let order = super::parent::Order {
        program: launch.program.to_string(),
        args: launch.args.iter().map(|a| a.to_string()).collect(),
        cwd: launch.cwd.to_string(),
        env,
        user,
        controlling: term.is_some(),
    };
    let mut handed: Vec<std::os::fd::BorrowedFd<'_>> =
        child_fds.iter().map(std::os::fd::AsFd::as_fd).collect();
    // SAFETY: the caller keeps the extra descriptors open for the duration of this call.
    handed.extend(
        launch
            .extra_fds
            .iter()
            .map(|fd| unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) }),
    );
    let through_parent = super::parent::start(&order, &handed);
    drop(handed);
    // The agent's copies of the child's ends close here (the output's end is seen then).
    let started = match through_parent {
        Some(result) => {
            drop(child_fds);
            result
        }
        None => directly(&order, child_fds, launch.extra_fds),
    };
    let pid = started.map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EAGAIN) => " (the sandbox's process limit is reached; kill some processes)",
            Some(libc::ENOENT) => " (it is not installed in this sandbox)",
            _ => "",
        };
        error(
            ErrorKind::Io,
            format!("cannot start {}: {e}{hint}", launch.program),
        )
    })?;
    // No await since the start: the reaper cannot have seen this pid end yet.
    let exit = reaper.watch(pid);
    let to_async = |fd: OwnedFd| {
        pipe::Receiver::from_owned_fd(fd).map_err(|e| io_error("cannot watch output", e))
    };
    let (stdout, stderr, stdin) = match (&term, out) {
        (Some(t), _) => {
            let (out, relayed_input) = t.relay()?;
            (out, None, launch.stdin_pipe.then_some(relayed_input))
        }
        (None, Some(out)) => {
            let err = err.map(to_async).transpose()?;
            let stdin = input
                .map(|w| {
                    pipe::Sender::from_owned_fd(w).map_err(|e| io_error("cannot feed input", e))
                })
                .transpose()?;
            (to_async(out)?, err, stdin)
        }
        (None, None) => return Err(error(ErrorKind::Io, "output pipes are missing")),
    };
    let mut pipe_inodes = vec![inode_of(&stdout)];
    if let Some(e) = &stderr {
        pipe_inodes.push(inode_of(e));
    }
    Ok(Started {
        pid,
        exit,
        stdout,
        stderr,
        stdin,
        pipe_inodes,
        terminal: term,
    })
}

/// The whole environment of a launch, each name once (later wins): the base, the account's,
/// a terminal's, then the sandbox's and the call's.
fn environment(launch: &Launch<'_>) -> Vec<(String, String)> {
    let mut env = std::collections::BTreeMap::new();
    env.extend(base_env());
    if let Some(account) = launch.user {
        env.extend(account.env());
    }
    if launch.terminal.is_some() {
        env.insert("TERM".to_string(), "xterm-256color".to_string());
    }
    for vars in launch.env {
        env.extend(vars.iter().cloned());
    }
    env.into_iter().collect()
}

/// Starts `order` from the agent itself: the command enters a Landlock domain of its own (where
/// there is no command parent).
fn directly(
    order: &super::parent::Order,
    [stdin, stdout, stderr]: [OwnedFd; 3],
    extra_fds: &[RawFd],
) -> std::io::Result<i32> {
    let mut cmd = Command::new(&order.program);
    cmd.args(&order.args)
        .current_dir(&order.cwd)
        .env_clear()
        .envs(order.env.iter().cloned())
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    let extra: Vec<RawFd> = extra_fds.to_vec();
    let confinement = CONFINEMENT.get().map(|c| {
        (
            c.caps,
            c.landlock.as_ref().map(|fd| fd.as_raw_fd()),
            order.user,
        )
    });
    let controlling = order.controlling;
    // SAFETY: runs in the forked child before exec and calls only async-signal-safe functions
    // (setsid, fcntl, dup2, id and capability calls). A new session gives the process its own
    // process group (killed as a unit) and no controlling terminal (so TIOCSTI has nothing to
    // inject into). Extra descriptors are first moved above the target numbers so placing one
    // cannot clobber another.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            // On a terminal: it becomes the new session's controlling terminal (stdin is it).
            if controlling && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((caps, landlock, user)) = confinement {
                confine(caps, landlock, user)?;
            }
            let mut high = Vec::with_capacity(extra.len());
            for fd in &extra {
                let h = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 64);
                if h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                high.push(h);
            }
            for (i, h) in high.iter().enumerate() {
                if libc::dup2(*h, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // Never waited on through std: the reaper owns every exit status.
    Ok(child.id() as i32)
}

/// SIGKILL to every process in the sandbox but the agent and its command parent, in passes
/// until none is left (a process may fork while a pass runs; the sandbox's pid limit bounds
/// how many).
pub(crate) fn kill_all_commands() {
    let Some(parent) = super::parent::pid() else {
        // From PID 1, kill(-1) reaches every other process in the namespace at once.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), nix::sys::signal::SIGKILL);
        return;
    };
    let me = std::process::id() as i32;
    for _ in 0..100 {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        let others: Vec<i32> = procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|p| *p != me && *p != parent)
            .collect();
        if others.is_empty() {
            return;
        }
        for pid in others {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
    }
}

/// SIGKILL to a process group (its session leader's pid).
pub(crate) fn kill_group(pid: i32) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
}

/// SIGKILL to every process still holding one of these pipes: descendants that left the
/// process group (setsid, double fork) but would otherwise keep a call open.
pub(crate) fn kill_pipe_holders(inodes: &[u64]) {
    let me = std::process::id();
    let wanted: Vec<String> = inodes
        .iter()
        .filter(|i| **i != 0)
        .map(|i| format!("pipe:[{i}]"))
        .collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || super::parent::pid() == Some(pid as i32) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
                .unwrap_or(false)
        });
        if holds {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::SIGKILL,
            );
        }
    }
}

/// A fresh path for a spilled stream: `/tmp/sandbox-mcp/output/<time>-<n>.<stream>`.
pub(crate) fn spill_path(stream: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    std::path::Path::new(super::capture::SPILL_DIR).join(format!("{ms}-{n}.{stream}"))
}
