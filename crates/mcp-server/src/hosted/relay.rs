//! One hosted server's instance: a sandbox with the server running in it, spoken to in JSON-RPC
//! lines on its stdio. Requests wait for their response by id; everything else the server sends
//! (notifications, its own requests) goes to [`Instance::events`] for the session to route.
//!
//! The server is untrusted: its lines are bounded ([`MAX_LINE`]), what it sends that is not
//! JSON-RPC is kept with its stderr's tail for the error that names it, and its exit fails
//! every waiting request with its status and that tail.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use super::ServerSpec;
use super::attach::{Input, Output, attach};
use crate::backend::Backend;
use sandbox_mcp_protocol::Chunk;
use sandbox_mcp_sys::lock;

/// Longest JSON-RPC line a server may write (a tool result with images can be large).
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// How much of the server's stderr is kept for errors.
const TAIL: usize = 2048;
/// Messages from the server waiting for the session to take them; beyond this the oldest go.
const EVENTS: usize = 1024;

/// How an instance ended.
#[derive(Debug, Clone)]
pub struct Ended {
    pub why: String,
}

/// A running server in its sandbox.
pub struct Instance {
    pub name: String,
    pub sandbox_id: String,
    pub tenant: Option<String>,
    backend: Backend,
    input: tokio::sync::Mutex<Input>,
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    events: tokio::sync::Mutex<mpsc::Receiver<Value>>,
    ended: watch::Receiver<Option<Ended>>,
    tail: Arc<Mutex<VecDeque<u8>>>,
}

/// A request's key: its id as JSON text (`1` and `"1"` are different ids).
fn key(id: &Value) -> String {
    id.to_string()
}

impl Instance {
    /// Starts server `name` as `spec` says, in a new sandbox of `tenant`'s.
    pub async fn start(
        backend: &Backend,
        tenant: Option<&str>,
        name: &str,
        spec: &ServerSpec,
    ) -> Result<Arc<Self>, String> {
        let handle = backend.client(tenant).await.map_err(|e| e.text())?;
        let request: sandbox_mcp_api::types::CreateSandboxRequest =
            serde_json::from_value(spec.sandbox_request(name))
                .map_err(|e| format!("invalid server settings: {e}"))?;
        let sandbox = handle
            .client
            .create_sandbox()
            .body(request)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "cannot create a sandbox for server {name}: {}",
                    crate::call::error_text(e)
                )
            })?
            .into_inner();
        let sandbox_id = sandbox.id.to_string();
        let attach_request: Result<sandbox_mcp_api::types::AttachRequest, _> =
            serde_json::from_value(spec.attach_request());
        let attached = match attach_request {
            Ok(r) => attach(&handle.client, &sandbox_id, &r).await.map_err(|e| {
                format!(
                    "cannot start server {name} (`{}`): {e}",
                    spec.command.join(" ")
                )
            }),
            Err(e) => Err(format!("invalid command of server {name}: {e}")),
        };
        let attached = match attached {
            Ok(a) => a,
            Err(e) => {
                let _ = handle
                    .client
                    .kill_sandbox()
                    .sandbox_id(sandbox_id.as_str())
                    .send()
                    .await;
                return Err(e);
            }
        };
        let (events_tx, events_rx) = mpsc::channel(EVENTS);
        let (ended_tx, ended_rx) = watch::channel(None);
        let instance = Arc::new(Self {
            name: name.to_string(),
            sandbox_id,
            tenant: tenant.map(String::from),
            backend: backend.clone(),
            input: tokio::sync::Mutex::new(attached.input),
            pending: Mutex::new(HashMap::new()),
            events: tokio::sync::Mutex::new(events_rx),
            ended: ended_rx,
            tail: Arc::new(Mutex::new(VecDeque::new())),
        });
        tokio::spawn(read(
            Arc::downgrade(&instance),
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
        if let Some(ended) = self.ended() {
            return Err(ended.why);
        }
        let mut line = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        line.push(b'\n');
        let written = self.input.lock().await.write(&line).await;
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

    /// Sends request `message` and waits (at most `deadline`) for its response.
    pub async fn request(&self, message: &Value, deadline: Duration) -> Result<Value, String> {
        let id = key(&message["id"]);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id.clone(), tx);
        if let Err(e) = self.send(message).await {
            lock(&self.pending).remove(&id);
            return Err(e);
        }
        let mut ended = self.ended.clone();
        tokio::select! {
            r = rx => r.map_err(|_| self.ended().map(|e| e.why).unwrap_or_else(|| "the server went away".into())),
            _ = ended.wait_for(Option::is_some) => {
                lock(&self.pending).remove(&id);
                Err(self.ended().map(|e| e.why).unwrap_or_default())
            }
            () = tokio::time::sleep(deadline) => {
                lock(&self.pending).remove(&id);
                Err(format!(
                    "server {} did not answer `{}` within {} s{}",
                    self.name,
                    message["method"].as_str().unwrap_or("the request"),
                    deadline.as_secs(),
                    self.tail_text()
                ))
            }
        }
    }

    /// The next message the server sent that answers no request of ours.
    pub async fn next_event(&self) -> Option<Value> {
        self.events.lock().await.recv().await
    }

    /// "; the end of its stderr: …", or nothing when it wrote none.
    pub fn tail_text(&self) -> String {
        tail_text(&self.tail)
    }

    /// Kills the instance's sandbox (and with it the server).
    pub async fn kill(&self) {
        if let Ok(handle) = self.backend.client(self.tenant.as_deref()).await {
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
    mut output: Output,
    events: mpsc::Sender<Value>,
    ended: watch::Sender<Option<Ended>>,
    tail: Arc<Mutex<VecDeque<u8>>>,
) {
    let mut line: Vec<u8> = Vec::new();
    let name = instance
        .upgrade()
        .map(|i| i.name.clone())
        .unwrap_or_default();
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
                    let Some(i) = instance.upgrade() else { return };
                    dispatch(&i, &std::mem::take(&mut line), &events, &tail);
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
    line: &[u8],
    events: &mpsc::Sender<Value>,
    tail: &Mutex<VecDeque<u8>>,
) {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return;
    }
    let Ok(message) = serde_json::from_slice::<Value>(trimmed) else {
        // Not JSON: a server that prints to stdout breaks its own protocol; keep it for errors.
        let shown = &trimmed[..trimmed.len().min(200)];
        keep(
            tail,
            format!(
                "\n[stdout, not JSON-RPC] {}\n",
                String::from_utf8_lossy(shown)
            )
            .as_bytes(),
        );
        return;
    };
    let is_response = message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some());
    if is_response {
        let waiter = lock(&instance.pending).remove(&key(&message["id"]));
        match waiter {
            Some(tx) => {
                let _ = tx.send(message);
            }
            None => tracing::debug!(server = %instance.name, "a response nobody waits for"),
        }
        return;
    }
    if events.try_send(message).is_err() {
        tracing::warn!(server = %instance.name, "the session takes no messages from the server; one was dropped");
    }
}

/// A JSON-RPC error response for request `id`.
pub fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}
