//! A real engine in this process on a temporary data dir, serving HTTP on loopback; and a
//! temporary data dir for engines run as processes of their own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::service::RunningService;
use tokio::net::TcpListener;

use sandbox_mcp::wiring::open_manager;
use sandbox_mcp_api::{ApiKey, Client, connect};
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_engine_http::server::EngineServer;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::ServerSettings;

use super::{BIN, KEY};
use super::{McpClient, mcp_for, mcp_with_handler};

/// The engines' warnings and errors (a hibernated tree not woken, an agent restarted), printed
/// the way a test prints: shown with the output of a test that fails, kept out of the others'.
fn show_warnings() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
}

/// A real engine on a temporary data dir, serving HTTP on loopback.
pub struct TestEngine {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub manager: Arc<Manager>,
    server: Option<EngineServer>,
    /// Destroy every sandbox on drop (off once the data dir is handed to another engine).
    cleanup: bool,
}

impl TestEngine {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub fn config_for(dir: &std::path::Path) -> EngineConfig {
        let mut config = EngineConfig::new(dir.join("data"));
        config.exe = PathBuf::from(BIN);
        config.idle_pause = None;
        config.tick = Duration::from_millis(100);
        config.preview.listen = Some(([127, 0, 0, 1], 0).into());
        config
    }

    pub async fn start_with(adjust: impl FnOnce(&mut EngineConfig)) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("smcp")
            .tempdir_in("/tmp")
            .unwrap();
        let mut config = Self::config_for(dir.path());
        adjust(&mut config);
        Self::start_on(dir, config).await
    }

    pub async fn start_on(dir: impl Into<tempfile::TempDir>, config: EngineConfig) -> Self {
        let dir = dir.into();
        show_warnings();
        sandbox_mcp_engine_http::local::prepare_data_dir(&config).unwrap();
        let manager = open_manager(&config).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = EngineServer::start(
            manager.clone(),
            listener,
            sandbox_mcp_engine_http::api::keys([KEY.to_string()], None),
        )
        .unwrap();
        Self {
            dir,
            url: server.url.clone(),
            manager,
            server: Some(server),
            cleanup: true,
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The host pid of a sandbox's agent (from the file the engine keeps beside it).
    pub fn agent_pid(&self, id: &str) -> i32 {
        std::fs::read_to_string(self.data_dir().join("agents").join(format!("{id}.pid")))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Kills a sandbox's agent from the host, as a crash (an OOM kill) would, and returns its
    /// pid. None of its threads runs its code again once this returns (SIGKILL), but it may
    /// take a while to die, its socket open meanwhile: a call made at once may reach the dying
    /// agent, whose connection is then reset with the request unread.
    pub fn crash_agent(&self, id: &str) -> i32 {
        let pid = self.agent_pid(id);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
        pid
    }

    /// The engine's API for a client in this process ([`sandbox_mcp_api::connect_to`]).
    pub fn in_process(&self) -> sandbox_mcp_api::InProcess {
        self.server.as_ref().unwrap().in_process()
    }

    /// The generated API client, authenticated.
    pub fn client(&self) -> Client {
        connect(&self.url, Some(&ApiKey::new(KEY))).unwrap()
    }

    /// A raw HTTP client for requests the typed client cannot make (bad input on purpose).
    pub fn http(&self) -> reqwest::Client {
        sandbox_mcp_api::http_builder().no_proxy().build().unwrap()
    }

    /// The engine API as `tenant` (none: the operator, untenanted): status and JSON answer.
    pub async fn as_tenant(
        &self,
        tenant: Option<&str>,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .http()
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(KEY);
        if let Some(t) = tenant {
            req = req.header("x-sandbox-tenant", t);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        (
            r.status().as_u16(),
            r.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    /// Stops serving and pauses sandboxes, like a clean engine shutdown; keeps the data dir for
    /// another engine ([`Self::start_on`]). Whatever is not handed on goes when the result is
    /// dropped.
    pub async fn stop(mut self) -> Stopped {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        self.cleanup = false;
        Stopped {
            dir: Some(std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().unwrap(),
            )),
            driver: self.manager.driver().clone(),
        }
    }

    /// An MCP client connected in-process to a real MCP server that uses this engine.
    pub async fn mcp(&self) -> McpClient {
        self.mcp_with(ServerSettings::default(), "all").await
    }

    pub async fn mcp_with(&self, settings: ServerSettings, tools: &str) -> McpClient {
        mcp_for(
            Backend::remote(&self.url, Some(ApiKey::new(KEY))).unwrap(),
            settings,
            tools,
        )
        .await
    }

    /// A client whose notifications go to `handler`.
    pub async fn mcp_handled<H: rmcp::ClientHandler>(
        &self,
        handler: H,
    ) -> RunningService<RoleClient, H> {
        mcp_with_handler(
            Backend::remote(&self.url, Some(ApiKey::new(KEY))).unwrap(),
            ServerSettings::default(),
            "all",
            handler,
        )
        .await
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        if !self.cleanup {
            return;
        }
        // Sandboxes outlive an engine by design; tests must not leave any behind.
        let driver = self.manager.driver().isolation();
        for record in self.manager.list(None, &[], None) {
            let _ = driver.destroy(&record.id);
        }
        leave_nothing(driver, &self.data_dir());
    }
}

/// Destroys the sandboxes a data dir still has and unmounts its sandbox store (a loop-mounted
/// image where the directory is not on btrfs): what an engine leaves on the machine.
fn leave_nothing(driver: &dyn sandbox_mcp_model::driver::Isolation, data: &Path) {
    if let Ok(entries) = std::fs::read_dir(data.join("sandboxes")) {
        for e in entries.flatten() {
            let _ = driver.destroy(&e.file_name().to_string_lossy());
        }
    }
    sandbox_mcp_linux::disk::release(&data.join("sandboxes"));
}

/// The data dir of a stopped [`TestEngine`]: another engine starts on it with
/// [`TestEngine::start_on`]; dropped instead, it takes the stopped engine's sandboxes and its
/// store's mount with it, as dropping a running `TestEngine` does.
pub struct Stopped {
    dir: Option<tempfile::TempDir>,
    driver: sandbox_mcp_engine::driver::DriverHandle,
}

impl Stopped {
    pub fn path(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }
}

impl From<Stopped> for tempfile::TempDir {
    fn from(mut stopped: Stopped) -> Self {
        stopped.dir.take().unwrap()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            leave_nothing(self.driver.isolation(), &dir.path().join("data"));
        }
    }
}

/// A temporary directory for engines run as separate processes: on drop, the sandbox store an
/// engine mounted under `<dir>/data` is unmounted so the directory can go.
pub struct TempData {
    pub dir: tempfile::TempDir,
}

impl TempData {
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("smcp")
                .tempdir_in("/tmp")
                .unwrap(),
        }
    }

    /// The data dir (`<dir>/data`).
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for TempData {
    fn drop(&mut self) {
        sandbox_mcp_linux::disk::release(&self.data().join("sandboxes"));
    }
}

/// `command` run through the API's streamed exec (`exec_command_stream`): its NDJSON lines, the
/// last one its result.
pub async fn exec_streamed(client: &Client, id: &str, command: &str) -> Vec<serde_json::Value> {
    use futures::StreamExt as _;
    let body = serde_json::from_value::<sandbox_mcp_api::types::ExecRequest>(
        serde_json::json!({ "command": command }),
    )
    .unwrap();
    let answer = client
        .exec_command_stream()
        .sandbox_id(id)
        .body(body)
        .send()
        .await
        .unwrap()
        .into_inner();
    let mut bytes = Vec::new();
    let mut stream = answer.into_inner();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}
