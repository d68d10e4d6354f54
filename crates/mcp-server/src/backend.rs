//! Where the control plane is: a remote engine (`SANDBOX_MCP_URL`), or the local one — started
//! in this process, or shared with other MCP servers on the same data dir.
//!
//! The local engine starts in the background so `initialize` is answered at once; the first tool
//! call waits for it. When a shared engine goes away (its owning process exited), the next call
//! that fails to connect takes over: it starts an engine here, or attaches to whichever process
//! won the race, and the call is retried once. Clients are built per tenant (the HTTP transport
//! serves several), and rebuilt when the engine changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use futures::future::BoxFuture;

use crate::call::CallFailure;
use sandbox_mcp_api::{ApiKey, Client, InProcess, connect_to};

/// The engine an MCP server uses when it is given no URL: served from this process, or shared
/// with the process that already serves the data dir. The binary provides it, since it knows how
/// to build an engine and its drivers; this layer only calls its API (over HTTP, or in process
/// through the same router when this process serves it).
pub trait LocalEngines: Send + Sync + 'static {
    /// Serves the engine here if no other process does, else attaches to it; why not, in words
    /// for the log and the caller.
    fn start_or_attach(&self) -> BoxFuture<'_, Result<LocalEngine, String>>;
}

/// An engine this process serves, or one it attached to.
pub struct LocalEngine {
    pub url: String,
    pub key: ApiKey,
    /// The engine's API without a socket, when this process serves it: calls skip the loopback
    /// hop (`url` stays the way for requests that need a connection of their own).
    pub in_process: Option<InProcess>,
    /// Stops the engine, when this process serves it (sandboxes are paused, not killed).
    pub stop: Option<BoxFuture<'static, ()>>,
}

impl LocalEngine {
    async fn shutdown(self) {
        if let Some(stop) = self.stop {
            stop.await;
        }
    }
}

#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

enum Mode {
    Remote,
    Local(std::sync::Arc<dyn LocalEngines>),
}

/// The control plane to talk to; `generation` changes whenever it does.
#[derive(Clone)]
struct Endpoint {
    url: String,
    key: Option<ApiKey>,
    in_process: Option<InProcess>,
    generation: u64,
}

struct Inner {
    mode: Mode,
    /// The current endpoint, or why there is none (yet). `None` while the local engine starts.
    endpoint: watch::Sender<Option<Result<Endpoint, String>>>,
    /// Clients of the current endpoint, per tenant.
    clients: Mutex<HashMap<Option<String>, Handle>>,
    /// The local engine this process owns or attached to; replaced on takeover.
    local: tokio::sync::Mutex<Option<LocalEngine>>,
    /// Last generation handed out; never reused, so a stale handle never matches a new endpoint.
    generations: AtomicU64,
    /// Set by [`Backend::shutdown`]: no local engine is started from then on. Without it, a
    /// process that ended (a bad flag refused, say) before the background start had taken
    /// `local` found nothing to stop, and exited while that start went on: the engine's store was
    /// left mounted, its start cut off.
    closed: std::sync::atomic::AtomicBool,
}

/// A client and the endpoint generation it belongs to.
#[derive(Clone)]
pub struct Handle {
    pub client: Arc<Client>,
    generation: u64,
}

impl Backend {
    fn with_mode(mode: Mode, endpoint: Option<Result<Endpoint, String>>) -> Self {
        let (tx, _) = watch::channel(endpoint);
        Self {
            inner: Arc::new(Inner {
                mode,
                endpoint: tx,
                clients: Mutex::new(HashMap::new()),
                local: tokio::sync::Mutex::new(None),
                generations: AtomicU64::new(0),
                closed: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A fixed remote control plane.
    pub fn remote(url: &str, key: Option<ApiKey>) -> Result<Self, String> {
        // A malformed URL fails at startup, not at the first call. The client itself is built on
        // first use: for https that loads the system's trust roots, which `initialize` need not
        // wait for.
        let hint = "give the engine's base URL, e.g. http://10.0.0.5:7070 or https://sandboxes.example.com";
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| format!("invalid SANDBOX_MCP_URL {url:?}: {e}; {hint}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || !parsed.has_host() {
            return Err(format!(
                "invalid SANDBOX_MCP_URL {url:?}: it must be an http:// or https:// URL with a host; {hint}"
            ));
        }
        let endpoint = Endpoint {
            url: url.to_string(),
            key,
            in_process: None,
            generation: 0,
        };
        Ok(Self::with_mode(Mode::Remote, Some(Ok(endpoint))))
    }

    /// The local engine `engines` starts or attaches to, in the background.
    pub fn local(engines: Arc<dyn LocalEngines>) -> Self {
        let backend = Self::with_mode(Mode::Local(engines), None);
        let starter = backend.clone();
        tokio::spawn(async move {
            starter.resolve_local().await;
        });
        backend
    }

    /// (Re)starts or attaches to the local engine and publishes its endpoint.
    async fn resolve_local(&self) {
        let Mode::Local(engines) = &self.inner.mode else {
            return;
        };
        let mut slot = self.inner.local.lock().await;
        if let Some(old) = slot.take() {
            old.shutdown().await;
        }
        // Checked with `local` held, which shutdown takes after setting it: a start either
        // comes first and is stopped by shutdown, or sees it and does not begin.
        if self.inner.closed.load(Ordering::Acquire) {
            self.inner
                .endpoint
                .send_replace(Some(Err("the engine was shut down".into())));
            return;
        }
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let outcome = match engines.start_or_attach().await {
            Ok(engine) => {
                let endpoint = Endpoint {
                    url: engine.url.clone(),
                    key: Some(engine.key.clone()),
                    in_process: engine.in_process.clone(),
                    generation,
                };
                *slot = Some(engine);
                Ok(endpoint)
            }
            Err(e) => {
                tracing::error!("local sandbox engine failed to start: {e}");
                Err(format!("the local sandbox engine failed to start: {e}"))
            }
        };
        self.inner.endpoint.send_replace(Some(outcome));
    }

    /// The client to use now for `tenant`, waiting for the local engine if it is still starting.
    pub async fn client(&self, tenant: Option<&str>) -> Result<Handle, CallFailure> {
        let mut rx = self.inner.endpoint.subscribe();
        let endpoint = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| CallFailure::Unreachable("the engine was shut down".into()))?
            .clone();
        let endpoint = match endpoint {
            Some(Ok(e)) => e,
            Some(Err(e)) => return Err(CallFailure::Unreachable(e)),
            None => return Err(CallFailure::Unreachable("the engine is not ready".into())),
        };
        let mut clients = self.inner.clients.lock().unwrap_or_else(|p| p.into_inner());
        let key = tenant.map(String::from);
        if let Some(handle) = clients.get(&key)
            && handle.generation == endpoint.generation
        {
            return Ok(handle.clone());
        }
        let client = Arc::new(
            connect_to(
                &endpoint.url,
                endpoint.key.as_ref(),
                tenant,
                endpoint.in_process.clone(),
            )
            .map_err(|e| {
                CallFailure::Unreachable(format!("cannot build the engine client: {e}"))
            })?,
        );
        let handle = Handle {
            client,
            generation: endpoint.generation,
        };
        clients.insert(key, handle.clone());
        Ok(handle)
    }

    /// After `failed` could not connect: for a local engine, take over or re-attach.
    /// Returns whether a different endpoint is now available (the caller retries once).
    async fn recover(&self, failed: &Handle) -> bool {
        if matches!(self.inner.mode, Mode::Remote) {
            return false;
        }
        let current = |b: &Backend| {
            b.inner
                .endpoint
                .borrow()
                .as_ref()
                .and_then(|e| e.as_ref().ok())
                .map(|e| e.generation)
        };
        if current(self) == Some(failed.generation) {
            tracing::info!("the shared sandbox engine went away; taking over");
            self.inner.endpoint.send_replace(None);
            self.resolve_local().await;
        }
        current(self).is_some_and(|g| g != failed.generation)
    }

    /// `call` with `handle`'s client; when it could not connect and the local engine was taken
    /// over or re-attached meanwhile ([`Self::recover`]), once more with the new client for
    /// `tenant`. Says whether it went to a new engine.
    pub(crate) async fn with_recovery<T, F, Fut>(
        &self,
        handle: &Handle,
        tenant: Option<&str>,
        call: F,
    ) -> (Result<T, CallFailure>, bool)
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallFailure>>,
    {
        match call(handle.client.clone()).await {
            Err(f) if f.is_connect_failure() && self.recover(handle).await => {
                match self.client(tenant).await {
                    Ok(now) => (call(now.client).await, true),
                    Err(f) => (Err(f), true),
                }
            }
            other => (other, false),
        }
    }

    /// Stops the engine this process owns, if any (sandboxes are kept, paused).
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        if let Some(engine) = self.inner.local.lock().await.take() {
            engine.shutdown().await;
        }
    }
}
