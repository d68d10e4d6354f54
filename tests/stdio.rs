//! The real binary over stdio: framing, protocol versions, bad input, shutdown.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{BIN, KEY, TestEngine, loop_devices_of, mounted};
use crate::require_sandboxes;

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Server {
    fn spawn(envs: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()); // debug logs would fill an unread pipe
        cmd.env_remove("SANDBOX_MCP_URL").env("RUST_LOG", "debug");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// A server whose control plane is a closed port: fine for anything but tool calls.
    fn offline() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::spawn(&[("SANDBOX_MCP_URL", &format!("http://127.0.0.1:{port}"))])
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// The next line on stdout, which must be a JSON-RPC message.
    fn recv(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let value: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"));
        assert_eq!(value["jsonrpc"], "2.0", "{line}");
        value
    }

    fn initialize(&mut self, version: &str) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}));
        let response = self.recv();
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        response
    }

    fn close_and_wait(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn initializes_with_each_supported_protocol_version() {
    for version in ["2025-06-18", "2025-11-25"] {
        let mut server = Server::offline();
        let response = server.initialize(version);
        let result = &response["result"];
        assert_eq!(result["protocolVersion"], version);
        assert_eq!(result["serverInfo"]["name"], "sandbox-mcp");
        assert_eq!(result["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(result["capabilities"]["tools"].is_object());
        assert!(server.close_and_wait().success());
    }
}

#[test]
fn answers_stateless_2026_requests_with_inline_metadata() {
    let mut server = Server::offline();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    server.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
    );
    let discover = server.recv();
    let versions = discover["result"]["supportedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(versions.contains(&json!("2026-07-28")), "{discover}");
    assert!(versions.contains(&json!("2025-06-18")), "{discover}");
    server.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}}),
    );
    let list = server.recv();
    assert_eq!(
        list["result"]["tools"].as_array().map(Vec::len),
        Some(sandbox_mcp_server::tooldefs::registry().tools.len()),
        "{list}"
    );
    assert!(server.close_and_wait().success());
}

#[test]
fn oversized_line_gets_an_error_not_a_stall() {
    let mut server = Server::offline();
    server.initialize("2025-06-18");
    // 20 MB of arguments: over the 16 MiB line limit.
    let huge = "x".repeat(20 * 1024 * 1024);
    let request = json!({"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {
        "name": "sandbox_files_write", "arguments": {"sandbox_id": "sbx_0000000000000000000000000a", "path": "f", "content": huge}}});
    let started = Instant::now();
    server.send(request);
    let response = server.recv();
    assert_eq!(response["id"], 42);
    let message = response["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("request too large") && message.contains("16 MiB"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    // Oversized garbage, with no id to read, is answered too: with `"id": null`.
    let mut garbage = vec![b'x'; 17 * 1024 * 1024];
    garbage.push(b'\n');
    server.send_raw(&garbage);
    let response = server.recv();
    assert!(
        response.as_object().unwrap().contains_key("id") && response["id"].is_null(),
        "{response}"
    );
    assert_eq!(response["error"]["code"], -32600, "{response}");
    // Still serving.
    server.send(json!({"jsonrpc": "2.0", "id": 43, "method": "tools/list"}));
    assert_eq!(server.recv()["id"], 43);
    assert!(server.close_and_wait().success());
}

#[test]
fn garbage_and_malformed_requests_do_not_break_the_session() {
    let mut server = Server::offline();
    server.initialize("2025-06-18");
    server.send_raw(b"this is not json\n\n   \n");
    // The garbage line gets a parse error (blank lines are not messages and get nothing).
    let response = server.recv();
    assert_eq!(response["error"]["code"], -32700, "{response}");
    assert!(response["id"].is_null(), "{response}");
    server.send(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": 12}}));
    let response = server.recv();
    assert_eq!(response["id"], 7);
    assert!(response["error"].is_object(), "{response}");
    server.send(json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "sandbox_list", "arguments": {"status": "sleeping"}}}));
    let response = server.recv();
    assert_eq!(response["result"]["isError"], true, "{response}");
    server.send(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}));
    assert_eq!(server.recv()["id"], 9);
    assert!(server.close_and_wait().success());
}

#[test]
fn stdin_eof_exits_cleanly_and_logs_only_to_stderr() {
    let mut server = Server::offline();
    server.initialize("2025-11-25");
    let status = server.close_and_wait();
    assert!(status.success(), "{status:?}");
    // Anything left on stdout after EOF must still be JSON-RPC (nothing, in fact).
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut server.stdout, &mut rest);
    assert!(rest.trim().is_empty(), "stray stdout: {rest:?}");
}

#[test]
fn help_documents_every_setting() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "SANDBOX_MCP_URL",
        "SANDBOX_MCP_API_KEY",
        "SANDBOX_MCP_DATA_DIR",
        "SANDBOX_MCP_TIMEOUT",
        "SANDBOX_MCP_TOOLS",
        "engine",
        "tools",
    ] {
        assert!(
            help.contains(needle),
            "--help does not mention {needle}:\n{help}"
        );
    }
    let out = Command::new(BIN).arg("tools").output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("sandbox_exec") && table.contains("health"),
        "{table}"
    );
}

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
        // A second MCP server on the same data dir shares the first one's engine.
        let mut second = Server::spawn(&envs);
        second.initialize("2025-06-18");
        second.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "sandbox_exec", "arguments": {"sandbox_id": id, "command": "echo shared"}}}));
        let r = second.recv();
        assert_eq!(r["result"]["structuredContent"]["stdout"], "shared\n", "{r}");
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

/// `--session-sandbox` on stdio: the one session's sandbox is made on first use and killed
/// when stdin closes, or on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_sandbox_dies_with_stdin_eof_and_with_sigterm() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let url = engine.url.clone();
    let manager = engine.manager.clone();
    tokio::task::spawn_blocking(move || {
        let count = || manager.list(None, &[], None).len();
        let wait_for_none = |what: &str| {
            let deadline = Instant::now() + Duration::from_secs(15);
            while count() > 0 {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let envs = [
            ("SANDBOX_MCP_URL", url.as_str()),
            ("SANDBOX_MCP_API_KEY", KEY),
            ("SANDBOX_MCP_SESSION_SANDBOX", "true"),
        ];
        for ending in ["eof", "sigterm"] {
            let mut server = Server::spawn(&envs);
            server.initialize("2025-06-18");
            assert_eq!(count(), 0, "the sandbox is made on first use");
            server.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_exec", "arguments": {"command": "echo mine > f; cat f"}}}));
            let r = server.recv();
            assert_eq!(r["result"]["structuredContent"]["stdout"], "mine\n", "{r}");
            server.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "sandbox_files_read", "arguments": {"path": "f"}}}));
            let r = server.recv();
            assert_eq!(r["result"]["structuredContent"]["content"], "mine\n", "{r}");
            assert_eq!(count(), 1);
            if ending == "eof" {
                assert!(server.close_and_wait().success());
            } else {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
                assert!(server.close_and_wait().success());
            }
            wait_for_none(&format!("the session's sandbox should be killed on {ending}"));
        }
    })
    .await
    .unwrap();
}

/// RUST_LOG takes a level or `target=level,…`; anything else is named on stderr and the default
/// applies, and `target=level` does filter by target.
#[test]
fn rust_log_is_applied_or_refused_by_name() {
    let run = |filter: &str| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = Command::new(BIN)
            .env("SANDBOX_MCP_URL", format!("http://127.0.0.1:{port}"))
            .env("RUST_LOG", filter)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        // (stdin is empty: the server exits before any initialize, which is not the point here)
        assert!(
            out.stdout.is_empty(),
            "{filter}: stdout carries only JSON-RPC"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let bad = run("sandbox_mcp=loud");
    assert!(
        bad.contains("RUST_LOG=\"sandbox_mcp=loud\" ignored") && bad.contains("target=level"),
        "{bad}"
    );
    // The server logs where its control plane is at debug: shown for its own target only.
    let ours = run("sandbox_mcp=debug");
    assert!(ours.contains("DEBUG sandbox_mcp"), "{ours}");
    let others = run("rmcp=debug");
    assert!(!others.contains("DEBUG sandbox_mcp"), "{others}");
}

#[test]
fn a_malformed_url_fails_at_startup_with_an_example() {
    for url in [
        "localhost:7070",
        "ftp://example.com",
        "http://",
        "not a url",
    ] {
        let out = Command::new(BIN)
            .env("SANDBOX_MCP_URL", url)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{url}: started anyway");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("invalid SANDBOX_MCP_URL") && err.contains("http://10.0.0.5:7070"),
            "{url}: {err}"
        );
        assert!(out.stdout.is_empty(), "{url}: stdout carries only JSON-RPC");
    }
}

/// JSON-RPC 2.0 wants exactly one answer per request line: a parse error for a line that is not
/// JSON, Invalid Request for one that is not a request; none for a notification. Each answer
/// carries the request's id whenever a valid one can be read (even from a line broken after it:
/// a lone surrogate escape, invalid UTF-8), else `"id": null`. Clients wait forever otherwise:
/// they match answers to their requests by id.
#[test]
fn every_malformed_line_gets_one_answer_for_its_id() {
    let mut server = Server::offline();
    server.initialize("2025-06-18");
    let cases: [(&[u8], i64, Value); 20] = [
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#, -32700, json!(1)),
        (b"garbage", -32700, Value::Null),
        (br#""\udcff""#, -32700, Value::Null),
        (
            br#"{"jsonrpc":"2.0","id":2,"method":"ping","x":"\udcff"}"#,
            -32700,
            json!(2),
        ),
        (
            br#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"sandbox_files_read","arguments":{"sandbox_id":"sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa","path":"/root/\udcff"}}}"#,
            -32700,
            json!("c"),
        ),
        (
            br#"{"jsonrpc":"2.0","id":"d","method":"tools/call","params":{"name":"sandbox_list","arguments":{"\ud800x":1}}}"#,
            -32700,
            json!("d"),
        ),
        (b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"ping\",\"x\":\"\xff\"}", -32700, json!(11)),
        (b"\xff\xfe{}", -32700, Value::Null),
        (b"1", -32600, Value::Null),
        (br#""a string""#, -32600, Value::Null),
        (b"[]", -32600, Value::Null),
        (b"{}", -32600, Value::Null),
        (br#"{"id":3,"method":"ping"}"#, -32600, json!(3)),
        (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":6.5,"method":"ping"}"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":8,"method":5}"#, -32600, json!(8)),
        (br#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":5}"#, -32600, json!(5)),
        (
            br#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":5}}"#,
            -32602,
            json!(12),
        ),
    ];
    for (line, code, id) in cases {
        let mut bytes = line.to_vec();
        bytes.push(b'\n');
        server.send_raw(&bytes);
        let answer = server.recv();
        let shown = String::from_utf8_lossy(line);
        assert_eq!(answer["error"]["code"], code, "{shown}: {answer}");
        let object = answer.as_object().unwrap();
        assert!(object.contains_key("id"), "{shown}: {answer}");
        assert_eq!(answer["id"], id, "{shown}: {answer}");
        assert_eq!(object.len(), 3, "jsonrpc, id and error only: {answer}");
    }
    // Invalid params of a valid request keep its id; a notification, even unknown, gets nothing:
    // the next answer is the ping's.
    server.send(json!({"jsonrpc": "2.0", "id": 9, "method": "ping", "params": 5}));
    let answer = server.recv();
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (json!(9), json!(-32602))
    );
    // Without an id, unstructured params make an invalid Request object, not a notification.
    server.send(json!({"jsonrpc": "2.0", "method": "ping", "params": 5}));
    let answer = server.recv();
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (Value::Null, json!(-32600)),
        "{answer}"
    );
    assert!(answer.as_object().unwrap().contains_key("id"));
    server.send(json!({"jsonrpc": "2.0", "method": "no/such/notification"}));
    server.send(json!({"jsonrpc": "2.0", "id": 10, "method": "ping"}));
    assert_eq!(server.recv()["id"], 10);
    assert!(server.close_and_wait().success());
}

/// When the server exits, the sandbox store is unmounted: the data dir can be deleted at once,
/// and the loop device goes as soon as nothing uses the filesystem (paused sandboxes may keep it
/// until they die).
#[test]
fn the_data_dir_can_be_deleted_after_the_server_exits() {
    crate::require_cgroups!();
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let data = dir.path().join("data");
    let image = data.join("sandboxes.img");
    let mut server = Server::spawn(&[("SANDBOX_MCP_DATA_DIR", data.to_str().unwrap())]);
    server.initialize("2025-06-18");
    let mut call = |id: u64, tool: &str, args: Value| {
        server.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}));
        let r = server.recv();
        assert_ne!(r["result"]["isError"], true, "{tool}: {r}");
        r["result"]["structuredContent"].clone()
    };
    let killed = call(2, "sandbox_create", json!({}))["id"].clone();
    call(
        3,
        "sandbox_exec",
        json!({"sandbox_id": killed, "command": "echo hi > /root/f"}),
    );
    call(4, "sandbox_kill", json!({"sandbox_id": killed}));
    let kept = call(5, "sandbox_create", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let enforced =
        call(6, "sandbox_metrics", json!({"sandbox_id": kept}))["disk_limit_enforced"] == true;
    assert!(server.close_and_wait().success());

    assert!(
        !mounted(&data.join("sandboxes")),
        "the store is still mounted"
    );
    if enforced {
        assert!(
            !loop_devices_of(&image).is_empty(),
            "the paused sandbox keeps its filesystem"
        );
    }
    std::fs::remove_dir_all(&data).expect("the data dir cannot be deleted");
    // The paused sandbox dies (as at the next reboot): the loop device goes with it.
    let cg = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&kept);
    cg.kill_all().unwrap();
    let _ = cg.remove();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !loop_devices_of(&image).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a loop device outlived its use: {:?}",
            loop_devices_of(&image)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each subcommand takes only its own flags: a flag of another one is an error, never silently
/// ignored; environment variables (which MCP client configs set for everything) never conflict.
#[test]
fn subcommands_refuse_flags_that_are_not_theirs() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env_remove("SANDBOX_MCP_URL");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["engine", "--http", "127.0.0.1:1"][..],
        &["engine", "--rate-limit", "5"],
        &["keys", "--tools", "core", "list"],
        &["tools", "--max-sandboxes", "3"],
        &["--tools", "core", "engine"],
    ] {
        let (ok, stderr) = run(args, &[]);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            stderr.contains("unexpected argument") || stderr.contains("cannot be used with"),
            "{args:?}: {stderr}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr) = run(
        &["keys", "list"],
        &[
            ("SANDBOX_MCP_HTTP", "127.0.0.1:9"),
            ("SANDBOX_MCP_TOOLS", "core"),
            ("SANDBOX_MCP_DATA_DIR", dir.path().to_str().unwrap()),
        ],
    );
    assert!(ok, "{stderr}");
}
