//! Engines as processes of their own (the real binary, as root or as `nobody`), the engine API
//! they serve, and flags both commands must refuse.

use std::time::Duration;

use serde_json::Value;

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;

use sandbox_mcp_testkit::engine::{self, free_port};

use super::{BIN, KEY};
use super::{McpClient, mcp_for};

/// `child`'s exit status once it has exited: `what` must happen within `secs` seconds, or the
/// child is killed and the test fails.
pub fn exit_within(
    child: &mut std::process::Child,
    secs: u64,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what}: the process did not exit within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An engine process on `data` (a new port each time), ready to serve.
pub async fn spawn_engine_process(data: &std::path::Path) -> (std::process::Child, String) {
    spawn_engine_process_env(data, &[]).await
}

/// [`spawn_engine_process`] with more environment variables (settings). Its log is kept aside
/// (an unnamed file), for the failure of an engine that does not start to quote.
pub async fn spawn_engine_process_env(
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    let log = tempfile::tempfile().unwrap();
    let stderr = log.try_clone().unwrap().into();
    spawn_engine(data, env, (stderr, Some(log)), |_| {}).await
}

/// [`spawn_engine_process_env`] with the engine's log going to `stderr`.
pub async fn spawn_engine_logged(
    data: &std::path::Path,
    env: &[(&str, &str)],
    stderr: std::process::Stdio,
) -> (std::process::Child, String) {
    spawn_engine(data, env, (stderr, None), |_| {}).await
}

/// [`spawn_engine_logged`], with the command adjusted by `configure` before it runs (limits
/// set in a `pre_exec`, say).
pub async fn spawn_engine_with(
    data: &std::path::Path,
    env: &[(&str, &str)],
    stderr: std::process::Stdio,
    configure: impl FnOnce(&mut std::process::Command),
) -> (std::process::Child, String) {
    spawn_engine(data, env, (stderr, None), configure).await
}

/// Starts the engine and waits until it [serves](serving).
async fn spawn_engine(
    data: &std::path::Path,
    env: &[(&str, &str)],
    (stderr, log): (std::process::Stdio, Option<std::fs::File>),
    configure: impl FnOnce(&mut std::process::Command),
) -> (std::process::Child, String) {
    let port = free_port();
    let mut command = engine::command(BIN, data, KEY, port);
    command
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    configure(&mut command);
    let mut child = command.spawn().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    serving(&mut child, &url, log).await;
    (child, url)
}

/// Waits until engine process `child` serves at `url`. One that exits first, or does not serve
/// within 30 s, fails the test at once, quoting `log` when that is where it writes.
async fn serving(child: &mut std::process::Child, url: &str, log: Option<std::fs::File>) {
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let said = |log: Option<std::fs::File>| {
        use std::io::{Read, Seek};
        let mut text = String::new();
        if let Some(mut log) = log {
            let _ = log.rewind();
            let _ = log.read_to_string(&mut text);
        }
        text
    };
    while http
        .get(format!("{url}/v1/health"))
        .bearer_auth(KEY)
        .send()
        .await
        .is_err()
    {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the engine exited before it served ({status}); its log:\n{}",
                said(log)
            );
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the engine did not serve within 30 s; its log:\n{}",
                said(log)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// An engine process of a test: killed when dropped, and the sandboxes it leaves with it.
/// Sandboxes outlive their engine by design (the next one adopts them); a test must leave none
/// behind, even when it fails.
pub struct EngineProcess {
    child: std::process::Child,
    data: std::path::PathBuf,
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        super::kill_left_behind(&self.data);
    }
}

/// An engine process run as user `nobody` on a data dir in `dir` (which it is given), with
/// `args` added; and an MCP client for it once it answers.
pub async fn unprivileged_engine(
    dir: &std::path::Path,
    args: &[&str],
) -> (EngineProcess, McpClient) {
    use std::os::unix::process::CommandExt;
    let nobody = 65534;
    std::os::unix::fs::chown(dir, Some(nobody), Some(nobody)).unwrap();
    let port = free_port();
    let log = tempfile::tempfile().unwrap();
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
        .stderr(log.try_clone().unwrap())
        .spawn()
        .unwrap();
    let mut engine = EngineProcess {
        child: engine,
        data: dir.join("data"),
    };
    let url = format!("http://127.0.0.1:{port}");
    serving(&mut engine.child, &url, Some(log)).await;
    let backend = Backend::remote(&url, Some(ApiKey::new(KEY))).unwrap();
    let client = mcp_for(backend, Default::default(), "all").await;
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
