//! Attached processes: a command whose stdin, stdout and stderr travel on the engine's
//! connection as chunks (see [`sandbox_mcp_protocol::Chunk`]) — how an MCP server that speaks
//! JSON-RPC on stdio runs in a sandbox.
//!
//! The process is also a job (listed, killed and paged like one), whose log keeps its stderr. Its
//! stdin ends when the engine says so or hangs up; a process still running a few seconds after
//! the engine hung up is killed with its group and anything still holding its pipes.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::accounts;
use super::jobs::Jobs;
use super::reaper::{Exit, Reaper};
use super::spawn::{self, Launch, default_cwd, error};
use sandbox_mcp_protocol::{
    AgentError, Attach, Attached, Chunk, ErrorKind, Frame, read_chunk, write_chunk, write_frame,
};

/// How long a process may run on after its caller hung up (its stdin ended then too).
const HANG_UP_GRACE: Duration = Duration::from_secs(3);
/// How long a write to the process's stdin may wait for it to read.
const STDIN_STALL: Duration = Duration::from_secs(30);
/// How long output is drained after the process exited, from descendants still holding its pipes.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

fn checked(spec: &Attach) -> Result<(), AgentError> {
    let Some(program) = spec.argv.first() else {
        return Err(error(
            ErrorKind::InvalidArgument,
            "no command to run: argv is empty",
        ));
    };
    if program.is_empty() || spec.argv.iter().any(|a| a.contains('\0')) {
        return Err(error(
            ErrorKind::InvalidArgument,
            "the command is empty or contains a NUL byte",
        ));
    }
    Ok(())
}

/// Starts the process and relays its stdio on `conn` until it has exited and its output is
/// drained, then sends its exit status.
pub(crate) async fn serve(
    spec: Attach,
    sandbox_env: &[(String, String)],
    reaper: &Reaper,
    jobs: &Jobs,
    mut conn: UnixStream,
) {
    let account = match spec.user.as_deref().map(accounts::lookup).transpose() {
        Ok(a) => a,
        Err(e) => {
            let _ = write_frame(&mut conn, &Frame::<Attached>::Error(e)).await;
            return;
        }
    };
    // A command run as an account starts in its home, as a login would.
    let cwd = spec.cwd.clone().unwrap_or_else(|| match &account {
        Some(a) if std::path::Path::new(&a.home).is_dir() => a.home.clone(),
        _ => default_cwd().to_string(),
    });
    let started = checked(&spec)
        .and_then(|()| spawn::check(&cwd, &spec.env))
        .and_then(|()| {
            let args: Vec<&str> = spec.argv[1..].iter().map(String::as_str).collect();
            let launch = Launch {
                program: &spec.argv[0],
                args: &args,
                cwd: &cwd,
                env: &[sandbox_env, &spec.env],
                merge_output: false,
                extra_fds: &[],
                stdin_pipe: true,
                user: account.as_ref(),
                terminal: spec.terminal,
            };
            jobs.start_attached(spec.argv.join(" "), &launch, reaper)
        });
    let (mut log, started) = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = write_frame(&mut conn, &Frame::<Attached>::Error(e)).await;
            return;
        }
    };
    let attached = Attached {
        job_id: log.job_id().to_string(),
        pid: log.pid(),
    };
    let (mut rd, mut wr) = conn.into_split();
    let mut connected = write_frame(&mut wr, &Frame::Reply(attached)).await.is_ok();

    // The engine's chunks go to stdin until it closes stdin or hangs up.
    let mut stdin = started.stdin;
    let terminal = started.terminal;
    let mut input = tokio::task::spawn_local(async move {
        while let Ok(Some(chunk)) = read_chunk(&mut rd).await {
            match chunk {
                Chunk::Stdin(data) => {
                    // A process that stops reading its stdin for this long gets no more of it:
                    // the connection is read on, so that the caller hanging up is still seen.
                    if let Some(w) = &mut stdin
                        && !matches!(
                            tokio::time::timeout(STDIN_STALL, w.write_all(&data)).await,
                            Ok(Ok(()))
                        )
                    {
                        stdin = None;
                    }
                }
                Chunk::CloseStdin => stdin = None,
                Chunk::Resize(size) => {
                    if let Some(t) = &terminal {
                        let _ = t.resize(size);
                    }
                }
                // Output and exit chunks are the agent's to send, never to take.
                _ => {}
            }
        }
    });
    let mut hung_up = !connected;

    let mut stdout = Some(started.stdout);
    let mut stderr = started.stderr;
    let mut exit_rx = started.exit;
    let mut exit: Option<Exit> = None;
    let (mut out_buf, mut err_buf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let mut kill_at = if hung_up {
        tokio::time::Instant::now() + HANG_UP_GRACE
    } else {
        far
    };
    let mut drain_until = far;
    loop {
        if exit.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        tokio::select! {
            n = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => {
                match n {
                    Ok(0) | Err(_) => stdout = None,
                    Ok(n) => {
                        if connected {
                            connected = write_chunk(&mut wr, &Chunk::Stdout(out_buf[..n].to_vec())).await.is_ok();
                        }
                    }
                }
            }
            n = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => {
                match n {
                    Ok(0) | Err(_) => stderr = None,
                    Ok(n) => {
                        log.append(&err_buf[..n]);
                        if connected {
                            connected = write_chunk(&mut wr, &Chunk::Stderr(err_buf[..n].to_vec())).await.is_ok();
                        }
                    }
                }
            }
            e = &mut exit_rx, if exit.is_none() => {
                let e = e.unwrap_or(Exit::Signal(libc::SIGKILL));
                log.finish(e);
                exit = Some(e);
                drain_until = tokio::time::Instant::now() + DRAIN_GRACE;
            }
            _ = &mut input, if !hung_up => {
                hung_up = true;
                if exit.is_none() {
                    kill_at = tokio::time::Instant::now() + HANG_UP_GRACE;
                }
            }
            () = tokio::time::sleep_until(kill_at), if exit.is_none() && hung_up => {
                spawn::kill_group(log.pid());
                spawn::kill_pipe_holders(log.pipe_inodes());
                kill_at = far;
            }
            () = tokio::time::sleep_until(drain_until), if exit.is_some() => {
                // Descendants that left the group still hold the pipes: the process is done.
                spawn::kill_pipe_holders(log.pipe_inodes());
                break;
            }
        }
        if !connected && !hung_up {
            hung_up = true;
            kill_at = tokio::time::Instant::now() + HANG_UP_GRACE;
        }
    }
    let (exit_code, signal) = match exit {
        Some(Exit::Code(c)) => (Some(c), None),
        Some(Exit::Signal(s)) => (None, Some(s)),
        Some(Exit::Unknown) => (None, None),
        None => (None, None),
    };
    if connected {
        let _ = write_chunk(&mut wr, &Chunk::Exit { exit_code, signal }).await;
        // The engine hangs up once it has the exit status: read on until then (briefly), so
        // that closing with its stdin unread does not reset the connection under the status.
        let _ = tokio::time::timeout(DRAIN_GRACE, &mut input).await;
    }
    input.abort();
}

/// Reads from a pipe that is still open (a closed one's branch is disabled by its `if`).
async fn read_some(
    pipe: &mut Option<tokio::net::unix::pipe::Receiver>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}
