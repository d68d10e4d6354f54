//! The MCP server's local engine: served from this process, or shared with the process that
//! already serves the data dir.
//!
//! Whoever takes the data dir's lock serves the engine (the engine crate's `local`); every other MCP server
//! on the same data dir reads the published endpoint and attaches once it answers, so all of them
//! share one set of sandboxes. Attaching is a client's concern, hence not in the engine; building
//! one takes a driver, hence not in the MCP layer: the binary brings them together.

use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use futures::future::BoxFuture;
use sandbox_mcp_api::ApiKey;
use sandbox_mcp_engine_http::local::{self, LocalError};
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_server::backend::{LocalEngine, LocalEngines};

/// How long to wait for another process's engine to answer before giving up.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// The MCP server's local engine for one data dir: what it starts or attaches to.
pub struct Embedded {
    config: EngineConfig,
}

impl Embedded {
    pub fn new(config: EngineConfig) -> Self {
        Self { config }
    }
}

impl LocalEngines for Embedded {
    fn start_or_attach(&self) -> BoxFuture<'_, Result<LocalEngine, String>> {
        Box::pin(async move {
            start_or_attach(&self.config)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Serves the engine here if no other process does for this data dir, else attaches to it.
async fn start_or_attach(config: &EngineConfig) -> Result<LocalEngine, LocalError> {
    local::prepare_data_dir(config).map_err(LocalError::file(
        "create the data dir",
        config.data_dir.clone(),
    ))?;
    let started = Instant::now();
    loop {
        match local::try_lock(config).map_err(LocalError::file("lock", config.lock_file()))? {
            Some(lock) => {
                let listener = TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(LocalError::Listen)?;
                let driver = crate::wiring::driver_for(config)
                    .await
                    .map_err(LocalError::from)?;
                let serving = local::serve(config, lock, listener, [], None, driver).await?;
                return Ok(LocalEngine {
                    url: serving.url().to_string(),
                    key: ApiKey::new(serving.local_key()),
                    stop: Some(Box::pin(serving.shutdown())),
                });
            }
            None => {
                if let Some(endpoint) = local::endpoint(config)
                    && healthy(&endpoint.url, &endpoint.key).await
                {
                    tracing::info!(url = %endpoint.url, pid = endpoint.pid, "attached to the running sandbox engine");
                    return Ok(LocalEngine {
                        url: endpoint.url,
                        key: ApiKey::new(endpoint.key),
                        stop: None,
                    });
                }
            }
        }
        if started.elapsed() > ATTACH_TIMEOUT {
            return Err(LocalError::Unresponsive(config.lock_file()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the engine at `url` answers its health check with `key`.
async fn healthy(url: &str, key: &str) -> bool {
    let Ok(client) = sandbox_mcp_api::http_builder_for(url)
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
    else {
        return false;
    };
    client
        .get(format!("{url}/v1/health"))
        .bearer_auth(key)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}
