//! One MCP session of a hosted server: its instance (its own sandbox and server process), and
//! the routing of what the server sends that answers no request of the client's — to the
//! client's most recent open request stream, else its GET stream, else kept (boundedly) for the
//! next GET. The server's own requests go to the client only if the client declared the
//! capability they need; otherwise the server gets an error at once. The registry of sessions
//! and the warm pools are [`super::sessions`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

use super::relay::{Head, Instance, error_response};
use super::sessions::HostedServer;
use sandbox_mcp_sys::lock;

/// Protocol revisions the outside speaks, newest last (2026-07-28 is stateless).
pub const SERVED_VERSIONS: [&str; 3] = ["2025-06-18", "2025-11-25", "2026-07-28"];
/// What a warm instance is initialized with; the server answers with its own if it differs.
pub(super) const INNER_VERSION: &str = "2025-11-25";
/// Messages kept for a client with no stream open (each at most `relay::MAX_EVENT`).
const BACKLOG: usize = 32;
/// Messages waiting in one client stream.
const STREAM: usize = 32;

/// What goes to a client's stream: a message from the server, or the response that ends it,
/// each as the server wrote it.
pub enum Item {
    Event(String),
    Final(String),
}

#[derive(Default)]
struct Streams {
    /// Open request streams, newest last.
    requests: Vec<(u64, mpsc::Sender<Item>)>,
    get: Option<mpsc::Sender<Item>>,
    backlog: VecDeque<String>,
    next: u64,
}

pub struct Session {
    pub id: String,
    pub tenant: Option<String>,
    pub server: HostedServer,
    pub instance: Arc<Instance>,
    /// The client's `initialize` capabilities.
    client_capabilities: Value,
    /// The warm pool sent `notifications/initialized` already.
    pre_initialized: bool,
    /// For a server that speaks Streamable HTTP itself: the way to it.
    pub upstream: Option<super::upstream::Upstream>,
    last_seen: Mutex<Instant>,
    /// Requests of the client in flight: a session with one is not idle.
    inflight: AtomicUsize,
    streams: Mutex<Streams>,
    router: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The capability a request from the server needs of the client.
fn needed_capability(method: &str) -> Option<&'static str> {
    match method {
        "sampling/createMessage" => Some("sampling"),
        "elicitation/create" => Some("elicitation"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

impl Session {
    pub(super) fn new(
        tenant: Option<String>,
        server: HostedServer,
        instance: Arc<Instance>,
        client_capabilities: Value,
        pre_initialized: bool,
        upstream: Option<super::upstream::Upstream>,
    ) -> Arc<Self> {
        let session = Arc::new(Self {
            id: session_id(),
            tenant,
            server,
            instance,
            client_capabilities,
            pre_initialized,
            upstream,
            last_seen: Mutex::new(Instant::now()),
            inflight: AtomicUsize::new(0),
            streams: Mutex::new(Streams::default()),
            router: Mutex::new(None),
        });
        let weak = Arc::downgrade(&session);
        let instance = session.instance.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = instance.next_event().await {
                let Some(session) = weak.upgrade() else {
                    return;
                };
                // A server that speaks HTTP logs on stdout: nothing of it is the client's.
                if session.upstream.is_none() {
                    session.route(message).await;
                }
            }
        });
        *lock(&session.router) = Some(task);
        session
    }

    pub fn touch(&self) {
        *lock(&self.last_seen) = Instant::now();
    }

    /// How long since the client's last request ended (zero while one is in flight).
    pub(super) fn idle_for(&self) -> Duration {
        if self.inflight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        lock(&self.last_seen).elapsed()
    }

    /// A message from the server for the client.
    async fn route(&self, message: String) {
        let Some(head) = Head::of(&message) else {
            return;
        };
        if let (Some(method), Some(id)) = (head.method.as_deref(), head.id.as_ref())
            && let Some(capability) = needed_capability(method)
            && self.client_capabilities.get(capability).is_none()
        {
            let refusal = error_response(
                id,
                -32601,
                &format!(
                    "the client did not declare the `{capability}` capability, so `{method}` cannot reach it"
                ),
            );
            let _ = self.instance.send(&refusal).await;
            return;
        }
        let mut streams = lock(&self.streams);
        streams.requests.retain(|(_, tx)| !tx.is_closed());
        if let Some((_, tx)) = streams.requests.last()
            && tx.try_send(Item::Event(message.clone())).is_ok()
        {
            return;
        }
        if let Some(tx) = &streams.get
            && tx.try_send(Item::Event(message.clone())).is_ok()
        {
            return;
        }
        streams.get = None;
        if streams.backlog.len() >= BACKLOG {
            streams.backlog.pop_front();
        }
        streams.backlog.push_back(message);
    }

    /// Opens a stream for one request; messages from the server go there while it is open.
    fn open_request_stream(&self) -> (u64, mpsc::Receiver<Item>, mpsc::Sender<Item>) {
        let (tx, rx) = mpsc::channel(STREAM);
        let mut streams = lock(&self.streams);
        streams.next += 1;
        let n = streams.next;
        streams.requests.push((n, tx.clone()));
        (n, rx, tx)
    }

    fn close_request_stream(&self, n: u64) {
        lock(&self.streams).requests.retain(|(k, _)| *k != n);
    }

    /// The GET stream: what was kept for the client first, then what comes.
    pub fn open_get_stream(&self) -> mpsc::Receiver<Item> {
        let (tx, rx) = mpsc::channel(BACKLOG + 16);
        let mut streams = lock(&self.streams);
        for message in streams.backlog.drain(..) {
            let _ = tx.try_send(Item::Event(message));
        }
        streams.get = Some(tx);
        rx
    }

    /// Forwards request `message`; its response and whatever the server says meanwhile come on
    /// the returned receiver, ending with [`Item::Final`].
    pub fn request(self: &Arc<Self>, message: Value, deadline: Duration) -> mpsc::Receiver<Item> {
        let (n, rx, tx) = self.open_request_stream();
        let session = self.clone();
        self.inflight.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let id = message["id"].clone();
            let answer = match session
                .instance
                .request(&inner_message(&message), deadline)
                .await
            {
                Ok(response) => response,
                Err(why) => error_response(&id, -32603, &why).to_string(),
            };
            session.close_request_stream(n);
            session.touch();
            session.inflight.fetch_sub(1, Ordering::AcqRel);
            let _ = tx.send(Item::Final(answer)).await;
        });
        rx
    }

    /// Forwards a notification or a response to the server's request.
    pub async fn send(&self, message: &Value) -> Result<(), String> {
        if self.pre_initialized && message["method"] == "notifications/initialized" {
            return Ok(());
        }
        self.instance.send(&inner_message(message)).await
    }

    /// Ends the session: its router stops and its sandbox is killed.
    pub async fn end(&self) {
        if let Some(task) = lock(&self.router).take() {
            task.abort();
        }
        self.instance.kill().await;
    }
}

/// A session id: 128 random bits, hex.
fn session_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The version a session speaks with a client that asked for `asked` in `initialize`: a session
/// is the handshake era's, so a client asking for a later revision there gets the latest one
/// with a handshake (its later requests then need no per-request envelope).
pub fn outside_version(asked: Option<&str>) -> &'static str {
    asked
        .and_then(|a| SERVED_VERSIONS[..2].iter().find(|v| **v == a))
        .copied()
        .unwrap_or(INNER_VERSION)
}

/// A client's message as the server inside gets it: the session's handshake is the server's
/// lifecycle, so the 2026-07-28 per-request envelope (`_meta` keys under
/// `io.modelcontextprotocol/`) is taken off.
pub fn inner_message(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(meta) = message
        .get_mut("params")
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)
    {
        meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
        if meta.is_empty()
            && let Some(params) = message.get_mut("params").and_then(Value::as_object_mut)
        {
            params.remove("_meta");
        }
    }
    message
}
