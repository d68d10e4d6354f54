//! One hosted server's instance: a sandbox with the server running in it, spoken to in JSON-RPC
//! lines on its stdio. Requests wait for their response by id; everything else the server sends
//! (notifications, its own requests) goes to [`Instance::next_event`] for the session to route.
//!
//! The server is untrusted, and the process it costs memory in is shared by every tenant. So
//! its messages are kept as the bytes it wrote, never expanded into a JSON tree larger than
//! they are: a line is at most [`MAX_LINE`] (a response may carry images), a message nobody
//! asked for at most [`MAX_EVENT`], and at most [`EVENTS`] of those wait; what it sends that is
//! not JSON-RPC is kept with its stderr's tail for the error that names it, and its exit fails
//! every waiting request with its status and that tail. Dropping the last handle on an
//! instance kills its sandbox, so a setup abandoned half way (a client that went away) leaves
//! nothing behind.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use super::ServerSpec;
use super::attach::{Input, Output, attach};
use crate::backend::Backend;
use sandbox_mcp_protocol::Chunk;
use sandbox_mcp_sys::lock;

/// Longest JSON-RPC line a server may write (a tool result with images can be large).
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// Longest message a server may send unasked (a notification, its own request): larger ones are
/// dropped, and noted with its stderr.
pub const MAX_EVENT: usize = 1024 * 1024;
/// How much of the server's stderr is kept for errors.
const TAIL: usize = 2048;
/// Messages from the server waiting for the session to take them; beyond this they are dropped.
pub const EVENTS: usize = 32;

/// How an instance ended.
#[derive(Debug, Clone)]
pub struct Ended {
    pub why: String,
}

/// What routing needs of a message: its id and method, and whether it is a response. Every
/// other field is skipped without being kept.
#[derive(Deserialize)]
pub struct Head {
    #[serde(default)]
    pub id: Option<Value>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    result: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

impl Head {
    /// The head of a JSON-RPC message, if `raw` is one (a JSON object).
    pub fn of(raw: &str) -> Option<Head> {
        serde_json::from_str(raw).ok()
    }

    fn is_response(&self) -> bool {
        self.method.is_none() && (self.result.is_some() || self.error.is_some())
    }
}

/// A running server in its sandbox.
pub struct Instance {
    pub name: String,
    pub sandbox_id: String,
    /// Who owns the sandbox: the registration's owner (`None`: the operator's shared server).
    pub owner: Option<String>,
    backend: Backend,
    input: tokio::sync::Mutex<Input>,
    pending: Mutex<HashMap<String, oneshot::Sender<String>>>,
    events: tokio::sync::Mutex<mpsc::Receiver<String>>,
    ended: watch::Receiver<Option<Ended>>,
    tail: Arc<Mutex<VecDeque<u8>>>,
    killed: AtomicBool,
}

/// A request's key: its id as JSON text (`1` and `"1"` are different ids).
fn key(id: &Value) -> String {
    id.to_string()
}

/// Kills sandbox `id` of `owner`, on the runtime, from anywhere (a `Drop` included).
fn kill_later(backend: Backend, owner: Option<String>, id: String) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        if let Ok(handle) = backend.client(owner.as_deref()).await {
            let _ = handle
                .client
                .kill_sandbox()
                .sandbox_id(id.as_str())
                .send()
                .await;
        }
    });
}

impl Drop for Instance {
    fn drop(&mut self) {
        if !self.killed.swap(true, Ordering::AcqRel) {
            kill_later(
                self.backend.clone(),
                self.owner.clone(),
                self.sandbox_id.clone(),
            );
        }
    }
}

impl Instance {
    /// Starts server `name` as `spec` says, in a new sandbox owned by `owner`.
    pub async fn start(
        backend: &Backend,
        owner: Option<&str>,
        name: &str,
        spec: &ServerSpec,
    ) -> Result<Arc<Self>, String> {
        let handle = backend.client(owner).await.map_err(|e| e.text())?;
        let sandbox_id = spec.create_sandbox(&handle.client, name).await?;
        // From here on, the sandbox is killed if this setup goes no further (an error, or a
        // caller that stopped waiting).
        struct Guard(Option<(Backend, Option<String>, String)>);
        impl Drop for Guard {
            fn drop(&mut self) {
                if let Some((b, o, id)) = self.0.take() {
                    kill_later(b, o, id);
                }
            }
        }
        let mut guard = Guard(Some((
            backend.clone(),
            owner.map(String::from),
            sandbox_id.clone(),
        )));
        let attach_request: sandbox_mcp_api::types::AttachRequest =
            serde_json::from_value(spec.attach_request())
                .map_err(|e| format!("invalid command of server {name}: {e}"))?;
        let attached = attach(&handle.client, &sandbox_id, &attach_request)
            .await
            .map_err(|e| {
                format!(
                    "cannot start server {name} (`{}`): {e}",
                    spec.command.join(" ")
                )
            })?;
        guard.0 = None;
        let (events_tx, events_rx) = mpsc::channel(EVENTS);
        let (ended_tx, ended_rx) = watch::channel(None);
        let instance = Arc::new(Self {
            name: name.to_string(),
            sandbox_id,
            owner: owner.map(String::from),
            backend: backend.clone(),
            input: tokio::sync::Mutex::new(attached.input),
            pending: Mutex::new(HashMap::new()),
            events: tokio::sync::Mutex::new(events_rx),
            ended: ended_rx,
            tail: Arc::new(Mutex::new(VecDeque::new())),
            killed: AtomicBool::new(false),
        });
        tokio::spawn(read(
            Arc::downgrade(&instance),
            name.to_string(),
            attached.output,
            events_tx,
            ended_tx,
            instance.tail.clone(),
        ));
        Ok(instance)
    }

    /// Why the instance ended, if it did.
    pub fn ended(&self) -> Option<Ended> {
        self.ended.borrow().clone()
    }

    /// Sends one message (a notification, or a response to the server's request).
    pub async fn send(&self, message: &Value) -> Result<(), String> {
        let mut line = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.send_line(&line).await
    }

    async fn send_line(&self, line: &[u8]) -> Result<(), String> {
        if let Some(ended) = self.ended() {
            return Err(ended.why);
        }
        let written = self.input.lock().await.write(line).await;
        if written.is_ok() {
            return Ok(());
        }
        // The server is going: say how it ended, once its exit status has come.
        let mut ended = self.ended.clone();
        let _ = tokio::time::timeout(Duration::from_secs(5), ended.wait_for(Option::is_some)).await;
        Err(self
            .ended()
            .map(|e| e.why)
            .unwrap_or_else(|| format!("the connection to server {} broke", self.name)))
    }

    /// Sends request `message` and waits (at most `deadline`, sending included) for its
    /// response, as the server wrote it.
    pub async fn request(&self, message: &Value, deadline: Duration) -> Result<String, String> {
        let id = key(&message["id"]);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if pending.contains_key(&id) {
                return Err(format!(
                    "a request with id {id} is already waiting for server {}; ids must be unique among requests in flight",
                    self.name
                ));
            }
            pending.insert(id.clone(), tx);
        }
        let waited = tokio::time::timeout(deadline, async {
            self.send(message).await?;
            let mut ended = self.ended.clone();
            tokio::select! {
                biased;
                r = rx => r.map_err(|_| self.ended().map(|e| e.why).unwrap_or_else(|| "the server went away".into())),
                _ = ended.wait_for(Option::is_some) => Err(self.ended().map(|e| e.why).unwrap_or_default()),
            }
        })
        .await;
        lock(&self.pending).remove(&id);
        match waited {
            Ok(answer) => answer,
            Err(_) => Err(format!(
                "server {} did not answer `{}` within {} s{}",
                self.name,
                message["method"].as_str().unwrap_or("the request"),
                deadline.as_secs(),
                self.tail_text()
            )),
        }
    }

    /// The next message the server sent that answers no request of ours, as it wrote it.
    pub async fn next_event(&self) -> Option<String> {
        self.events.lock().await.recv().await
    }

    /// "; the end of its stderr: …", or nothing when it wrote none.
    pub fn tail_text(&self) -> String {
        tail_text(&self.tail)
    }

    /// Kills the instance's sandbox (and with it the server).
    pub async fn kill(&self) {
        if self.killed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(handle) = self.backend.client(self.owner.as_deref()).await {
            let _ = handle
                .client
                .kill_sandbox()
                .sandbox_id(self.sandbox_id.as_str())
                .send()
                .await;
        }
    }
}

fn tail_text(tail: &Mutex<VecDeque<u8>>) -> String {
    let tail = lock(tail);
    if tail.is_empty() {
        return String::new();
    }
    let bytes: Vec<u8> = tail.iter().copied().collect();
    format!(
        "; the end of its stderr: {}",
        String::from_utf8_lossy(&bytes).trim()
    )
}

fn keep(tail: &Mutex<VecDeque<u8>>, data: &[u8]) {
    let mut tail = lock(tail);
    tail.extend(data);
    while tail.len() > TAIL {
        tail.pop_front();
    }
}

/// Reads the server's output until it ends: responses to their waiters, the rest to `events`.
async fn read(
    instance: std::sync::Weak<Instance>,
    name: String,
    mut output: Output,
    events: mpsc::Sender<String>,
    ended: watch::Sender<Option<Ended>>,
    tail: Arc<Mutex<VecDeque<u8>>>,
) {
    let mut line: Vec<u8> = Vec::new();
    let why = loop {
        let chunk = match output.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => break format!("the connection to server {name} broke: {e}"),
            None => break format!("the connection to server {name} ended"),
        };
        match chunk {
            Chunk::Stdout(data) => {
                let mut rest = &data[..];
                while let Some(at) = rest.iter().position(|b| *b == b'\n') {
                    line.extend_from_slice(&rest[..at]);
                    rest = &rest[at + 1..];
                    // Nobody holds the instance any more: it is being killed (see `Drop`).
                    let Some(i) = instance.upgrade() else { return };
                    dispatch(&i, std::mem::take(&mut line), &events, &tail);
                }
                line.extend_from_slice(rest);
                if line.len() > MAX_LINE {
                    break format!(
                        "server {name} wrote a line of over {} MiB to stdout without ending it; it was stopped",
                        MAX_LINE >> 20
                    );
                }
            }
            Chunk::Stderr(data) => keep(&tail, &data),
            Chunk::Exit { exit_code, signal } => {
                let status = match (exit_code, signal) {
                    (Some(c), _) => format!("exited with status {c}"),
                    (None, Some(s)) => format!("was killed by signal {s}"),
                    (None, None) => "ended".into(),
                };
                break format!("server {name} {status}");
            }
            _ => {}
        }
    };
    let why = format!("{why}{}", tail_text(&tail));
    tracing::info!(server = %name, "hosted server ended: {why}");
    let _ = ended.send(Some(Ended { why }));
    if let Some(i) = instance.upgrade() {
        lock(&i.pending).clear();
        i.kill().await;
    }
}

/// One line from the server: a response to its waiter, a message to the events, anything else
/// kept as a sign of what went wrong.
fn dispatch(
    instance: &Instance,
    line: Vec<u8>,
    events: &mpsc::Sender<String>,
    tail: &Mutex<VecDeque<u8>>,
) {
    let Ok(text) = String::from_utf8(line) else {
        keep(tail, b"\n[stdout, not UTF-8]\n");
        return;
    };
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    let Some(head) = Head::of(text) else {
        // Not JSON-RPC: a server that prints to stdout breaks its own protocol; keep it for errors.
        let shown: String = text.chars().take(200).collect();
        keep(
            tail,
            format!("\n[stdout, not JSON-RPC] {shown}\n").as_bytes(),
        );
        return;
    };
    if head.is_response() {
        let id = head.id.as_ref().map(key).unwrap_or_default();
        let waiter = lock(&instance.pending).remove(&id);
        match waiter {
            Some(tx) => {
                let _ = tx.send(text.to_string());
            }
            None => tracing::debug!(server = %instance.name, "a response nobody waits for"),
        }
        return;
    }
    if text.len() > MAX_EVENT {
        keep(
            tail,
            format!(
                "\n[a message of {} bytes nobody asked for was dropped: the limit is {} KiB]\n",
                text.len(),
                MAX_EVENT >> 10
            )
            .as_bytes(),
        );
        return;
    }
    if events.try_send(text.to_string()).is_err() {
        tracing::warn!(server = %instance.name, "the session takes no messages from the server; one was dropped");
    }
}

/// A JSON-RPC error response for request `id`.
pub fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}
