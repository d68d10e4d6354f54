//! The engine's HTTP server: serves the API ([`crate::api`]) on a listener, previews
//! ([`crate::preview`]) on their own, and runs the manager's timers, until shut down.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{self, AppState, Keys};
use crate::preview;
use sandbox_mcp_api::InProcess;
use sandbox_mcp_engine::manager::Manager;

/// A running engine HTTP server.
pub struct EngineServer {
    pub url: String,
    pub manager: Arc<Manager>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The API for callers in this process, and the requests they have under way.
    local: InProcess,
    local_calls: TaskTracker,
}

impl EngineServer {
    /// Serves `manager` on `listener` and runs its timers.
    pub fn start(
        manager: Arc<Manager>,
        listener: TcpListener,
        keys: Keys,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        // Bound first: a preview address that cannot be had fails the start, before anything runs.
        let previews = match preview::bind(&manager.config().preview)? {
            Some(l) => {
                let l = TcpListener::from_std(l)?;
                manager.previews.set_port(l.local_addr()?.port());
                Some(l)
            }
            None => None,
        };
        let e2b = match manager.config().e2b_listen {
            Some(at) => {
                let l = std::net::TcpListener::bind(at).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot listen on {at} for the E2B API: {e}"),
                    )
                })?;
                l.set_nonblocking(true)?;
                Some(TcpListener::from_std(l)?)
            }
            None => None,
        };
        let url = format!("http://{addr}");
        let stop = CancellationToken::new();
        let state = AppState {
            manager: manager.clone(),
            keys: Arc::new(keys),
        };
        let e2b = match e2b {
            Some(listener) => {
                let door = sandbox_mcp_e2b::Door::new(manager.clone(), state.keys.clone())?;
                tracing::info!(listen = %listener.local_addr()?, "E2B API ready");
                Some(tokio::spawn(sandbox_mcp_e2b::serve(
                    listener,
                    Arc::new(door),
                    stop.clone(),
                )))
            }
            None => None,
        };
        let app = api::router(state);
        let local_calls = TaskTracker::new();
        let local = crate::in_process::serve(app.clone(), stop.clone(), local_calls.clone());
        let shutdown = stop.clone();
        let server = tokio::spawn(async move {
            // Answers that stream (exec output, NDJSON) are several writes: without TCP_NODELAY
            // each after the first waits for the client's delayed ACK (40 ms).
            use axum::serve::ListenerExt as _;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!("engine server stopped: {e}");
            }
        });
        let timers = tokio::spawn(manager.clone().run_timers(stop.clone()));
        let mut tasks = vec![server, timers];
        tasks.extend(e2b);
        if let Some(previews) = previews {
            tasks.push(tokio::spawn(preview::serve(
                previews,
                manager.clone(),
                stop.clone(),
            )));
        }
        Ok(Self {
            url,
            manager,
            stop,
            tasks,
            local,
            local_calls,
        })
    }

    /// The API for a client in this process, without a socket ([`sandbox_mcp_api::connect_to`]).
    pub fn in_process(&self) -> InProcess {
        self.local.clone()
    }

    /// Stops accepting requests, lets in-flight ones finish, and pauses the sandboxes.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.local_calls.close();
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.local_calls.wait()).await;
        self.manager.shutdown().await;
    }
}
