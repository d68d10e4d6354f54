//! The local engine of a data dir: started in this process, or found running in another.
//!
//! The process that holds an exclusive `flock` on `<data>/engine.lock` owns the engine and
//! publishes its loopback URL and a fresh key in `<data>/engine.json` (mode 0600). Every other
//! MCP server on the same data dir attaches to it, so all of them share one set of sandboxes.
//! When the owner exits, its lock is released and the next caller takes over.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::client::ApiKey;
use crate::engine::config::EngineConfig;
use crate::engine::ids;
use crate::engine::linux::NamespacesDriver;
use crate::engine::manager::Manager;
use crate::engine::server::EngineServer;

/// Why the local engine could not be started or reached.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("cannot {what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the sandbox driver: {0}")]
    Driver(#[from] crate::engine::driver::DriverError),
    #[error("cannot open the engine's state: {0}")]
    Engine(#[from] crate::engine::error::EngineError),
    #[error("cannot listen on loopback: {0}")]
    Listen(#[source] std::io::Error),
    #[error(
        "another process holds {} but its engine does not answer; stop it or remove the lock",
        .0.display()
    )]
    Unresponsive(PathBuf),
}

impl LocalError {
    fn file(what: &'static str, path: PathBuf) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::File { what, path, source }
    }
}

/// How long to wait for another process's engine to appear before giving up.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize, Deserialize)]
struct Endpoint {
    url: String,
    key: String,
    pid: u32,
}

/// An engine this process owns, or one it attached to.
pub(crate) struct LocalEngine {
    url: String,
    key: ApiKey,
    owned: Option<Owned>,
}

struct Owned {
    server: EngineServer,
    _lock: EngineLock,
    endpoint_file: std::path::PathBuf,
}

impl LocalEngine {
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
    pub(crate) fn key(&self) -> &ApiKey {
        &self.key
    }

    /// Stops the engine if this process owns it (sandboxes are paused, not killed).
    pub(crate) async fn shutdown(self) {
        if let Some(owned) = self.owned {
            let _ = fs::remove_file(&owned.endpoint_file);
            owned.server.shutdown().await;
        }
    }
}

/// Creates the data dir: traversable (sandboxes reach their own directories through it), never
/// listable by others.
pub fn prepare_data_dir(config: &EngineConfig) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&config.data_dir)?;
    fs::set_permissions(&config.data_dir, fs::Permissions::from_mode(0o711))
}

/// The data dir's lock: whoever holds it owns the engine.
pub(crate) type EngineLock = nix::fcntl::Flock<fs::File>;

/// Takes the data dir's lock without blocking; `None` when another process holds it.
pub(crate) fn try_lock(config: &EngineConfig) -> std::io::Result<Option<EngineLock>> {
    crate::durable::try_lock(&config.lock_file())
}

/// Where the engine of a data dir says it listens, and its process, if one published it (its
/// key is not read).
pub(crate) fn published(config: &EngineConfig) -> Option<(String, u32)> {
    let text = fs::read_to_string(config.endpoint_file()).ok()?;
    let endpoint: Endpoint = serde_json::from_str(&text).ok()?;
    Some((endpoint.url, endpoint.pid))
}

/// Opens the manager for `config` with the namespaces driver.
pub async fn open_manager(config: &EngineConfig) -> Result<Arc<Manager>, LocalError> {
    let driver = NamespacesDriver::new(crate::engine::linux::driver::Options {
        sandboxes_dir: config.sandboxes_dir(),
        exe: config.exe.clone(),
        disk_limits: config.disk_limits,
        max_sandboxes: config.max_sandboxes,
        uid_registry: config.uid_registry.clone(),
    })?;
    Ok(Manager::open(config.clone(), Arc::new(driver)).await?)
}

/// Publishes where this process's engine listens, for other local MCP servers.
pub(crate) fn publish(config: &EngineConfig, url: &str, key: &str) -> std::io::Result<()> {
    let endpoint = Endpoint {
        url: url.to_string(),
        key: key.to_string(),
        pid: std::process::id(),
    };
    let json = serde_json::to_vec(&endpoint).map_err(std::io::Error::other)?;
    crate::durable::write_atomically(&config.endpoint_file(), &json, 0o600)
}

/// The loopback URL other processes should use for a listen address.
pub(crate) fn local_url(addr: SocketAddr) -> String {
    let host = if addr.ip().is_unspecified() {
        if addr.is_ipv4() {
            "127.0.0.1".to_string()
        } else {
            "[::1]".to_string()
        }
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    format!("http://{host}:{}", addr.port())
}

async fn healthy(url: &str, key: &str) -> bool {
    let Ok(client) = crate::client::http_builder_for(url)
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

/// Starts the engine here if no other process runs one for this data dir, else attaches to it.
pub(crate) async fn start_or_attach(config: &EngineConfig) -> Result<LocalEngine, LocalError> {
    prepare_data_dir(config).map_err(LocalError::file(
        "create the data dir",
        config.data_dir.clone(),
    ))?;
    let started = Instant::now();
    loop {
        match try_lock(config).map_err(LocalError::file("lock", config.lock_file()))? {
            Some(lock) => return start_owned(config, lock).await,
            None => {
                if let Ok(text) = fs::read_to_string(config.endpoint_file())
                    && let Ok(endpoint) = serde_json::from_str::<Endpoint>(&text)
                    && healthy(&endpoint.url, &endpoint.key).await
                {
                    tracing::info!(url = %endpoint.url, pid = endpoint.pid, "attached to the running sandbox engine");
                    return Ok(LocalEngine {
                        url: endpoint.url,
                        key: ApiKey::new(endpoint.key),
                        owned: None,
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

async fn start_owned(config: &EngineConfig, lock: EngineLock) -> Result<LocalEngine, LocalError> {
    let manager = open_manager(config).await?;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(LocalError::Listen)?;
    let key = ids::api_key();
    let server = EngineServer::start(
        manager,
        listener,
        crate::engine::api::keys([key.clone()], None),
    )
    .map_err(LocalError::Listen)?;
    publish(config, &server.url, &key)
        .map_err(LocalError::file("write", config.endpoint_file()))?;
    tracing::info!(url = %server.url, data_dir = %config.data_dir.display(), "sandbox engine started");
    Ok(LocalEngine {
        url: server.url.clone(),
        key: ApiKey::new(key),
        owned: Some(Owned {
            server,
            _lock: lock,
            endpoint_file: config.endpoint_file(),
        }),
    })
}
