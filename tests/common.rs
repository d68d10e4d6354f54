//! Shared test fixtures: a real engine on a temporary data dir, real sandboxes, an rmcp client
//! talking to the real MCP server over an in-process pipe.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use sandbox_mcp::wiring::open_manager;
use sandbox_mcp_api::{ApiKey, Client, connect};
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_engine_http::server::EngineServer;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::{SandboxMcp, ServerSettings};
use sandbox_mcp_server::tooldefs::registry;

pub const KEY: &str = "test-key-0123456789";
pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

/// Whether this machine can run real sandboxes; the reason when it cannot.
///
/// Probed once by creating a sandbox. Tests that need sandboxes call [`require_sandboxes!`],
/// which skips with this reason printed, or fails when `SANDBOX_MCP_REQUIRE_SANDBOX=1` (CI sets
/// it, so a broken sandbox never passes as a skip there).
pub fn sandbox_support() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            ensure_host_tools();
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let engine = TestEngine::start().await;
                    let result = engine
                        .client()
                        .create_sandbox()
                        .body(sandbox_mcp_api::types::CreateSandboxRequest::default())
                        .send()
                        .await;
                    match result {
                        Ok(_) => Ok(()),
                        Err(e) => Err(format!(
                            "needs Linux user, mount, pid and network namespaces with overlayfs (and root for cgroups): {e}"
                        )),
                    }
                })
            })
            .join()
            .unwrap_or_else(|_| Err("the sandbox probe panicked".into()))
        })
        .clone()
}

/// The base template shows the host's /usr, and the tests run python3 and node inside sandboxes;
/// disk limits need mkfs.btrfs; the test network (`testnet`) needs `ip` and `openssl`. On a fresh
/// machine that lacks them, install them (as root, with apt) so `cargo test` works with no other
/// step; say so on stderr. Once per process: concurrent apt-get runs would fight over its lock.
pub fn ensure_host_tools() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(install_host_tools);
}

fn install_host_tools() {
    let missing: Vec<&str> = [
        ("python3", "/usr/bin/python3"),
        ("nodejs", "/usr/bin/node"),
        ("btrfs-progs", "/usr/sbin/mkfs.btrfs"),
        ("iproute2", "/usr/sbin/ip"),
        ("openssl", "/usr/bin/openssl"),
        // pip inside a sandbox, for the package-index test.
        ("python3-pip", "/usr/lib/python3/dist-packages/pip"),
        // Clients that must trust the secrets CA inside a sandbox.
        (
            "python3-requests",
            "/usr/lib/python3/dist-packages/requests",
        ),
        ("git", "/usr/bin/git"),
        // OCI images the template tests build (a static busybox userland).
        ("busybox-static", "/bin/busybox"),
        // …and a musl userland (an Alpine-like image): musl's loader and compiler.
        ("musl-tools", "/usr/bin/musl-gcc"),
        // Desktops (computer use): the virtual display, a window manager, and fonts.
        ("xvfb", "/usr/bin/Xvfb"),
        ("xfonts-base", "/usr/share/fonts/X11/misc"),
        (
            "matchbox-window-manager",
            "/usr/bin/matchbox-window-manager",
        ),
        ("fonts-dejavu-core", "/usr/share/fonts/truetype/dejavu"),
    ]
    .into_iter()
    .filter(|(_, path)| !std::path::Path::new(path).exists())
    .map(|(pkg, _)| pkg)
    .chain(
        // The desktop tests' app is Tk; its module's path names the Python version. Debian's
        // python3 (the one sandboxes see), not whichever python3 comes first on PATH.
        (!std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import tkinter"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success()))
        .then_some("python3-tk"),
    )
    .collect();
    if missing.is_empty()
        || !nix::unistd::geteuid().is_root()
        || !std::path::Path::new("/usr/bin/apt-get").exists()
    {
        return;
    }
    eprintln!(
        "tests: installing {} (needed inside sandboxes) with apt-get",
        missing.join(" ")
    );
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&missing);
    let installed = apt(&install) || (apt(&["update"]) && apt(&install));
    if !installed {
        eprintln!(
            "tests: apt-get could not install {}; tests that use them will fail",
            missing.join(" ")
        );
    }
}

#[macro_export]
macro_rules! require_sandboxes {
    () => {
        if let Err(reason) = $crate::common::sandbox_support() {
            if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                panic!("sandboxes are required here but unavailable: {reason}");
            }
            eprintln!("SKIPPED {}: {reason}", module_path!());
            return;
        }
    };
}

/// Whether cgroup limits are enforced here (root with cgroups).
pub fn cgroups_enforced() -> bool {
    !matches!(
        sandbox_mcp_linux::cgroups::Layout::detect(),
        sandbox_mcp_linux::cgroups::Layout::None
    )
}

#[macro_export]
macro_rules! require_cgroups {
    () => {
        $crate::require_sandboxes!();
        if !$crate::common::cgroups_enforced() {
            if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                panic!("cgroups are required here but unavailable");
            }
            eprintln!(
                "SKIPPED {}: needs writable cgroups (run as root)",
                module_path!()
            );
            return;
        }
    };
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

    pub async fn start_on(dir: tempfile::TempDir, config: EngineConfig) -> Self {
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

    /// The generated API client, authenticated.
    pub fn client(&self) -> Client {
        connect(&self.url, Some(&ApiKey::new(KEY))).unwrap()
    }

    /// A raw HTTP client for requests the typed client cannot make (bad input on purpose).
    pub fn http(&self) -> reqwest::Client {
        sandbox_mcp_api::http_builder().no_proxy().build().unwrap()
    }

    /// Stops serving and pauses sandboxes, like a clean engine shutdown; keeps the data dir.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        self.cleanup = false;
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
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
        if let Ok(entries) = std::fs::read_dir(self.data_dir().join("sandboxes")) {
            for e in entries.flatten() {
                let _ = driver.destroy(&e.file_name().to_string_lossy());
            }
        }
        sandbox_mcp_linux::disk::release(&self.data_dir().join("sandboxes"));
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

pub type McpClient = RunningService<RoleClient, ()>;

/// An rmcp client and our server connected through an in-memory duplex pipe.
pub async fn mcp_for(backend: Backend, settings: ServerSettings, tools: &str) -> McpClient {
    mcp_with_handler(backend, settings, tools, ()).await
}

/// Like [`mcp_for`], with a client handler that sees notifications (progress, say).
pub async fn mcp_with_handler<H: rmcp::ClientHandler>(
    backend: Backend,
    settings: ServerSettings,
    tools: &str,
    handler: H,
) -> RunningService<RoleClient, H> {
    let server = SandboxMcp::new(backend, registry().select(tools).unwrap(), settings);
    let (client_io, server_io) = tokio::io::duplex(16 * 1024 * 1024);
    tokio::spawn(async move {
        let (r, w) = tokio::io::split(server_io);
        if let Ok(running) = server.serve((r, w)).await {
            let _ = running.waiting().await;
        }
    });
    let (r, w) = tokio::io::split(client_io);
    handler.serve((r, w)).await.unwrap()
}

/// Calls a tool and returns the result (tool errors included; protocol errors panic).
pub async fn call(client: &McpClient, name: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("arguments must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(map))
        .await
        .unwrap_or_else(|e| panic!("{name} failed at the protocol level: {e}"))
}

/// The structured content of a successful call.
pub async fn ok(client: &McpClient, name: &str, args: Value) -> Value {
    let result = call(client, name, args.clone()).await;
    assert_ne!(
        result.is_error,
        Some(true),
        "{name}({args}) failed: {}",
        text(&result)
    );
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// The text of an error result (asserting it is one).
pub async fn err(client: &McpClient, name: &str, args: Value) -> String {
    let result = call(client, name, args.clone()).await;
    assert_eq!(
        result.is_error,
        Some(true),
        "{name}({args}) should have failed: {}",
        text(&result)
    );
    text(&result)
}

pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| match c {
            rmcp::model::ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Creates a sandbox through MCP and returns its id.
pub async fn create(client: &McpClient) -> String {
    let sandbox = ok(client, "sandbox_create", json!({})).await;
    sandbox["id"].as_str().unwrap().to_string()
}

/// Runs a command through MCP and returns the exec result.
pub async fn exec(client: &McpClient, id: &str, command: &str) -> Value {
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": command}),
    )
    .await
}

/// Snapshots a sandbox and restores that snapshot at once (every process stops).
pub async fn snapshot_and_restore(client: &McpClient, id: &str) {
    let snap = ok(client, "sandbox_snapshot_create", json!({"sandbox_id": id})).await;
    ok(
        client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
}

/// stdout of a command that must succeed.
pub async fn sh(client: &McpClient, id: &str, command: &str) -> String {
    let r = exec(client, id, command).await;
    assert_eq!(r["exit_code"], 0, "`{command}` failed: {r}");
    r["stdout"].as_str().unwrap().to_string()
}

/// An engine process on `data` (a new port each time), ready to serve.
pub async fn spawn_engine_process(data: &std::path::Path) -> (std::process::Child, String) {
    spawn_engine_process_env(data, &[]).await
}

/// [`spawn_engine_process`] with more environment variables (settings).
pub async fn spawn_engine_process_env(
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    spawn_engine_logged(data, env, std::process::Stdio::null()).await
}

/// [`spawn_engine_process_env`] with the engine's log going to `stderr`.
pub async fn spawn_engine_logged(
    data: &std::path::Path,
    env: &[(&str, &str)],
    stderr: std::process::Stdio,
) -> (std::process::Child, String) {
    spawn_engine_with(data, env, stderr, |_| {}).await
}

/// [`spawn_engine_logged`], with the command adjusted by `configure` before it runs (limits
/// set in a `pre_exec`, say).
pub async fn spawn_engine_with(
    data: &std::path::Path,
    env: &[(&str, &str)],
    stderr: std::process::Stdio,
    configure: impl FnOnce(&mut std::process::Command),
) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = std::process::Command::new(BIN);
    command
        .args(["engine", "--listen", &format!("127.0.0.1:{port}")])
        .env("SANDBOX_MCP_DATA_DIR", data)
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .env("SANDBOX_MCP_MAX_SANDBOXES", "1000")
        .env("SANDBOX_MCP_IDLE_PAUSE", "0")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    configure(&mut command);
    let child = command.spawn().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while http
        .get(format!("{url}/v1/health"))
        .bearer_auth(KEY)
        .send()
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < deadline, "engine did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, url)
}

/// Calls the engine API at `base` with the test key: the status, and the body as JSON (`Null`
/// when it is not JSON).
pub async fn api(base: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let mut req = http
        .request(method.parse().unwrap(), format!("{base}{path}"))
        .bearer_auth(KEY);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Loop devices whose backing file is `image` (a deleted one included).
pub fn loop_devices_of(image: &std::path::Path) -> Vec<String> {
    let image = image.display().to_string();
    std::fs::read_dir("/sys/block")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let backing =
                        std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
                    backing
                        .trim_end()
                        .trim_end_matches(" (deleted)")
                        .eq(&image)
                        .then(|| e.file_name().to_string_lossy().into_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether something is mounted at `path` in this mount namespace.
pub fn mounted(path: &std::path::Path) -> bool {
    let path = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_str()))
}

/// Kills and deletes every sandbox an engine process left on `data` (after `kill -9`, say), and
/// lets go of its store.
pub fn kill_left_behind(data: &std::path::Path) {
    use sandbox_mcp_model::driver::Isolation;
    let config = EngineConfig::new(data.to_path_buf());
    let Ok(driver) = sandbox_mcp_linux::NamespacesDriver::new(sandbox_mcp_linux::driver::Options {
        sandboxes_dir: config.sandboxes_dir(),
        exe: PathBuf::from(BIN),
        disk_limits: config.disk_limits,
        max_sandboxes: config.max_sandboxes,
        uid_registry: config.uid_registry.clone(),
        favordynmods: false,
    }) else {
        return;
    };
    if let Ok(entries) = std::fs::read_dir(config.sandboxes_dir()) {
        for e in entries.flatten() {
            let _ = driver.destroy(&e.file_name().to_string_lossy());
        }
    }
    driver.close();
}

/// An engine process run as user `nobody` on a data dir in `dir` (which it is given), with
/// `args` added; and an MCP client for it once it answers.
pub async fn unprivileged_engine(
    dir: &std::path::Path,
    args: &[&str],
) -> (std::process::Child, McpClient) {
    use std::os::unix::process::CommandExt;
    let nobody = 65534;
    std::os::unix::fs::chown(dir, Some(nobody), Some(nobody)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let engine = std::process::Command::new(BIN)
        .args(["engine", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env_clear()
        .env("HOME", dir)
        .env("SANDBOX_MCP_DATA_DIR", dir.join("data"))
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .uid(nobody)
        .gid(nobody)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let backend =
        Backend::remote(&format!("http://127.0.0.1:{port}"), Some(ApiKey::new(KEY))).unwrap();
    let client = mcp_for(backend, Default::default(), "all").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while call(&client, "sandbox_list", json!({})).await.is_error == Some(true) {
        assert!(
            std::time::Instant::now() < deadline,
            "the unprivileged engine did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (engine, client)
}

/// `flag value` is refused with `expected` in the message, on both `sandbox-mcp` and
/// `sandbox-mcp engine` (checked at parse time: `--help` never runs).
pub fn assert_flag_refused_on_both_commands(flag: &str, value: &str, expected: &str) {
    for args in [
        vec![flag, value, "--help"],
        vec!["engine", flag, value, "--help"],
    ] {
        let out = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
