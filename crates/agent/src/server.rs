//! The agent's event loop: accept a connection, read one request, answer it.
//!
//! Each connection is its own task, and file operations run on a small pool of blocking threads,
//! so no single request can stall the others: a slow disk, a huge directory or a special file
//! delays only the call that touched it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;

use tokio::net::UnixStream;

use super::desktop::Desktop;
use super::jobs::Jobs;
use super::reaper::Reaper;
use super::repl::Contexts;
use super::watch::Watchers;
use super::{exec, files, listing, live};
use sandbox_mcp_protocol::{
    Adopt, AgentError, Call, ConnectPort, CreateContext, Delete, DeleteContext, Done,
    EgressHandover, ErrorKind, ExecSpec, Frame, HandOverEgress, Input, JobStatus, KillAll, KillJob,
    ListContexts, ListDir, ListJobs, ListTrees, MakePipes, Move, Ping, Pong, PortConnected,
    ReadFile, Request, RunCodeSpec, Screenshot, StartDesktop, StartJob, Stat, Unwatch, WatchDir,
    WatchEvents, WriteFile, ZipDir, read_frame, write_frame,
};

struct State {
    reaper: Reaper,
    /// Unprivileged: the engine's egress sockets, made in this namespace, or why there are none.
    egress: Option<Result<[OwnedFd; 2], String>>,
    /// Variables set at sandbox creation: the agent's own environment.
    env: Vec<(String, String)>,
    contexts: Contexts,
    jobs: Jobs,
    desktop: Desktop,
    /// Pipes made for restored trees not yet taken over.
    pending: live::Pending,
    watchers: Rc<Watchers>,
}

/// Threads for file operations (they block in the kernel; the event loop must not).
const FILE_THREADS: usize = 8;

/// Reports why the agent cannot start on `status_fd` (the launcher waits for it), and closes it.
pub fn report_failure(status_fd: RawFd, error: &str) {
    use std::io::Write;
    // SAFETY: the launcher passes the write end of a pipe at this number, for us alone.
    let mut status = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(status_fd) });
    let _ = writeln!(status, "{error}");
}

/// Runs the agent until the sandbox is killed: listens on `listen_fd`, and reports `ready` (or
/// why it cannot start) on `status_fd`, which it then closes. `env` is the sandbox's own
/// environment, which every command starts with.
///
/// The event loop is single-threaded on purpose: an idle sandbox should cost little memory, and
/// the reaper relies on registering a child before its exit can be observed. (Only file
/// operations, which start no process, run on other threads.)
pub fn run(
    listen_fd: RawFd,
    status_fd: RawFd,
    env: Vec<(String, String)>,
    egress: Option<Result<[OwnedFd; 2], String>>,
) -> anyhow::Result<()> {
    // SAFETY: the launcher passes the write end of a pipe at this number, for us alone.
    let status = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(status_fd) });
    // Never inherited by a command, even one started before the report is written.
    let _ = nix::fcntl::fcntl(
        &status,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let mut status = Some(status);
    let result = serve(listen_fd, &mut status, env, egress);
    if let (Err(e), Some(mut status)) = (&result, status) {
        use std::io::Write;
        let _ = writeln!(status, "{e:#}");
    }
    result
}

fn serve(
    listen_fd: RawFd,
    status: &mut Option<std::fs::File>,
    env: Vec<(String, String)>,
    egress: Option<Result<[OwnedFd; 2], String>>,
) -> anyhow::Result<()> {
    // Owned from here on: the launcher passed it at a fixed number.
    // SAFETY: the launcher guarantees `listen_fd` is an open, listening unix socket that nothing
    // else in this process owns.
    let fd = unsafe { OwnedFd::from_raw_fd(listen_fd) };
    // Close-on-exec: the launcher passed it inheritable, and no command the agent runs may
    // inherit the socket (it could accept the engine's connections).
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    std_listener.set_nonblocking(true)?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(FILE_THREADS)
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = tokio::net::UnixListener::from_std(std_listener)?;
        let state = Rc::new(State {
            reaper: Reaper::start()?,
            egress,
            env,
            contexts: Contexts::default(),
            jobs: Jobs::default(),
            desktop: Desktop::default(),
            pending: live::Pending::default(),
            watchers: Rc::new(Watchers::default()),
        });
        if let Some(mut pipe) = status.take() {
            use std::io::Write;
            // Dropping the pipe closes it: the launcher waits for that.
            writeln!(pipe, "ready")?;
        }
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    tokio::task::spawn_local(handle(conn, state.clone()));
                }
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    let _ = e;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// Sends one byte over the engine's connection carrying `fds` (if any), ahead of the reply frame.
fn send_fds(conn_fd: RawFd, fds: &[RawFd]) -> nix::Result<usize> {
    let rights = [nix::sys::socket::ControlMessage::ScmRights(fds)];
    nix::sys::socket::sendmsg::<()>(
        conn_fd,
        &[std::io::IoSlice::new(b"f")],
        if fds.is_empty() { &[] } else { &rights },
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
}

async fn handle(mut conn: UnixStream, state: Rc<State>) {
    let request: Request = match read_frame(&mut conn).await {
        Ok(Some(r)) => r,
        _ => return,
    };
    let request = match request {
        // The connection is the process's stdio from here on.
        Request::Attach(spec) => {
            return super::attach::serve(spec, &state.env, &state.reaper, &state.jobs, conn).await;
        }
        other => other,
    };
    let conn_fd = std::os::fd::AsRawFd::as_raw_fd(&conn);
    let (mut rd, mut wr) = conn.split();
    let (env, reaper) = (&state.env, &state.reaper);
    // Each arm answers with its request's own reply type: `reply::<R>` takes exactly
    // `Result<R::Reply, AgentError>`, so a handler answering with another type does not compile.
    match request {
        Request::HandOverEgress(_) => {
            let (fds, why_not) = match &state.egress {
                Some(Ok(fds)) => (vec![fds[0].as_raw_fd(), fds[1].as_raw_fd()], None),
                Some(Err(why)) => (Vec::new(), Some(why.clone())),
                None => (
                    Vec::new(),
                    Some("the launcher set up this sandbox's network".into()),
                ),
            };
            // Copies: the agent keeps its own, so an engine that restarts can ask again.
            if send_fds(conn_fd, &fds).is_err() {
                return;
            }
            reply::<HandOverEgress>(&mut wr, Ok(EgressHandover { why_not })).await
        }
        Request::ConnectPort(ConnectPort { port }) => {
            let connected =
                tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).await;
            let (fds, answer) = match &connected {
                Ok(stream) => (
                    vec![stream.as_raw_fd()],
                    PortConnected {
                        refused: false,
                        error: None,
                    },
                ),
                Err(e) => (
                    Vec::new(),
                    PortConnected {
                        refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                        error: Some(e.to_string()),
                    },
                ),
            };
            if send_fds(conn_fd, &fds).is_err() {
                return;
            }
            // The engine holds its own copy now; the agent's closes here.
            drop(connected);
            reply::<ConnectPort>(&mut wr, Ok(answer)).await
        }
        Request::Ping(_) => {
            let pong = Pong {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            };
            reply::<Ping>(&mut wr, Ok(pong)).await
        }
        Request::Exec(spec) => {
            let outcome = exec::run(spec, env, reaper, &mut rd, &mut wr).await;
            reply::<ExecSpec>(&mut wr, outcome).await
        }
        Request::RunCode(spec) => {
            let outcome = state
                .contexts
                .run(spec, env, reaper, &mut rd, &mut wr)
                .await;
            reply::<RunCodeSpec>(&mut wr, outcome).await
        }
        Request::CreateContext(r) => {
            let created = state.contexts.create(r, env, reaper).await;
            reply::<CreateContext>(&mut wr, created).await
        }
        Request::ListContexts(_) => reply::<ListContexts>(&mut wr, Ok(state.contexts.list())).await,
        Request::DeleteContext(r) => {
            let deleted = state.contexts.delete(r).await;
            reply::<DeleteContext>(&mut wr, deleted).await
        }
        Request::StartJob(r) => reply::<StartJob>(&mut wr, state.jobs.start(r, env, reaper)).await,
        Request::JobStatus(r) => reply::<JobStatus>(&mut wr, state.jobs.status(r)).await,
        Request::KillJob(r) => reply::<KillJob>(&mut wr, state.jobs.kill(r)).await,
        Request::StartDesktop(r) => {
            reply::<StartDesktop>(&mut wr, state.desktop.ensure(r.screen, reaper).await).await
        }
        Request::Screenshot(r) => {
            let shot = state
                .desktop
                .screenshot(r.screen, r.scale, r.settle, reaper)
                .await;
            reply::<Screenshot>(&mut wr, shot).await
        }
        Request::Input(r) => {
            reply::<Input>(
                &mut wr,
                state.desktop.input(r.screen, r.action, reaper).await,
            )
            .await
        }
        Request::ListJobs(_) => reply::<ListJobs>(&mut wr, Ok(state.jobs.list())).await,
        Request::ReadFile(r) => {
            reply::<ReadFile>(&mut wr, on_file_thread(move || files::read_file(r)).await).await
        }
        Request::WriteFile(r) => {
            let done = on_file_thread(move || files::write_file(r)).await;
            state.watchers.pump();
            reply::<WriteFile>(&mut wr, done).await
        }
        Request::Stat(r) => {
            reply::<Stat>(&mut wr, on_file_thread(move || listing::stat(r)).await).await
        }
        Request::ListDir(r) => {
            reply::<ListDir>(&mut wr, on_file_thread(move || listing::list_dir(r)).await).await
        }
        Request::Delete(r) => {
            let done = on_file_thread(move || files::delete(r)).await;
            state.watchers.pump();
            reply::<Delete>(&mut wr, done).await
        }
        Request::Move(r) => {
            let done = on_file_thread(move || files::rename(r)).await;
            state.watchers.pump();
            reply::<Move>(&mut wr, done).await
        }
        Request::WatchDir(r) => reply::<WatchDir>(&mut wr, state.watchers.watch(r)).await,
        Request::WatchEvents(r) => reply::<WatchEvents>(&mut wr, state.watchers.events(r)).await,
        Request::Unwatch(r) => reply::<Unwatch>(&mut wr, state.watchers.unwatch(&r.watch_id)).await,
        Request::ZipDir(r) => {
            reply::<ZipDir>(&mut wr, on_file_thread(move || files::zip_dir(r)).await).await
        }
        Request::Attach(_) => {}
        Request::ListTrees(_) => {
            reply::<ListTrees>(&mut wr, Ok(live::list(&state.contexts, &state.jobs))).await
        }
        Request::MakePipes(MakePipes { key, roles }) => {
            let made = state.pending.make(key, &roles);
            let raw: Vec<RawFd> = match &made {
                Ok(fds) => fds.iter().map(|f| f.as_raw_fd()).collect(),
                Err(_) => Vec::new(),
            };
            if send_fds(conn_fd, &raw).is_err() {
                return;
            }
            // The engine holds the process's ends now; the agent's copies close here.
            reply::<MakePipes>(&mut wr, made.map(|_| Done {})).await
        }
        Request::Adopt(Adopt { key, tree, pid }) => {
            let ends = state.pending.take(&key);
            let adopted = match (ends, pid) {
                (Some(ends), Some(pid)) => {
                    let adopted = live::adopt(&state.contexts, &state.jobs, tree, pid, ends);
                    if adopted.is_err() {
                        // Restored but not taken over: nothing would ever stop it.
                        super::spawn::kill_group(pid);
                    }
                    adopted
                }
                (_, None) => Ok(()),
                (None, Some(_)) => Err(AgentError::new(
                    ErrorKind::NotFound,
                    format!("no pipes were made under {key}"),
                )),
            };
            reply::<Adopt>(&mut wr, adopted.map(|()| Done {})).await
        }
        Request::KillAll(_) => {
            // From PID 1, kill(-1) reaches every other process in the namespace.
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), nix::sys::signal::SIGKILL);
            reply::<KillAll>(&mut wr, Ok(Done {})).await
        }
    }
}

/// Sends the answer to a request of type `C`: its reply, or the error.
async fn reply<C: Call>(
    wr: &mut (impl tokio::io::AsyncWrite + Unpin),
    result: Result<C::Reply, AgentError>,
) {
    let frame = match result {
        Ok(r) => Frame::Reply(r),
        Err(e) => Frame::Error(e),
    };
    let _ = write_frame(wr, &frame).await;
}

/// Runs a file operation on the blocking pool.
async fn on_file_thread<T: Send + 'static>(
    op: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(op).await.unwrap_or_else(|e| {
        Err(AgentError::new(
            ErrorKind::Io,
            format!("the file operation failed: {e}"),
        ))
    })
}
