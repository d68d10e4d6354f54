//! The agent in a Kubernetes pod (the `kubernetes` driver), and the bridge that carries the
//! engine's connections to it.
//!
//! In a pod the container runtime has already built the sandbox (namespaces, cgroup limits,
//! seccomp, dropped capabilities), so the agent does none of the namespaces driver's setup: it is
//! the container's PID 1, listens on a unix socket in its own volume and serves the same protocol.
//! The boundary that holds hostile code is the pod; commands run with the agent's ids.
//!
//! The engine cannot reach a pod's address (it talks to the API server only), and a new exec
//! through the API server costs 50-90 ms. So each engine replica keeps one exec per pod running
//! `__agent-mux`, which multiplexes the engine's many short connections over that exec's
//! stdin/stdout (see [`sandbox_mcp_protocol::mux`] for the frame format) and connects each to the
//! agent's socket.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use tokio::io::AsyncWriteExt;

use sandbox_mcp_protocol::mux::{
    AGENT_SOCKET, CLOSE, DATA, OPEN, frame, read_frame, send_data, write_frames,
};
use tokio::sync::mpsc;

/// The agent image's init container: copies this binary to `dest` (in the pod's shared volume),
/// since the image holds nothing else to copy it with.
pub fn install(dest: Option<std::ffi::OsString>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dest = dest.ok_or_else(|| anyhow::anyhow!("usage: sandbox-mcp __install DEST"))?;
    let tmp = std::path::PathBuf::from(format!("{}.tmp", dest.to_string_lossy()));
    std::fs::copy("/proc/self/exe", &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &dest)?;
    Ok(())
}

/// PID 1 of a sandbox pod: listens on [`AGENT_SOCKET`] and serves the agent protocol. Its own
/// environment (the image's and the pod spec's) is the sandbox's.
pub fn run_agent() -> anyhow::Result<()> {
    let socket = Path::new(AGENT_SOCKET);
    // A restarted container finds its predecessor's socket file in the volume.
    let _ = std::fs::remove_file(socket);
    let listener = std::os::unix::net::UnixListener::bind(socket)?;
    // Only the agent's ids may connect (the mux runs with them too).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k != "SANDBOX_MCP_POD")
        .collect();
    // Commands that name no cwd start where the container does (the image's WORKDIR, or the
    // pod's workingDir). From `/`: root's home as elsewhere, but a non-root uid (`--run-as-user`)
    // cannot enter /root: its $HOME when it can use it, else /tmp — and that is its HOME too.
    let start = std::env::current_dir()
        .ok()
        .filter(|d| d != Path::new("/"))
        .map(|d| d.to_string_lossy().into_owned());
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let home = (!root).then(|| {
        std::env::var("HOME")
            .ok()
            .filter(|h| usable(h))
            .unwrap_or_else(|| "/tmp".to_string())
    });
    if let Some(home) = &home {
        env.retain(|(k, _)| k != "HOME");
        env.push(("HOME".into(), home.clone()));
    }
    super::spawn::set_default_cwd(start.or(home));
    // `server::run` reports readiness on a status descriptor: here nobody waits on one (the
    // engine pings), so it writes to /dev/null.
    let status = OwnedFd::from(std::fs::OpenOptions::new().write(true).open("/dev/null")?);
    let listen: OwnedFd = listener.into();
    super::server::run(into_raw(listen), into_raw(status), env, None)
}

/// Whether this process may enter and write in directory `dir`.
fn usable(dir: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(dir) else {
        return false;
    };
    // SAFETY: `c` is a valid C string that outlives the call.
    Path::new(dir).is_dir() && unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0
}

fn into_raw(fd: OwnedFd) -> RawFd {
    use std::os::fd::IntoRawFd;
    fd.into_raw_fd()
}

/// The bridge an engine replica keeps running in each pod: frames on stdin/stdout, one agent
/// connection per stream. Ends when stdin ends (the engine's exec closed).
pub fn run_mux() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(mux())
}

async fn mux() -> anyhow::Result<()> {
    // SAFETY: 0 and 1 are this process's stdin and stdout, which nothing else here uses.
    let stdin = unsafe { std::fs::File::from_raw_fd(std::io::stdin().as_raw_fd()) };
    let stdout = unsafe { std::fs::File::from_raw_fd(std::io::stdout().as_raw_fd()) };
    // An exec's stdio are pipes: read and written without a thread hop. Anything else (a
    // terminal, a file in a manual test) through tokio's blocking file wrapper.
    let mut input: Box<dyn tokio::io::AsyncRead + Unpin + Send> =
        match tokio::net::unix::pipe::Receiver::from_file(stdin.try_clone()?) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::fs::File::from_std(stdin)),
        };
    let mut output: Box<dyn tokio::io::AsyncWrite + Unpin + Send> =
        match tokio::net::unix::pipe::Sender::from_file(stdout.try_clone()?) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::fs::File::from_std(stdout)),
        };
    // Everything bound for the engine goes through one writer, a frame at a time.
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move { write_frames(&mut rx, &mut output).await });
    let mut conns: HashMap<u32, tokio::net::unix::OwnedWriteHalf> = HashMap::new();
    while let Some((id, kind, payload)) = read_frame(&mut input).await? {
        match kind {
            OPEN => match tokio::net::UnixStream::connect(AGENT_SOCKET).await {
                Ok(conn) => {
                    let (mut read, write) = conn.into_split();
                    conns.insert(id, write);
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        send_data(&mut read, id, &tx).await;
                        let _ = tx.send(frame(id, CLOSE, &[])).await;
                    });
                }
                Err(_) => {
                    let _ = tx.send(frame(id, CLOSE, &[])).await;
                }
            },
            DATA => {
                // The agent reads every request whole; a stream it stopped reading only holds
                // up this bridge's own engine, never another replica's.
                if let Some(w) = conns.get_mut(&id)
                    && w.write_all(&payload).await.is_err()
                {
                    conns.remove(&id);
                }
            }
            _ => {
                conns.remove(&id);
            }
        }
    }
    drop(tx);
    drop(conns);
    let _ = writer.await;
    Ok(())
}
