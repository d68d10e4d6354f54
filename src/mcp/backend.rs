//! Where the control plane is: a remote engine (`SANDBOX_MCP_URL`), or the local one — started
//! in this process, or shared with other MCP servers on the same data dir.
//!
//! The local engine starts in the background so `initialize` is answered at once; the first tool
//! call waits for it. When a shared engine goes away (its owning process exited), the next call
//! that fails to connect takes over: it starts an engine here, or attaches to whichever process
//! won the race, and the call is retried once.

use std::sync::Arc;

use tokio::sync::{Mutex, watch};

use crate::client::{ApiKey, Client, connect};
use crate::engine::config::EngineConfig;
use crate::engine::local::{self, LocalEngine};
use crate::mcp::call::CallFailure;

#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

enum Mode {
    Remote,
    Local(EngineConfig),
}

struct Inner {
    mode: Mode,
    /// The current client, or why there is none (yet). `None` while the local engine starts.
    current: watch::Sender<Option<Result<Arc<Client>, String>>>,
    /// The local engine this process owns or attached to; replaced on takeover.
    local: Mutex<Option<LocalEngine>>,
}

impl Backend {
    /// A fixed remote control plane.
    pub fn remote(url: &str, key: Option<ApiKey>) -> Result<Self, String> {
        let client =
            connect(url, key.as_ref()).map_err(|e| format!("invalid SANDBOX_MCP_URL: {e}"))?;
        let (current, _) = watch::channel(Some(Ok(Arc::new(client))));
        Ok(Self {
            inner: Arc::new(Inner {
                mode: Mode::Remote,
                current,
                local: Mutex::new(None),
            }),
        })
    }

    /// The local engine for `config.data_dir`, started or attached to in the background.
    pub fn local(config: EngineConfig) -> Self {
        let (current, _) = watch::channel(None);
        let backend = Self {
            inner: Arc::new(Inner {
                mode: Mode::Local(config),
                current,
                local: Mutex::new(None),
            }),
        };
        let starter = backend.clone();
        tokio::spawn(async move {
            starter.resolve_local().await;
        });
        backend
    }

    /// (Re)starts or attaches to the local engine and publishes the client.
    async fn resolve_local(&self) {
        let Mode::Local(config) = &self.inner.mode else {
            return;
        };
        let mut slot = self.inner.local.lock().await;
        if let Some(old) = slot.take() {
            old.shutdown().await;
        }
        let outcome = match local::start_or_attach(config).await {
            Ok(engine) => {
                let client = connect(engine.url(), Some(engine.key()))
                    .map(Arc::new)
                    .map_err(|e| format!("cannot build the engine client: {e}"));
                *slot = Some(engine);
                client
            }
            Err(e) => {
                tracing::error!("local sandbox engine failed to start: {e}");
                Err(format!("the local sandbox engine failed to start: {e}"))
            }
        };
        self.inner.current.send_replace(Some(outcome));
    }

    /// The client to use now, waiting for the local engine if it is still starting.
    pub async fn client(&self) -> Result<Arc<Client>, CallFailure> {
        let mut rx = self.inner.current.subscribe();
        let value = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| CallFailure::Unreachable("the engine was shut down".into()))?;
        match value.as_ref() {
            Some(Ok(client)) => Ok(client.clone()),
            Some(Err(e)) => Err(CallFailure::Unreachable(e.clone())),
            None => Err(CallFailure::Unreachable("the engine is not ready".into())),
        }
    }

    /// After `failed` could not connect: for a local engine, take over or re-attach.
    /// Returns whether a different client is now available (the caller retries once).
    pub async fn recover(&self, failed: &Arc<Client>) -> bool {
        if matches!(self.inner.mode, Mode::Remote) {
            return false;
        }
        let still_current = matches!(
            self.inner.current.borrow().as_ref(),
            Some(Ok(c)) if Arc::ptr_eq(c, failed)
        );
        if still_current {
            tracing::info!("the shared sandbox engine went away; taking over");
            self.inner.current.send_replace(None);
            self.resolve_local().await;
        }
        matches!(self.inner.current.borrow().as_ref(), Some(Ok(c)) if !Arc::ptr_eq(c, failed))
    }

    /// Stops the engine this process owns, if any (sandboxes are kept, paused).
    pub async fn shutdown(&self) {
        if let Some(engine) = self.inner.local.lock().await.take() {
            engine.shutdown().await;
        }
    }
}
