//! The binary: the keys CLI, `--dev` refused off loopback, `--public-url`'s host accepted, and a
//! graceful shutdown on SIGTERM, which ends the session sandboxes.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{BIN, KEY, TestEngine};
use crate::require_sandboxes;

use super::Raw;

fn cli(data: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("SANDBOX_MCP_DATA_DIR", data)
        .env_remove("SANDBOX_MCP_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn keys_cli_prints_the_token_alone_and_stores_only_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(dir.path(), &["keys", "create", "--tenant", "team-a"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "stdout must be the token alone: {stdout:?}"
    );
    let token = stdout.trim_end_matches('\n');
    assert!(
        token.starts_with("smcp_") && token.len() > 30 && !token.contains(' '),
        "{token}"
    );

    let file = dir.path().join("mcp-keys.json");
    let stored = std::fs::read_to_string(&file).unwrap();
    assert!(!stored.contains(token), "the token must not be stored");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let list = cli(dir.path(), &["keys", "list"]);
    let listed = String::from_utf8(list.stdout).unwrap();
    assert!(
        listed.contains("team-a") && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(token));
    let id = listed
        .lines()
        .find(|l| l.contains("team-a"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let revoke = cli(dir.path(), &["keys", "revoke", &id]);
    assert!(revoke.status.success());
    assert!(revoke.stdout.is_empty());
    let listed = String::from_utf8(cli(dir.path(), &["keys", "list"]).stdout).unwrap();
    assert!(listed.contains("revoked"), "{listed}");

    let bad = cli(dir.path(), &["keys", "create", "--tenant", "Bad Name!"]);
    assert!(!bad.status.success());
    assert!(bad.stdout.is_empty());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid tenant name"));
    let missing = cli(dir.path(), &["keys", "revoke", "key_nope"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("keys list"));
}

#[test]
fn dev_mode_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(
        dir.path(),
        &[
            "serve",
            "--http",
            "0.0.0.0:0",
            "--dev",
            "--url",
            "http://127.0.0.1:9",
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--dev") && stderr.contains("loopback"),
        "{stderr}"
    );
}

/// A `serve --http` process, killed when dropped: a test that fails midway leaves none running.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Served {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

/// A `serve --http` process on a free port, pointed at `engine`; its address once it listens.
fn spawn_http_server(
    data: &std::path::Path,
    engine: &TestEngine,
    extra: &[&str],
) -> (Served, String) {
    spawn_http_server_at(data, &engine.url, extra)
}

/// The same, pointed at the engine at `engine_url`.
fn spawn_http_server_at(
    data: &std::path::Path,
    engine_url: &str,
    extra: &[&str],
) -> (Served, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Served(
        Command::new(BIN)
            .args(["serve", "--http", "127.0.0.1:0"])
            .args(extra)
            .env("SANDBOX_MCP_DATA_DIR", data)
            .env("SANDBOX_MCP_URL", engine_url)
            .env("SANDBOX_MCP_API_KEY", KEY)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "server exited before listening"
        );
        if let Some(rest) = line.trim().strip_prefix("sandbox-mcp: serving MCP on ") {
            break rest.to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (child, addr)
}

/// A `serve --http` process (as [`spawn_http_server`]) with a key of tenant `alpha` made on its
/// data dir: the process, a client of it, and the key.
fn keyed_server(
    data: &std::path::Path,
    engine: &TestEngine,
    extra: &[&str],
) -> (Served, Raw, String) {
    let token = String::from_utf8(cli(data, &["keys", "create", "--tenant", "alpha"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    let (child, url) = spawn_http_server(data, engine, extra);
    let raw = Raw {
        http: sandbox_mcp_api::http_builder().no_proxy().build().unwrap(),
        url,
    };
    (child, raw, token)
}

/// `--session-sandbox`: the sandboxes of sessions still open when the server stops (SIGTERM) are
/// killed with it, not left running with no session to reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_sandboxes_end_with_the_server() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let data = tempfile::tempdir().unwrap();
    let (mut child, raw, token) = keyed_server(data.path(), &engine, &["--session-sandbox"]);
    for id in [2, 3] {
        let session = raw.open_session(Some(&token)).await;
        let out = raw
            .call(
                &token,
                &session,
                id,
                "sandbox_exec",
                json!({"command": "echo up"}),
            )
            .await;
        assert_eq!(out["structuredContent"]["stdout"], "up\n", "{out}");
    }
    assert_eq!(engine.manager.list(None, &[], None).len(), 2);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = crate::common::exit_within(&mut child, 40, "the server must exit on SIGTERM");
    assert!(status.success(), "{status}");
    let left = engine.manager.list(None, &[], None);
    assert!(
        left.is_empty(),
        "session sandboxes outlived the server: {left:?}"
    );
}

/// Behind a proxy that ends TLS, clients reach a keys-only server by its public name: the host of
/// `--public-url` is accepted without OAuth, and other names still get 403.
#[tokio::test]
async fn the_public_urls_host_is_accepted_without_oauth() {
    let data = tempfile::tempdir().unwrap();
    // The Host check comes before any engine call: no engine listens at this URL.
    let (child, url) = spawn_http_server_at(
        data.path(),
        "http://127.0.0.1:9",
        &["--public-url", "https://MCP.Proxy.example:8443"],
    );
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let post = |host: &'static str| {
        http.post(url.as_str())
            .header("host", host)
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            .send()
    };
    for (host, want) in [
        ("mcp.proxy.example", 401),
        ("mcp.proxy.example:443", 401),
        ("evil.example", 403),
        ("mcp.proxy.example.evil.example", 403),
    ] {
        let r = post(host).await.unwrap();
        assert_eq!(r.status().as_u16(), want, "Host: {host}");
    }
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_calls_then_exits() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let data = tempfile::tempdir().unwrap();
    let (mut child, raw, token) = keyed_server(data.path(), &engine, &[]);
    let session = raw.open_session(Some(&token)).await;
    let created = raw
        .call(&token, &session, 2, "sandbox_create", json!({}))
        .await;
    let id = created["structuredContent"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let slow = {
        let raw = Raw {
            http: raw.http.clone(),
            url: raw.url.clone(),
        };
        let (token, session, id) = (token.clone(), session.clone(), id.clone());
        tokio::spawn(async move {
            raw.call(
                &token,
                &session,
                3,
                "sandbox_exec",
                json!({"sandbox_id": id, "command": "sleep 2; echo finished"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let result = slow.await.unwrap();
    assert_eq!(
        result["structuredContent"]["stdout"], "finished\n",
        "{result}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    // The sandbox is the tenant's, not the session's: it outlives the server.
    assert_eq!(engine.manager.list(None, &[], None).len(), 1);
    engine
        .client()
        .kill_sandbox()
        .sandbox_id(id)
        .send()
        .await
        .unwrap();
}
