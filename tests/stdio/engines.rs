//! Engines behind the stdio server: the embedded one (shared by a second server), the standalone
//! engine of the same data dir, and a remote one over HTTP with a key.

use std::process::Command;

use serde_json::json;

use crate::common::{BIN, KEY, TestEngine};
use crate::require_sandboxes;

use super::Server;

#[tokio::test]
async fn embedded_engine_serves_tools_and_is_shared_by_a_second_server() {
    require_sandboxes!();
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let data = data.to_str().unwrap().to_string();
    let result = tokio::task::spawn_blocking(move || {
        let envs = [("SANDBOX_MCP_DATA_DIR", data.as_str())];
        let mut first = Server::spawn(&envs);
        first.initialize("2025-06-18");
        first.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_create", "arguments": {}}}));
        let created = first.recv();
        let id = created["result"]["structuredContent"]["id"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
        // The engine it serves runs on a pool of its own, a worker per core (its own runtime
        // has one worker: `cli::tests`).
        let cores = std::thread::available_parallelism().unwrap().get();
        assert!(first.threads_named("engine") >= cores, "a worker per core");
        // A second MCP server on the same data dir shares the first one's engine.
        let mut second = Server::spawn(&envs);
        second.initialize("2025-06-18");
        second.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "sandbox_exec", "arguments": {"sandbox_id": id, "command": "echo shared"}}}));
        let r = second.recv();
        assert_eq!(r["result"]["structuredContent"]["stdout"], "shared\n", "{r}");
        // It attached: it starts no engine pool.
        assert_eq!(second.threads_named("engine"), 0);
        // The owner exits; the second takes over and the sandbox (paused) comes back on use.
        assert!(first.close_and_wait().success());
        second.send(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "sandbox_exec", "arguments": {"sandbox_id": id, "command": "echo still here"}}}));
        let r = second.recv();
        assert_eq!(r["result"]["structuredContent"]["stdout"], "still here\n", "{r}");
        second.send(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "sandbox_kill", "arguments": {"sandbox_id": id}}}));
        let r = second.recv();
        assert_eq!(r["result"]["structuredContent"]["killed"], true, "{r}");
        assert!(second.close_and_wait().success());
    })
    .await;
    drop(dir);
    result.unwrap();
}

/// A standalone engine owns its data dir: a second one is refused with the owner named, and an
/// MCP server on the same data dir attaches to it instead of starting its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_attaches_to_the_standalone_engine_of_its_data_dir() {
    require_sandboxes!();
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let (mut engine, url) = crate::common::spawn_engine_process(&data).await;
    let second = Command::new(BIN)
        .args(["engine", "--listen", "127.0.0.1:0"])
        .env("SANDBOX_MCP_DATA_DIR", &data)
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        said.contains("another engine already serves")
            && said.contains(&url)
            && said.contains(&format!("process {}", engine.id())),
        "{said}"
    );

    let data_str = data.to_str().unwrap().to_string();
    let id = tokio::task::spawn_blocking(move || {
        let mut server = Server::spawn(&[("SANDBOX_MCP_DATA_DIR", data_str.as_str())]);
        server.initialize("2025-06-18");
        server.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_create", "arguments": {}}}));
        let created = server.recv();
        let id = created["result"]["structuredContent"]["id"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
        assert!(server.close_and_wait().success());
        id
    })
    .await
    .unwrap();
    // The sandbox lives in the standalone engine, which outlives the MCP server that made it.
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let got = http
        .get(format!("{url}/v1/sandboxes/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert!(got.status().is_success(), "{}", got.status());
    let killed = http
        .delete(format!("{url}/v1/sandboxes/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert!(killed.status().is_success(), "{}", killed.status());

    // SIGTERM: the engine withdraws its endpoint before it lets go of the lock.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(engine.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    assert!(engine.wait().unwrap().success());
    assert!(!data.join("engine.json").exists());
}

/// Keeps `KEY` referenced for engines started over HTTP in other modules.
#[allow(dead_code)]
fn _key() -> &'static str {
    KEY
}

#[tokio::test]
async fn remote_engine_over_http_with_api_key() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let url = engine.url.clone();
    tokio::task::spawn_blocking(move || {
        let mut server = Server::spawn(&[("SANDBOX_MCP_URL", &url), ("SANDBOX_MCP_API_KEY", KEY)]);
        server.initialize("2025-06-18");
        server.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_template_list", "arguments": {}}}));
        let r = server.recv();
        assert_eq!(r["result"]["structuredContent"]["templates"][0]["name"], "base", "{r}");
        let mut wrong = Server::spawn(&[("SANDBOX_MCP_URL", &url), ("SANDBOX_MCP_API_KEY", "wrong")]);
        wrong.initialize("2025-06-18");
        wrong.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_template_list", "arguments": {}}}));
        let r = wrong.recv();
        let text = r["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("SANDBOX_MCP_API_KEY"), "{text}");
        assert!(server.close_and_wait().success());
        assert!(wrong.close_and_wait().success());
    })
    .await
    .unwrap();
}
