//! Starting processes inside the sandbox: one place that builds the environment, gives each
//! process its own session, wires its pipes, confines it and registers it with the reaper.
//!
//! Confinement happens between fork and exec, so the agent itself stays outside it: the command
//! becomes the sandbox's root (the agent runs as an id that is not the sandbox's), keeps only the
//! sandbox's capabilities, and enters a Landlock domain that cannot signal or trace the agent.

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

/// Sets the confinement of every command started from now on (once; later calls are ignored).
pub fn confine_commands(confinement: Confinement) {
    let _ = CONFINEMENT.set(confinement);
}

/// Becomes the sandbox's root with only the sandbox's capabilities, in the Landlock domain.
/// Runs between fork and exec: raw system calls only, nothing that allocates or locks.
fn confine(caps: u64, landlock: Option<RawFd>, user: Option<(u32, u32)>) -> std::io::Result<()> {
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

/// Starts a process in its own session with stdin on /dev/null (or a pipe, when asked).
pub fn start(launch: &Launch<'_>, reaper: &Reaper) -> Result<Started, AgentError> {
    let mut cmd = Command::new(launch.program);
    cmd.args(launch.args)
        .current_dir(launch.cwd)
        .env_clear()
        .envs(base_env())
        .stdin(if launch.stdin_pipe {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    if let Some(account) = launch.user {
        cmd.envs(account.env());
    }
    if launch.terminal.is_some() {
        cmd.env("TERM", "xterm-256color");
    }
    for vars in launch.env {
        cmd.envs(vars.iter().cloned());
    }
    let term = match launch.terminal {
        Some(size) => {
            let (term, slave) = terminal::open(size)?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|e| error(ErrorKind::Io, format!("cannot open a terminal: {e}")))
            };
            cmd.stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave));
            Some(term)
        }
        None => None,
    };
    let merged = if term.is_some() {
        None
    } else if launch.merge_output {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| error(ErrorKind::Io, format!("cannot create a pipe: {e}")))?;
        let w2 = w
            .try_clone()
            .map_err(|e| error(ErrorKind::Io, format!("cannot create a pipe: {e}")))?;
        cmd.stdout(Stdio::from(w)).stderr(Stdio::from(w2));
        Some(r)
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        None
    };
    let extra: Vec<RawFd> = launch.extra_fds.to_vec();
    let confinement = CONFINEMENT.get().map(|c| {
        let user = launch.user.map(|a| (a.uid, a.gid)).or(c.user);
        (c.caps, c.landlock.as_ref().map(|fd| fd.as_raw_fd()), user)
    });
    let controlling = term.is_some();
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
    let mut child = cmd.spawn().map_err(|e| {
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
    drop(cmd); // closes our copies of the merged pipe's write ends
    let pid = child.id() as i32;
    let exit = reaper.watch(pid);
    let to_async = |fd: OwnedFd| {
        pipe::Receiver::from_owned_fd(fd)
            .map_err(|e| error(ErrorKind::Io, format!("cannot watch output: {e}")))
    };
    let relayed = match &term {
        Some(t) => Some(t.relay()?),
        None => None,
    };
    let (stdout, stderr, stdin) = match (merged, relayed) {
        (_, Some((out, input))) => (out, None, launch.stdin_pipe.then_some(input)),
        (Some(r), None) => (to_async(r)?, None, None),
        (None, None) => {
            let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
                return Err(error(ErrorKind::Io, "output pipes are missing"));
            };
            (to_async(out.into())?, Some(to_async(err.into())?), None)
        }
    };
    let stdin = match child.stdin.take() {
        Some(w) => Some(
            pipe::Sender::from_owned_fd(w.into())
                .map_err(|e| error(ErrorKind::Io, format!("cannot feed input: {e}")))?,
        ),
        None => stdin,
    };
    drop(child); // never waited on through std: the reaper owns every exit status
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
        if pid == me {
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
