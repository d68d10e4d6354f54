//! envd's `process` service: processes started through the sandbox's agent as attached
//! processes (the engine's `attach_process`: argv, stdin, stdout, stderr and exit status over
//! one agent connection), with E2B's events.
//!
//! Each process has a task that owns its agent connection for as long as the process lives: it
//! forwards output to the stream attached to it (`Start`, or a later `Connect`), with
//! backpressure, and drops output while none is attached (as envd does: a `Connect` sees output
//! from then on). A client that goes away leaves the process running; `SendSignal` ends it.
//! Processes are listed per sandbox and forgotten when they exit or their sandbox is killed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use sandbox_mcp_protocol::{Attach, Chunk, KillJob, TerminalSize, read_chunk, write_chunk};
use sandbox_mcp_sys::lock;

use crate::Door;
use crate::connect::{self, RpcError};
use crate::envd::sandbox;

/// Events buffered for a slow stream before the process's output waits for it.
const STREAM_BUFFER: usize = 16;
/// Stdin chunks buffered before a `SendInput` waits.
const STDIN_BUFFER: usize = 16;

#[derive(Deserialize, Serialize, Clone, Default, Debug)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// A terminal as envd's calls describe one.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Pty {
    size: Option<TerminalSize>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Selected {
    process: Selector,
    signal: Option<String>,
    input: Option<Input>,
    pty: Option<Pty>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

/// What a process's task passes to the stream attached to it.
enum Event {
    Stdout(Vec<u8>),
    /// Output of a process on a terminal.
    Pty(Vec<u8>),
    Stderr(Vec<u8>),
    End {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// The agent went without an exit status (the sandbox stopped or was killed).
    Lost,
}

struct Process {
    job_id: String,
    tag: Option<String>,
    config: ProcessConfig,
    stdin: mpsc::Sender<Chunk>,
    /// Whether it runs on a terminal.
    terminal: bool,
    /// The stream attached, if any.
    watcher: Arc<Mutex<Option<mpsc::Sender<Event>>>>,
}

/// The processes started through envd, by pid (pids are the sandbox's own; one table for all
/// sandboxes, keyed by sandbox too).
#[derive(Default)]
pub(crate) struct Table {
    processes: Mutex<BTreeMap<(String, u32), Process>>,
}

impl Table {
    pub(crate) fn forget_sandbox(&self, id: &str) {
        lock(&self.processes).retain(|(sandbox, _), _| sandbox != id);
    }

    fn find(&self, sandbox: &str, sel: &Selector) -> Result<u32, RpcError> {
        let processes = lock(&self.processes);
        let found = processes.iter().find(|((s, pid), p)| {
            s == sandbox
                && match (&sel.pid, &sel.tag) {
                    (Some(want), _) => want == pid,
                    (None, Some(tag)) => p.tag.as_ref() == Some(tag),
                    (None, None) => false,
                }
        });
        found.map(|((_, pid), _)| *pid).ok_or_else(|| {
            RpcError::not_found(match (&sel.pid, &sel.tag) {
                (Some(pid), _) => format!("process with pid {pid} not found"),
                (None, Some(tag)) => format!("process with tag {tag} not found"),
                _ => "name a process by pid or tag".to_string(),
            })
        })
    }
}

pub(crate) async fn rpc(
    State(door): State<Arc<Door>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    match method.as_str() {
        "Start" => start(&door, &headers, &body).await,
        "Connect" => reconnect(&door, &headers, &body).await,
        "List" => connect::reply(list(&door, &headers).await),
        "SendSignal" => connect::reply(signal(&door, &headers, &body).await),
        "SendInput" => connect::reply(input(&door, &headers, &body).await),
        "CloseStdin" => connect::reply(close_stdin(&door, &headers, &body).await),
        "Update" => connect::reply(update(&door, &headers, &body).await),
        "StreamInput" => RpcError::new(
            "unimplemented",
            format!("process.Process/{method} is not supported by this engine yet"),
        )
        .into_response(),
        _ => RpcError::new(
            "unimplemented",
            format!("no method process.Process/{method}"),
        )
        .into_response(),
    }
}

/// A command line for the agent's attach: the argv as given (looked up on the sandbox's PATH).
fn argv(config: &ProcessConfig) -> Result<Vec<String>, RpcError> {
    if config.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is empty"));
    }
    let argv: Vec<String> = std::iter::once(config.cmd.clone())
        .chain(config.args.iter().cloned())
        .collect();
    if argv.len() > 4096 || argv.iter().any(|a| a.len() > 1 << 20 || a.contains('\0')) {
        return Err(RpcError::invalid(
            "process.cmd and args: at most 4096 parts of at most 1 MiB each, without NUL",
        ));
    }
    Ok(argv)
}

fn envs(config: &ProcessConfig) -> Result<Vec<(String, String)>, RpcError> {
    config
        .envs
        .iter()
        .map(|(k, v)| {
            if crate::valid_env(k, v) {
                Ok((k.clone(), v.clone()))
            } else {
                Err(RpcError::invalid(format!(
                    "environment variable {:?} is invalid",
                    k.chars().take(64).collect::<String>()
                )))
            }
        })
        .collect()
}

async fn start(door: &Arc<Door>, headers: &HeaderMap, body: &[u8]) -> Response {
    let deadline = deadline_of(headers);
    match start_process(door, headers, body).await {
        Ok((pid, events)) => streaming(pid, events, deadline),
        Err(e) => connect::stream_error(e),
    }
}

async fn start_process(
    door: &Arc<Door>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(u32, mpsc::Receiver<Event>), RpcError> {
    let s = sandbox(door, headers).await.map_err(|r| r.rpc())?;
    let req: StartRequest = connect::stream_request(headers, body)?;
    let terminal = match req.pty {
        Some(Pty { size: Some(size) }) => Some(size),
        Some(Pty { size: None }) => return Err(RpcError::invalid("pty.size is required")),
        None => None,
    };
    let user = crate::user::acting(door, &s.id, crate::user::named(headers)?).await?;
    let config = req.process.unwrap_or_default();
    let spec = Attach {
        argv: argv(&config)?,
        // Without one, the account's home (as envd does).
        cwd: config
            .cwd
            .as_deref()
            .filter(|c| !c.is_empty())
            .map(crate::absolute),
        env: envs(&config)?,
        user: Some(user),
        terminal,
    };
    let attachment = door.manager.agent.attach(&s.id, None, spec).await?;
    let pid = u32::try_from(attachment.attached.pid)
        .map_err(|_| RpcError::new("internal", "the agent gave a negative pid"))?;
    let (stdin_tx, mut stdin_rx) = mpsc::channel::<Chunk>(STDIN_BUFFER);
    let (events_tx, events_rx) = mpsc::channel::<Event>(STREAM_BUFFER);
    let watcher = Arc::new(Mutex::new(Some(events_tx)));
    lock(&door.processes.processes).insert(
        (s.id.clone(), pid),
        Process {
            job_id: attachment.attached.job_id.clone(),
            tag: req.tag.filter(|t| !t.is_empty()),
            config,
            stdin: stdin_tx,
            terminal: terminal.is_some(),
            watcher: watcher.clone(),
        },
    );
    // Without stdin (what the SDKs ask for unless told otherwise) the process reads EOF at once.
    if req.stdin == Some(false) {
        let _ = lock(&door.processes.processes)
            .get(&(s.id.clone(), pid))
            .map(|p| p.stdin.try_send(Chunk::CloseStdin));
    }
    let door = door.clone();
    let sandbox_id = s.id;
    tokio::spawn(async move {
        let held = attachment.attached;
        let (mut rd, mut wr) = tokio::io::split(attachment.conn);
        let writer = async {
            while let Some(chunk) = stdin_rx.recv().await {
                if write_chunk(&mut wr, &chunk).await.is_err() {
                    break;
                }
            }
            // Every sender gone (the process forgotten): nothing more to write; wait for exit.
            std::future::pending::<()>().await;
        };
        let reader = async {
            loop {
                let event = match read_chunk(&mut rd).await {
                    Ok(Some(Chunk::Stdout(b))) if terminal.is_some() => Event::Pty(b),
                    Ok(Some(Chunk::Stdout(b))) => Event::Stdout(b),
                    Ok(Some(Chunk::Stderr(b))) => Event::Stderr(b),
                    Ok(Some(Chunk::Exit { exit_code, signal })) => Event::End { exit_code, signal },
                    Ok(Some(_)) => continue,
                    // The agent went (the sandbox stopped): the process is gone with it.
                    Ok(None) | Err(_) => Event::Lost,
                };
                let last = matches!(event, Event::End { .. } | Event::Lost);
                let target = lock(&watcher).clone();
                if let Some(tx) = target
                    && tx.send(event).await.is_err()
                {
                    // The stream went away: output is dropped until another attaches.
                    let mut w = lock(&watcher);
                    if w.as_ref().is_some_and(|cur| cur.same_channel(&tx)) {
                        *w = None;
                    }
                }
                if last {
                    break;
                }
            }
        };
        tokio::select! {
            () = reader => {}
            () = writer => {}
        }
        lock(&door.processes.processes).remove(&(sandbox_id, pid));
        drop(held);
    });
    Ok((pid, events_rx))
}

/// The stream of a process's events: `start` first, then its output, then `end`. Past
/// `deadline` (the client's `Connect-Timeout-Ms`) the stream ends with `deadline_exceeded`; the
/// process runs on (a later `Connect` or `SendSignal` reaches it), as the SDKs' timeout bounds
/// the command's connection, not the command.
fn streaming(
    pid: u32,
    events: mpsc::Receiver<Event>,
    deadline: Option<tokio::time::Instant>,
) -> Response {
    struct State {
        events: mpsc::Receiver<Event>,
        started: bool,
        done: bool,
    }
    let state = State {
        events,
        started: false,
        done: false,
    };
    let body = futures::stream::unfold(state, move |mut st| async move {
        if st.done {
            return None;
        }
        if !st.started {
            st.started = true;
            let first = connect::message(&serde_json::json!({"event": {"start": {"pid": pid}}}));
            return Some((Ok(first), st));
        }
        let next = match deadline {
            Some(at) => tokio::time::timeout_at(at, st.events.recv()).await.ok(),
            None => Some(st.events.recv().await),
        };
        let Some(event) = next else {
            st.done = true;
            let late = RpcError::new("deadline_exceeded", "the command ran past its timeout");
            return Some((Ok(connect::end(Some(&late))), st));
        };
        let bytes = match event {
            None => {
                st.done = true;
                connect::end(None)
            }
            Some(Event::Stdout(b)) => {
                connect::message(&serde_json::json!({"event": {"data": {"stdout": B64.encode(b)}}}))
            }
            Some(Event::Stderr(b)) => {
                connect::message(&serde_json::json!({"event": {"data": {"stderr": B64.encode(b)}}}))
            }
            Some(Event::Pty(b)) => {
                connect::message(&serde_json::json!({"event": {"data": {"pty": B64.encode(b)}}}))
            }
            Some(Event::End { exit_code, signal }) => {
                st.done = true;
                let (code, status) = match (exit_code, signal) {
                    (Some(c), _) => (c, format!("exit status {c}")),
                    (None, Some(9)) => (-1, "signal: killed".to_string()),
                    (None, Some(s)) => (-1, format!("signal: {s}")),
                    (None, None) => (-1, "unknown".to_string()),
                };
                let mut m = connect::message(&serde_json::json!({"event": {"end": {
                    "exitCode": code,
                    "exited": exit_code.is_some(),
                    "status": status,
                }}}))
                .to_vec();
                m.extend_from_slice(&connect::end(None));
                axum::body::Bytes::from(m)
            }
            // As when envd goes with its sandbox: the stream breaks, and the SDK asks why.
            Some(Event::Lost) => {
                st.done = true;
                return Some((Err(std::io::Error::other("the sandbox stopped")), st));
            }
        };
        Some((Ok(bytes), st))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/connect+json")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// The deadline a Connect call carries (`Connect-Timeout-Ms`), if any.
pub(crate) fn deadline_of(headers: &HeaderMap) -> Option<tokio::time::Instant> {
    let ms: u64 = headers
        .get("connect-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(tokio::time::Instant::now() + Duration::from_millis(ms))
}

/// `Connect`: attaches a new stream to a running process (its output from now on).
async fn reconnect(door: &Arc<Door>, headers: &HeaderMap, body: &[u8]) -> Response {
    let attached = async {
        let s = sandbox(door, headers).await.map_err(|r| r.rpc())?;
        let req: Selected = connect::stream_request(headers, body)?;
        let pid = door.processes.find(&s.id, &req.process)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let processes = lock(&door.processes.processes);
        let p = processes
            .get(&(s.id.clone(), pid))
            .ok_or_else(|| RpcError::not_found(format!("process with pid {pid} not found")))?;
        *lock(&p.watcher) = Some(tx);
        Ok::<_, RpcError>((pid, rx))
    };
    match attached.await {
        Ok((pid, rx)) => streaming(pid, rx, deadline_of(headers)),
        Err(e) => connect::stream_error(e),
    }
}

async fn list(door: &Door, headers: &HeaderMap) -> Result<serde_json::Value, RpcError> {
    let s = sandbox(door, headers).await.map_err(|r| r.rpc())?;
    let processes = lock(&door.processes.processes);
    let listed: Vec<serde_json::Value> = processes
        .iter()
        .filter(|((sandbox, _), _)| *sandbox == s.id)
        .map(|((_, pid), p)| {
            let mut v = serde_json::json!({"config": p.config, "pid": pid});
            if let Some(tag) = &p.tag {
                v["tag"] = tag.clone().into();
            }
            v
        })
        .collect();
    Ok(serde_json::json!({"processes": listed}))
}

async fn signal(
    door: &Door,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let (id, req, pid) = selected(door, headers, body).await?;
    match req.signal.as_deref() {
        Some("SIGNAL_SIGKILL" | "SIGNAL_SIGTERM") | None => {}
        Some(other) => {
            return Err(RpcError::invalid(format!(
                "signal {other} is not supported; send SIGNAL_SIGKILL or SIGNAL_SIGTERM"
            )));
        }
    }
    let job_id = lock(&door.processes.processes)
        .get(&(id.clone(), pid))
        .map(|p| p.job_id.clone())
        .ok_or_else(|| RpcError::not_found(format!("process with pid {pid} not found")))?;
    let kill = KillJob { job_id };
    door.manager
        .agent
        .call(&id, None, kill, Duration::from_secs(30))
        .await?;
    Ok(serde_json::json!({}))
}

/// A unary call naming a process: its sandbox (token checked), the request, and the pid it names.
async fn selected(
    door: &Door,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, Selected, u32), RpcError> {
    let s = sandbox(door, headers).await.map_err(|r| r.rpc())?;
    let req: Selected = connect::request(headers, body)?;
    let pid = door.processes.find(&s.id, &req.process)?;
    Ok((s.id, req, pid))
}

async fn send_chunk(door: &Door, sandbox: &str, pid: u32, chunk: Chunk) -> Result<(), RpcError> {
    let tx = lock(&door.processes.processes)
        .get(&(sandbox.to_string(), pid))
        .map(|p| p.stdin.clone())
        .ok_or_else(|| RpcError::not_found(format!("process with pid {pid} not found")))?;
    tx.send(chunk)
        .await
        .map_err(|_| RpcError::not_found(format!("process with pid {pid} has exited")))
}

async fn input(
    door: &Door,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let (id, req, pid) = selected(door, headers, body).await?;
    // A terminal's input is typed into it, which is its stdin.
    let data = match req.input {
        Some(Input { stdin: Some(b), .. } | Input { pty: Some(b), .. }) => B64
            .decode(b)
            .map_err(|e| RpcError::invalid(format!("input is not base64: {e}")))?,
        _ => return Err(RpcError::invalid("input.stdin or input.pty is required")),
    };
    for piece in data.chunks(sandbox_mcp_protocol::MAX_CHUNK) {
        send_chunk(door, &id, pid, Chunk::Stdin(piece.to_vec())).await?;
    }
    Ok(serde_json::json!({}))
}

async fn close_stdin(
    door: &Door,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let (id, _, pid) = selected(door, headers, body).await?;
    send_chunk(door, &id, pid, Chunk::CloseStdin).await?;
    Ok(serde_json::json!({}))
}

/// `Update`: a new size for a process's terminal.
async fn update(
    door: &Door,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let (id, req, pid) = selected(door, headers, body).await?;
    let Some(Pty { size: Some(size) }) = req.pty else {
        return Err(RpcError::invalid("pty.size is required"));
    };
    if !lock(&door.processes.processes)
        .get(&(id.clone(), pid))
        .is_some_and(|p| p.terminal)
    {
        return Err(RpcError::invalid(format!(
            "process {pid} has no terminal to resize"
        )));
    }
    send_chunk(door, &id, pid, Chunk::Resize(size)).await?;
    Ok(serde_json::json!({}))
}
