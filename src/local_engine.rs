//! The MCP server's local engine: served from this process, or shared with the process that
//! already serves the data dir.
//!
//! Whoever takes the data dir's lock serves the engine (the engine crate's `local`); every other MCP server
//! on the same data dir reads the published endpoint and attaches once it answers, so all of them
//! share one set of sandboxes. Attaching is a client's concern, hence not in the engine; building
//! one takes a driver, hence not in the MCP layer: the binary brings them together.
//!
//! The stdio server's own runtime has a single worker, for its one client; an engine it serves
//! runs on a worker pool of its own, started when it takes the lock ([`Embedded::new`] sees the
//! runtime it is called on).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::runtime::Runtime;

use futures::future::BoxFuture;
use sandbox_mcp_api::ApiKey;
use sandbox_mcp_engine_http::local::{self, EngineLock, LocalError};
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_server::backend::{LocalEngine, LocalEngines};

/// How long to wait for another process's engine to answer before giving up.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// The MCP server's local engine for one data dir: what it starts or attaches to.
pub struct Embedded {
    config: EngineConfig,
    /// Where an engine this process serves runs.
    pool: Pool,
}

/// The runtime an engine served by this process runs on.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Pool {
    /// The caller's, with a worker per core already (`serve --http`, `run`, `servers`).
    Caller,
    /// One of its own, a worker per core, started only when the engine is: the caller's runtime
    /// has fewer (the stdio server serves its single client with one).
    Own,
}

impl Embedded {
    /// The local engine for `config`, for a caller on a tokio runtime. An engine this process
    /// comes to serve runs on that runtime when it has a worker per core; on one with fewer (the
    /// stdio server's single worker, for its one client) it gets a pool of its own then. A
    /// server that attaches to another process's engine starts none.
    pub fn new(config: EngineConfig) -> Self {
        let workers = tokio::runtime::Handle::try_current()
            .map_or(0, |runtime| runtime.metrics().num_workers());
        Self {
            config,
            pool: pool_for(workers, cores()),
        }
    }
}

/// Where an engine goes for a runtime with `workers` workers on `cores` cores.
fn pool_for(workers: usize, cores: usize) -> Pool {
    if workers < cores {
        Pool::Own
    } else {
        Pool::Caller
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl LocalEngines for Embedded {
    fn start_or_attach(&self) -> BoxFuture<'_, Result<LocalEngine, String>> {
        Box::pin(async move { start_or_attach(&self.config, self.pool).await })
    }
}

/// Serves the engine here if no other process does for this data dir, else attaches to it.
async fn start_or_attach(config: &EngineConfig, pool: Pool) -> Result<LocalEngine, String> {
    let err = |e: LocalError| e.to_string();
    local::prepare_data_dir(config)
        .map_err(LocalError::file(
            "create the data dir",
            config.data_dir.clone(),
        ))
        .map_err(err)?;
    let started = Instant::now();
    loop {
        match local::try_lock(config)
            .map_err(LocalError::file("lock", config.lock_file()))
            .map_err(err)?
        {
            Some(lock) if pool == Pool::Caller => {
                return serve(config.clone(), lock).await.map_err(err);
            }
            Some(lock) => return serve_on_own_pool(config.clone(), lock).await,
            None => {
                if let Some(endpoint) = local::endpoint(config)
                    && healthy(&endpoint.url, &endpoint.key).await
                {
                    tracing::info!(url = %endpoint.url, pid = endpoint.pid, "attached to the running sandbox engine");
                    return Ok(LocalEngine {
                        url: endpoint.url,
                        key: ApiKey::new(endpoint.key),
                        in_process: None,
                        stop: None,
                    });
                }
            }
        }
        if started.elapsed() > ATTACH_TIMEOUT {
            return Err(err(LocalError::Unresponsive(config.lock_file())));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves the engine from this process, on the runtime this runs on.
async fn serve(config: EngineConfig, lock: EngineLock) -> Result<LocalEngine, LocalError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(LocalError::Listen)?;
    let driver = crate::wiring::driver_for(&config)
        .await
        .map_err(LocalError::from)?;
    let serving = local::serve(&config, lock, listener, [], None, driver).await?;
    Ok(LocalEngine {
        url: serving.url().to_string(),
        key: ApiKey::new(serving.local_key()),
        in_process: Some(serving.in_process()),
        stop: Some(Box::pin(serving.shutdown())),
    })
}

/// Serves the engine from this process on the engine pool, which it starts the first time. Its
/// sockets, tasks and driver live there, as do the requests the caller hands it in process (each
/// runs as a task on the engine's runtime), and its stop runs there too.
async fn serve_on_own_pool(config: EngineConfig, lock: EngineLock) -> Result<LocalEngine, String> {
    static POOL: OnceLock<Result<Runtime, String>> = OnceLock::new();
    // Never dropped (a static): a runtime cannot be dropped from async code, and the process
    // ends with it.
    let pool = POOL
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .thread_name("engine")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the engine's worker threads: {e}"))
        })
        .as_ref()
        .map_err(String::clone)?;
    let mut engine = pool
        .spawn(serve(config, lock))
        .await
        .map_err(|e| format!("the engine's start failed: {e}"))?
        .map_err(|e| e.to_string())?;
    if let Some(stop) = engine.stop.take() {
        let pool = pool.handle().clone();
        engine.stop = Some(Box::pin(async move {
            let _ = pool.spawn(stop).await;
        }));
    }
    Ok(engine)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_gets_its_own_pool_only_under_a_runtime_with_fewer_workers_than_cores() {
        assert_eq!(pool_for(1, 2), Pool::Own);
        assert_eq!(pool_for(1, 64), Pool::Own);
        assert_eq!(pool_for(2, 2), Pool::Caller);
        assert_eq!(pool_for(1, 1), Pool::Caller);
        // Outside any runtime (no workers), the engine would need one of its own.
        assert_eq!(pool_for(0, 1), Pool::Own);
    }

    #[test]
    fn the_stdio_servers_runtime_puts_its_engine_on_a_pool_of_its_own() {
        let config = EngineConfig::new(std::path::PathBuf::from("/nonexistent"));
        let on = |builder: &mut tokio::runtime::Builder| {
            builder
                .enable_all()
                .build()
                .unwrap()
                .block_on(async { Embedded::new(config.clone()).pool })
        };
        // The command line's runtime, as `cli` builds it for the stdio server and for HTTP.
        let stdio = on(tokio::runtime::Builder::new_multi_thread().worker_threads(1));
        let http = on(&mut tokio::runtime::Builder::new_multi_thread());
        assert_eq!(stdio, pool_for(1, cores()));
        assert_eq!(http, Pool::Caller);
    }
}
