//! An engine serving a data dir from this process, and how other processes find it.
//!
//! The process that holds an exclusive `flock` on `<data>/engine.lock` owns the engine and
//! publishes its loopback URL and a fresh key in `<data>/engine.json` (mode 0600), so that other
//! MCP servers on the same data dir can share it. Which driver runs its sandboxes is the caller's
//! choice: the engine knows only the driver interface. When the owner exits,
//! its lock is released and the next one takes over.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::server::EngineServer;
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_model::driver::Driver;
use sandbox_mcp_model::ids;

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
    Driver(#[from] sandbox_mcp_model::driver::DriverError),
    // Not a `#[source]`: the message already carries its whole chain (the operator needs the
    // detail a client is not told), and `{:#}` would print it twice.
    #[error("cannot open the engine's state: {}", sandbox_mcp_engine::error::chain(.0))]
    Engine(sandbox_mcp_engine::error::EngineError),
    #[error("cannot listen for the engine API: {0}")]
    Listen(#[source] std::io::Error),
    #[error(
        "another process holds {} but its engine does not answer; stop it or remove the lock",
        .0.display()
    )]
    Unresponsive(PathBuf),
}

impl From<sandbox_mcp_engine::error::EngineError> for LocalError {
    fn from(e: sandbox_mcp_engine::error::EngineError) -> Self {
        LocalError::Engine(e)
    }
}

impl LocalError {
    pub fn file(what: &'static str, path: PathBuf) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::File { what, path, source }
    }
}

/// What `engine.json` holds: where the owner's engine listens, a key it accepts, and its process.
#[derive(Debug, Serialize, Deserialize)]
pub struct Endpoint {
    pub url: String,
    pub key: String,
    pub pid: u32,
}

/// The engine this process serves: its server, the data dir's lock (held while it runs) and
/// the endpoint it published.
pub struct Serving {
    server: EngineServer,
    _lock: EngineLock,
    endpoint_file: PathBuf,
    url: String,
    local_key: String,
}

impl Serving {
    /// Where local processes reach it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API for a client in this process, without a socket.
    pub fn in_process(&self) -> sandbox_mcp_api::InProcess {
        self.server.in_process()
    }

    /// The key published for local processes.
    pub fn local_key(&self) -> &str {
        &self.local_key
    }

    /// Withdraws the endpoint, finishes requests and pauses the sandboxes; the lock goes last.
    pub async fn shutdown(self) {
        let _ = fs::remove_file(&self.endpoint_file);
        self.server.shutdown().await;
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
pub type EngineLock = nix::fcntl::Flock<fs::File>;

/// Takes the data dir's lock without blocking; `None` when another process holds it.
pub fn try_lock(config: &EngineConfig) -> std::io::Result<Option<EngineLock>> {
    sandbox_mcp_sys::durable::try_lock(&config.lock_file())
}

/// What the owner of a data dir published, if it did.
pub fn endpoint(config: &EngineConfig) -> Option<Endpoint> {
    let text = fs::read_to_string(config.endpoint_file()).ok()?;
    serde_json::from_str(&text).ok()
}

/// Publishes where this process's engine listens, for other local MCP servers.
fn publish(config: &EngineConfig, url: &str, key: &str) -> std::io::Result<()> {
    let endpoint = Endpoint {
        url: url.to_string(),
        key: key.to_string(),
        pid: std::process::id(),
    };
    let json = serde_json::to_vec(&endpoint).map_err(std::io::Error::other)?;
    sandbox_mcp_sys::durable::write_atomically(&config.endpoint_file(), &json, 0o600)
}

/// The loopback URL other processes should use for a listen address.
fn local_url(addr: SocketAddr) -> String {
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

/// Serves `config`'s data dir on `listener` while holding its `lock`, with `driver`: opens the
/// state, starts the API with `keys` (plus a fresh key for local processes) and publishes the
/// endpoint.
pub async fn serve(
    config: &EngineConfig,
    lock: EngineLock,
    listener: TcpListener,
    keys: impl IntoIterator<Item = String>,
    keys_file: Option<PathBuf>,
    driver: Driver,
) -> Result<Serving, LocalError> {
    let manager = Manager::open(config.clone(), driver).await?;
    let addr = listener.local_addr().map_err(LocalError::Listen)?;
    let local_key = ids::api_key();
    let keys = crate::api::keys(keys.into_iter().chain([local_key.clone()]), keys_file);
    // Published before the API answers: the listener is bound already (early connections wait in
    // its backlog), and whoever sees the engine answer must also find who owns the data dir.
    let url = local_url(addr);
    publish(config, &url, &local_key).map_err(LocalError::file("write", config.endpoint_file()))?;
    let server = EngineServer::start(manager, listener, keys).map_err(|e| {
        let _ = fs::remove_file(config.endpoint_file());
        LocalError::Listen(e)
    })?;
    tracing::info!(listen = %addr, data_dir = %config.data_dir.display(), "sandbox engine ready");
    Ok(Serving {
        server,
        _lock: lock,
        endpoint_file: config.endpoint_file(),
        url,
        local_key,
    })
}
