//! Running one command: `/bin/sh -c` in its own session, output captured with caps as it
//! arrives, killed on timeout or when the engine hangs up (a cancelled call).

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::unix::pipe;

use super::capture::Capture;
use super::protocol::{ErrorKind, ExecOutcome, ExecSpec, Response, Stream, write_frame};
use super::reaper::{Exit, Reaper};

/// After the shell exits, how long to keep reading output that background children may still
/// hold open, before answering anyway.
const LINGER: Duration = Duration::from_millis(100);
/// Working directory when none is given.
pub const DEFAULT_CWD: &str = "/root";

/// The environment every command starts from (before sandbox and per-call variables).
pub fn base_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
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

fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        kind,
        message: message.into(),
    }
}

/// Runs `spec`. `conn` is the engine's connection: streamed output goes there, and its closing
/// means the call was cancelled.
pub async fn run<C>(
    spec: ExecSpec,
    sandbox_env: &[(String, String)],
    reaper: &Reaper,
    conn: &mut C,
) -> Response
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let cwd = spec.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_string());
    if cwd.contains('\0') {
        return error(ErrorKind::InvalidArgument, "cwd contains a NUL byte");
    }
    match std::fs::metadata(&cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return error(
                ErrorKind::InvalidArgument,
                format!("cwd {cwd} is not a directory"),
            );
        }
        Err(_) => {
            return error(
                ErrorKind::InvalidArgument,
                format!("cwd {cwd} does not exist; create it first (mkdir -p) or omit cwd"),
            );
        }
    }
    if spec.command.contains('\0') {
        return error(ErrorKind::InvalidArgument, "command contains a NUL byte");
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return error(
                ErrorKind::InvalidArgument,
                format!("invalid environment variable name or value: {k:?}"),
            );
        }
    }

    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&spec.command)
        .current_dir(&cwd)
        .env_clear()
        .envs(base_env())
        .envs(sandbox_env.iter().cloned())
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: runs in the forked child before exec; setsid is async-signal-safe. A new session
    // gives the command its own process group (killed as a unit on timeout) and no controlling
    // terminal (so TIOCSTI has nothing to inject into).
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let hint = if e.raw_os_error() == Some(libc::EAGAIN) {
                " (the sandbox's process limit is reached; kill some processes)"
            } else {
                ""
            };
            return error(
                ErrorKind::Io,
                format!("cannot start the command: {e}{hint}"),
            );
        }
    };
    let pid = child.id() as i32;
    let exit_rx = reaper.watch(pid);
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return error(ErrorKind::Io, "the command's output pipes are missing");
    };
    drop(child); // never waited on through std: the reaper owns every exit status

    let pipe_inodes = [inode_of(&out), inode_of(&err)];
    let (mut out, mut err) = match (to_async(out.into()), to_async(err.into())) {
        (Ok(o), Ok(e)) => (Some(o), Some(e)),
        _ => {
            kill_group(pid);
            return error(ErrorKind::Io, "cannot watch the command's output");
        }
    };

    let max = spec.max_output_bytes as usize;
    let mut stdout = Capture::new(max);
    let mut stderr = Capture::new(max);
    let mut exit: Option<Exit> = None;
    let mut exit_rx = Some(exit_rx);
    let mut timed_out = false;
    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms));
    tokio::pin!(deadline);
    let linger = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(linger);
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    let mut hangup = [0u8; 1];

    while out.is_some() || err.is_some() || exit.is_none() {
        tokio::select! {
            n = read_some(&mut out, &mut buf_out) => {
                match n {
                    Some(n) => {
                        stdout.push(&buf_out[..n]);
                        if spec.stream {
                            let data = String::from_utf8_lossy(&buf_out[..n]).into_owned();
                            let _ = write_frame(conn, &Response::Output { stream: Stream::Stdout, data }).await;
                        }
                    }
                    None => out = None,
                }
            }
            n = read_some(&mut err, &mut buf_err) => {
                match n {
                    Some(n) => {
                        stderr.push(&buf_err[..n]);
                        if spec.stream {
                            let data = String::from_utf8_lossy(&buf_err[..n]).into_owned();
                            let _ = write_frame(conn, &Response::Output { stream: Stream::Stderr, data }).await;
                        }
                    }
                    None => err = None,
                }
            }
            status = wait_exit(&mut exit_rx), if exit_rx.is_some() => {
                exit_rx = None;
                exit = Some(status.unwrap_or(Exit::Signal(libc::SIGKILL)));
                linger.as_mut().reset(tokio::time::Instant::now() + LINGER);
            }
            () = &mut deadline, if !timed_out && exit.is_none() => {
                timed_out = true;
                kill_group(pid);
                kill_pipe_holders(&pipe_inodes);
            }
            () = &mut linger, if exit.is_some() => {
                // Background children still hold the pipes: answer now, keep draining quietly
                // so they never die of SIGPIPE.
                if timed_out {
                    kill_pipe_holders(&pipe_inodes);
                }
                for p in [out.take(), err.take()].into_iter().flatten() {
                    tokio::task::spawn_local(drain(p));
                }
            }
            r = conn.read(&mut hangup) => {
                if matches!(r, Ok(0) | Err(_)) {
                    // The engine hung up: the call was cancelled. Kill what it started.
                    kill_group(pid);
                    kill_pipe_holders(&pipe_inodes);
                    return error(ErrorKind::Io, "cancelled");
                }
            }
        }
    }

    let (exit_code, signal) = match exit {
        Some(Exit::Code(c)) => (Some(c), None),
        Some(Exit::Signal(s)) => (None, Some(s)),
        None => (None, None),
    };
    Response::Exec(ExecOutcome {
        exit_code,
        signal,
        truncated: stdout.truncated() || stderr.truncated(),
        stdout: stdout.render(),
        stderr: stderr.render(),
        stdout_bytes: stdout.total(),
        stderr_bytes: stderr.total(),
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

async fn wait_exit(
    rx: &mut Option<tokio::sync::oneshot::Receiver<Exit>>,
) -> Result<Exit, tokio::sync::oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

async fn read_some(p: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> Option<usize> {
    match p {
        Some(p) => match p.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

async fn drain(mut p: pipe::Receiver) {
    let mut buf = vec![0u8; 16 * 1024];
    while matches!(p.read(&mut buf).await, Ok(n) if n > 0) {}
}

fn to_async(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(fd)
}

fn inode_of(fd: &impl std::os::fd::AsFd) -> u64 {
    nix::sys::stat::fstat(fd).map(|s| s.st_ino).unwrap_or(0)
}

/// SIGKILL to the command's process group (its session leader's pid).
pub fn kill_group(pid: i32) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
}

/// SIGKILL to every process still holding one of these pipes: descendants that left the
/// command's process group (setsid, double fork) but would otherwise keep the call open.
pub fn kill_pipe_holders(inodes: &[u64]) {
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
