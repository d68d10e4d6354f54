//! Sessions of hosted servers: each MCP session ([`super::session::Session`]) owns one instance
//! (its own sandbox and server process), taken from the server's warm pool when there is one. A
//! session ends on `DELETE`, when it has been idle for the server's timeout, when its server
//! exits, or at shutdown; its sandbox goes with it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::ServerSpec;
use super::relay::Instance;
use super::session::INNER_VERSION;
pub use super::session::{Item, SERVED_VERSIONS, Session, inner_message, outside_version};
use crate::backend::Backend;
use sandbox_mcp_sys::lock;

/// Largest `initialize` answer kept (it is read into a tree to set the revision).
const MAX_INITIALIZE: usize = 1024 * 1024;
/// How long a server has to answer `initialize` (a cold `npx` may download nothing here but
/// still takes seconds to start).
pub const INITIALIZE_WAIT: Duration = Duration::from_secs(120);

/// A hosted server as a session starts it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostedServer {
    pub name: String,
    /// Whose sandboxes run it: the registration's owner (`None`: the operator's, shared with
    /// every tenant, whose sessions then run in the operator's sandboxes, out of the tenant's
    /// reach).
    pub owner: Option<String>,
    pub spec: ServerSpec,
    pub idle: Duration,
    pub warm: usize,
}

/// A started, initialized instance waiting for a session.
struct Warm {
    instance: Arc<Instance>,
    initialized: Value,
    spec: ServerSpec,
}

/// A warm pool's key: the tenant it starts instances for, and the server's name.
type PoolKey = (Option<String>, String);

/// Every session and warm pool of one HTTP server.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    /// How long a server has to answer `initialize`.
    initialize_wait: Mutex<Duration>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    pools: Mutex<HashMap<PoolKey, VecDeque<Warm>>>,
    /// Pool refills under way, so that one is not started twice.
    filling: Mutex<HashMap<PoolKey, usize>>,
    /// Shut down: instances that arrive late (a refill, an `initialize`) are killed.
    closed: AtomicBool,
}

impl Sessions {
    pub fn new(backend: Backend) -> Self {
        let sessions = Self {
            inner: Arc::new(Inner {
                backend,
                initialize_wait: Mutex::new(INITIALIZE_WAIT),
                sessions: Mutex::new(HashMap::new()),
                pools: Mutex::new(HashMap::new()),
                filling: Mutex::new(HashMap::new()),
                closed: AtomicBool::new(false),
            }),
        };
        let weak = Arc::downgrade(&sessions.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(inner) = weak.upgrade() else { return };
                Sessions { inner }.evict().await;
            }
        });
        sessions
    }

    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// How long a server has to answer `initialize` ([`INITIALIZE_WAIT`] unless set).
    pub fn set_initialize_wait(&self, wait: Duration) {
        *lock(&self.inner.initialize_wait) = wait;
    }

    fn initialize_wait(&self) -> Duration {
        *lock(&self.inner.initialize_wait)
    }

    /// The session `id` of `tenant`, if it is open.
    pub fn get(&self, id: &str, tenant: Option<&str>) -> Option<Arc<Session>> {
        lock(&self.inner.sessions)
            .get(id)
            .filter(|s| s.tenant.as_deref() == tenant)
            .cloned()
    }

    /// Sessions open, per server name (for tests and the log).
    pub fn count(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    /// Ends sessions idle past their server's timeout, and those whose server ended.
    async fn evict(&self) {
        let ended: Vec<Arc<Session>> = {
            let mut sessions = lock(&self.inner.sessions);
            let gone: Vec<String> = sessions
                .values()
                .filter(|s| s.idle_for() >= s.server.idle || s.instance.ended().is_some())
                .map(|s| s.id.clone())
                .collect();
            gone.iter().filter_map(|id| sessions.remove(id)).collect()
        };
        for session in ended {
            tracing::info!(server = %session.server.name, session = %session.id, "hosted session ended (idle, or its server exited)");
            session.end().await;
        }
    }

    /// Starts a session for `server`: a warm instance if one is ready, else a new one, given the
    /// client's `initialize` request. Returns the session (none when the server answered
    /// `initialize` with an error) and the `initialize` response.
    pub async fn open(
        &self,
        tenant: Option<&str>,
        server: HostedServer,
        initialize: &Value,
    ) -> Result<(Option<Arc<Session>>, Value), String> {
        let id = initialize["id"].clone();
        let asked = initialize["params"]["protocolVersion"].as_str();
        let capabilities = initialize["params"]["capabilities"].clone();
        let capabilities = if capabilities.is_object() {
            capabilities
        } else {
            json!({})
        };
        let warm = self.take_warm(&server);
        let (instance, mut result, pre_initialized) = match warm {
            Some(w) => (w.instance, w.initialized, true),
            None => {
                let instance = Instance::start(
                    &self.inner.backend,
                    server.owner.as_deref(),
                    &server.name,
                    &server.spec,
                )
                .await?;
                let mut inner = initialize.clone();
                inner["params"]["protocolVersion"] = json!(outside_version(asked));
                let response = instance
                    .request(&inner, self.initialize_wait())
                    .await
                    .map_err(|e| {
                        format!("server {} never answered initialize: {e}", server.name)
                    })?;
                let response = parse_initialize(&server.name, &response)?;
                if response.get("error").is_some() {
                    return Ok((None, response));
                }
                (instance, response["result"].clone(), false)
            }
        };
        self.refill(&server);
        result["protocolVersion"] = json!(outside_version(asked));
        let session = Session::new(
            tenant.map(String::from),
            server,
            instance,
            capabilities,
            pre_initialized,
            None,
        );
        if self.inner.closed.load(Ordering::Acquire) {
            session.end().await;
            return Err("the server is shutting down".into());
        }
        lock(&self.inner.sessions).insert(session.id.clone(), session.clone());
        Ok((
            Some(session),
            json!({"jsonrpc": "2.0", "id": id, "result": result}),
        ))
    }

    /// Starts a session for a server that speaks Streamable HTTP itself: its sandbox, the server
    /// started in it, a private preview of its port, and the client's `initialize` forwarded
    /// there once it listens. The server's answer, with our session id.
    pub async fn open_http(
        &self,
        tenant: Option<&str>,
        server: HostedServer,
        headers: &axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> Result<axum::response::Response, String> {
        let port = server.spec.http_port.unwrap_or_default();
        let path = server
            .spec
            .http_path
            .clone()
            .unwrap_or_else(|| "/mcp".into());
        let instance = Instance::start(
            &self.inner.backend,
            server.owner.as_deref(),
            &server.name,
            &server.spec,
        )
        .await?;
        let opened = async {
            let upstream = super::upstream::Upstream::open(
                &self.inner.backend,
                server.owner.as_deref(),
                &instance.sandbox_id,
                port,
                &path,
            )
            .await?;
            let first = upstream
                .first(headers, body, self.initialize_wait(), || {
                    instance.ended().map(|e| e.why)
                })
                .await
                .map_err(|e| {
                    format!(
                        "server {} never answered initialize: {e}{}",
                        server.name,
                        instance.tail_text()
                    )
                })?;
            Ok::<_, String>((upstream, first))
        }
        .await;
        let (upstream, first) = match opened {
            Ok(o) => o,
            Err(e) => {
                instance.kill().await;
                return Err(e);
            }
        };
        let session = Session::new(
            tenant.map(String::from),
            server,
            instance,
            json!({}),
            false,
            Some(upstream),
        );
        let answer = match &session.upstream {
            Some(u) => u.answer(first, &session.id),
            None => return Err("the session lost its way to the server".into()),
        };
        lock(&self.inner.sessions).insert(session.id.clone(), session.clone());
        Ok(answer)
    }

    /// Ends session `id` (DELETE); whether it was open.
    pub async fn close(&self, id: &str, tenant: Option<&str>) -> bool {
        let session = {
            let mut sessions = lock(&self.inner.sessions);
            match sessions.get(id) {
                Some(s) if s.tenant.as_deref() == tenant => sessions.remove(id),
                _ => None,
            }
        };
        match session {
            Some(s) => {
                s.end().await;
                true
            }
            None => false,
        }
    }

    /// Ends every session and empties every pool (shutdown).
    pub async fn close_all(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let sessions: Vec<_> = lock(&self.inner.sessions).drain().map(|(_, s)| s).collect();
        let warm: Vec<_> = lock(&self.inner.pools)
            .drain()
            .flat_map(|(_, q)| q.into_iter())
            .collect();
        let ends = sessions.iter().map(|s| s.end());
        futures::future::join_all(ends).await;
        futures::future::join_all(warm.iter().map(|w| w.instance.kill())).await;
    }

    /// A one-off instance for a stateless request: warm or new, initialized, killed after.
    pub async fn one_off(
        &self,
        tenant: Option<&str>,
        server: &HostedServer,
    ) -> Result<Arc<Instance>, String> {
        if server.spec.http_port.is_some() {
            return Err(format!(
                "server {} speaks Streamable HTTP itself: open a session at /servers/{}/mcp (it is neither mounted nor served statelessly)",
                server.name, server.name
            ));
        }
        let _ = tenant;
        if let Some(w) = self.take_warm(server) {
            self.refill(server);
            return Ok(w.instance);
        }
        let (instance, _) = start_initialized(
            &self.inner.backend,
            server.owner.as_deref(),
            server,
            self.initialize_wait(),
        )
        .await?;
        Ok(instance)
    }

    fn take_warm(&self, server: &HostedServer) -> Option<Warm> {
        let key = (server.owner.clone(), server.name.clone());
        let mut pools = lock(&self.inner.pools);
        let queue = pools.get_mut(&key)?;
        while let Some(w) = queue.pop_front() {
            if w.spec == server.spec && w.instance.ended().is_none() {
                return Some(w);
            }
            let stale = w.instance.clone();
            tokio::spawn(async move { stale.kill().await });
        }
        None
    }

    /// Tops up `server`'s pool (its owner's) to its `warm` count, in the background.
    pub fn refill(&self, server: &HostedServer) {
        // Warm instances are initialized on stdio; a server that speaks HTTP starts per session.
        if server.warm == 0 || server.spec.http_port.is_some() {
            return;
        }
        if self.inner.closed.load(Ordering::Acquire) {
            return;
        }
        let key = (server.owner.clone(), server.name.clone());
        let have = lock(&self.inner.pools).get(&key).map_or(0, VecDeque::len);
        let starting = *lock(&self.inner.filling).get(&key).unwrap_or(&0);
        let missing = server.warm.saturating_sub(have + starting);
        if missing == 0 {
            return;
        }
        *lock(&self.inner.filling).entry(key.clone()).or_default() += missing;
        for _ in 0..missing {
            let (this, server, key) = (self.clone(), server.clone(), key.clone());
            tokio::spawn(async move {
                let started = start_initialized(
                    &this.inner.backend,
                    key.0.as_deref(),
                    &server,
                    this.initialize_wait(),
                )
                .await;
                if let Some(n) = lock(&this.inner.filling).get_mut(&key) {
                    *n = n.saturating_sub(1);
                }
                match started {
                    // Shut down meanwhile: the instance goes (dropping it kills its sandbox).
                    Ok((instance, _)) if this.inner.closed.load(Ordering::Acquire) => {
                        instance.kill().await;
                    }
                    Ok((instance, initialized)) => {
                        lock(&this.inner.pools)
                            .entry(key)
                            .or_default()
                            .push_back(Warm {
                                instance,
                                initialized,
                                spec: server.spec.clone(),
                            });
                    }
                    Err(e) => {
                        tracing::warn!(server = %server.name, "could not warm an instance: {e}")
                    }
                }
            });
        }
    }

    /// Warm instances ready for server `name` of `owner` (for tests and the log).
    pub fn warm_count(&self, owner: Option<&str>, name: &str) -> usize {
        lock(&self.inner.pools)
            .get(&(owner.map(String::from), name.to_string()))
            .map_or(0, VecDeque::len)
    }
}

/// Starts an instance and initializes it on the proxy's own account (declaring every client
/// capability: the session refuses what its real client did not declare).
async fn start_initialized(
    backend: &Backend,
    owner: Option<&str>,
    server: &HostedServer,
    wait: Duration,
) -> Result<(Arc<Instance>, Value), String> {
    let instance = Instance::start(backend, owner, &server.name, &server.spec).await?;
    let initialize = json!({"jsonrpc": "2.0", "id": "sandbox-mcp-init", "method": "initialize", "params": {
        "protocolVersion": INNER_VERSION,
        "capabilities": {"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}},
        "clientInfo": {"name": "sandbox-mcp", "version": env!("CARGO_PKG_VERSION")}}});
    let response = match instance.request(&initialize, wait).await {
        Ok(raw) => {
            let r = parse_initialize(&server.name, &raw)?;
            if r.get("result").is_none() {
                instance.kill().await;
                return Err(format!(
                    "server {} refused initialize: {}",
                    server.name, r["error"]
                ));
            }
            r
        }
        Err(e) => {
            instance.kill().await;
            return Err(format!(
                "server {} never answered initialize: {e}",
                server.name
            ));
        }
    };
    instance
        .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await?;
    Ok((instance, response["result"].clone()))
}

/// A server's `initialize` answer as a tree (bounded: it is small, or refused).
fn parse_initialize(name: &str, raw: &str) -> Result<Value, String> {
    if raw.len() > MAX_INITIALIZE {
        return Err(format!(
            "server {name} answered initialize with {} bytes; at most {} KiB are accepted",
            raw.len(),
            MAX_INITIALIZE >> 10
        ));
    }
    serde_json::from_str(raw)
        .map_err(|e| format!("server {name} answered initialize with something else: {e}"))
}
