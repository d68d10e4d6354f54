//! Settings: the preview flags of `sandbox-mcp` and `sandbox-mcp engine`, checked and applied.

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;

use super::{Url, get, token_header};

/// `--preview-listen` and `--preview-domain` (and their variables) on both commands: checked
/// with a way to write them, used in the URLs, an explicit address that is taken is an error,
/// and `off` makes create say previews are off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_settings_on_both_commands() {
    for (flag, value, expected) in [
        (
            "--preview-listen",
            "localhost",
            "is not an address to listen on",
        ),
        ("--preview-domain", "under_score.test", "is not a domain"),
    ] {
        assert_flag_refused_on_both_commands(flag, value, expected);
    }
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: previews need root");
        return;
    }
    // The standalone engine, configured by environment.
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempData::new();
    let data = dir.data();
    let api = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut engine = std::process::Command::new(BIN)
        .args(["engine", "--listen", &format!("127.0.0.1:{api}")])
        .env("SANDBOX_MCP_DATA_DIR", &data)
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .env("SANDBOX_MCP_PREVIEW_LISTEN", format!("127.0.0.1:{listen}"))
        .env("SANDBOX_MCP_PREVIEW_DOMAIN", "Preview.Example.test")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let base = format!("http://127.0.0.1:{api}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/v1/health")).send().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "engine did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, sandbox) = crate::common::api(&base, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let id = sandbox["id"].as_str().unwrap();
    let (_, p) = crate::common::api(
        &base,
        "POST",
        &format!("/v1/sandboxes/{id}/previews"),
        Some(json!({"port": 5000})),
    )
    .await;
    let url = Url::parse(p["url"].as_str().unwrap());
    assert_eq!(
        url.host,
        format!(
            "5000-{}.preview.example.test:{listen}",
            id.replace('_', "-")
        ),
        "{p}"
    );
    // That listener serves it (nothing listens in the sandbox yet: the 502 page).
    let a = get(&url, "/", &token_header(&url)).await;
    assert_eq!(a.status, 502, "{a:?}");
    // Another engine asking for the same address explicitly fails, saying which.
    let other = TempData::new();
    let out = std::process::Command::new("timeout")
        .args(["20", BIN, "engine", "--listen", "127.0.0.1:0"])
        .args(["--preview-listen", &format!("127.0.0.1:{listen}")])
        .env("SANDBOX_MCP_DATA_DIR", other.data())
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot listen for previews on"), "{said}");
    let _ = http
        .delete(format!("{base}/v1/sandboxes/{id}"))
        .bearer_auth(KEY)
        .send()
        .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(engine.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    assert!(engine.wait().unwrap().success());

    // The embedded engine with previews off: create says so.
    let off = TempData::new();
    let mut server = std::process::Command::new(BIN)
        .args(["--preview-listen", "off"])
        .env_remove("SANDBOX_MCP_URL")
        .env("SANDBOX_MCP_DATA_DIR", off.data())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let said = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut stdin = server.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(server.stdout.take().unwrap());
        let mut ask = |msg: Value| {
            writeln!(stdin, "{msg}").unwrap();
            if msg.get("id").is_none() {
                return Value::Null;
            }
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            serde_json::from_str::<Value>(&line).unwrap()
        };
        ask(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}));
        ask(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let created = ask(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "sandbox_create", "arguments": {}}}));
        let id = created["result"]["structuredContent"]["id"].as_str().unwrap().to_string();
        let refused = ask(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "sandbox_preview_create", "arguments": {"sandbox_id": id, "port": 3000}}}));
        ask(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "sandbox_kill", "arguments": {"sandbox_id": id}}}));
        drop(stdin);
        let _ = server.wait();
        refused
    })
    .await
    .unwrap();
    assert_eq!(said["result"]["isError"], true, "{said}");
    assert!(
        said.to_string().contains("previews are off on this engine"),
        "{said}"
    );
}
