//! Hosted MCP servers: what the sandbox costs a real third-party server, beside the same server run
//! directly on the host.
//!
//! - a `tools/call` of `mcp-server-time` through `sandbox-mcp run` (stdio, relayed through the
//!   engine's attach WebSocket and the sandbox's agent) against the same server started directly,
//!   calls interleaved one for one; the target is the difference of medians, ≤ 0.5 ms;
//! - session start → first result of a node server (`@modelcontextprotocol/server-memory`):
//!   started directly, as a cold `/servers/NAME/mcp` session, and from a warm pool;
//! - memory per idle hosted session (each session's sandbox, charged to its cgroup).
//!
//! The servers are installed on the host under /usr beforehand (as the tests do); without them the
//! section says so and measures nothing.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::figures::{Figure, figure, median_p95, ms};
use crate::memory::cgroup_memory;
use crate::servers::{Engine, KEY, Mcp, bin};

fn program(name: &str) -> Option<String> {
    ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| std::path::Path::new(p).exists())
}

/// `serve --http --dev` in front of `engine`, as its own process.
struct HttpMcp {
    child: Child,
    base: String,
}

impl HttpMcp {
    fn start(engine: &Engine) -> HttpMcp {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin())
            .args(["serve", "--http", &format!("127.0.0.1:{port}"), "--dev"])
            .args(["--url", &engine.url, "--api-key", KEY, "--rate-limit", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "serve --http did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        HttpMcp { child, base }
    }

    fn post(&self, name: &str, session: Option<&str>, body: &Value) -> (Option<String>, Value) {
        let mut r = Engine::http()
            .post(format!("{}/servers/{name}/mcp", self.base))
            .header("accept", "application/json, text/event-stream")
            .json(body);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        let (body, session) = crate::http::reply(r.send().unwrap());
        (session, body)
    }

    /// A session's start to its first tool result; the session id.
    fn session(&self, name: &str, tool: &str) -> (Duration, String) {
        let started = Instant::now();
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
        let (session, answer) = self.post(name, None, &init);
        let session = session.unwrap_or_else(|| panic!("{name}: no session: {answer}"));
        self.post(
            name,
            Some(&session),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": {}}});
        let (_, r) = self.post(name, Some(&session), &call);
        assert!(r.get("result").is_some(), "{name}: {r}");
        (started.elapsed(), session)
    }

    fn end(&self, name: &str, session: &str) {
        let _ = Engine::http()
            .delete(format!("{}/servers/{name}/mcp", self.base))
            .header("mcp-session-id", session)
            .send();
    }
}

impl Drop for HttpMcp {
    fn drop(&mut self) {
        // SIGTERM: it ends its sessions (and their sandboxes) before exiting.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stdio MCP server started by `cmd`, initialized.
fn stdio(cmd: Command) -> Mcp {
    let mut mcp = Mcp::from_command(cmd, "http://unused.invalid");
    mcp.initialize();
    mcp
}

pub(crate) fn hosted_figures(engine: &Engine, out: &mut Vec<Figure>) -> String {
    let (Some(time), Some(memory)) = (program("mcp-server-time"), program("mcp-server-memory"))
    else {
        return "\nHosted MCP servers: not measured (mcp-server-time and @modelcontextprotocol/server-memory are not installed under /usr).\n".into();
    };
    // 1. A tools/call through `run`, beside the same server started directly.
    let mut direct = stdio(Command::new(&time));
    let mut run = Command::new(bin());
    run.args(["run", "--url", &engine.url, "--api-key", KEY, "--", &time]);
    let mut proxied = stdio(run);
    let args = json!({"timezone": "UTC"});
    for _ in 0..20 {
        direct.call("get_current_time", args.clone());
        proxied.call("get_current_time", args.clone());
    }
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        let t = Instant::now();
        direct.call("get_current_time", args.clone());
        d.push(ms(t.elapsed()));
        let t = Instant::now();
        proxied.call("get_current_time", args.clone());
        p.push(ms(t.elapsed()));
    }
    drop(proxied);
    drop(direct);
    let (dm, _) = median_p95(&d);
    let (pm, _) = median_p95(&p);
    out.push(figure(
        "Hosted: tools/call of mcp-server-time, server started directly",
        "ms",
        d,
        None,
        "stdio JSON-RPC to `mcp-server-time` on the host; interleaved with the row below",
    ));
    out.push(figure(
        "Hosted: the same call through `sandbox-mcp run`",
        "ms",
        p,
        None,
        "stdio to `run`, which relays through the engine's attach WebSocket and the sandbox's agent",
    ));
    out.push(Figure {
        name: "Hosted: proxy overhead per tools/call (median difference)".into(),
        unit: "ms",
        median: pm - dm,
        p95: f64::NAN,
        target: Some((0.5, "≤ 0.5 ms")),
        note: "the two rows above, same run".into(),
    });

    // 2. Session start → first result, node server: direct, cold, warm.
    let mut direct_start = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut m = stdio(Command::new(&memory));
        m.call("read_graph", json!({}));
        direct_start.push(ms(t.elapsed()));
    }
    out.push(figure(
        "Hosted: server-memory (node) started directly → first result",
        "ms",
        direct_start,
        None,
        "process start, initialize, tools/call read_graph, on the host",
    ));
    let http = HttpMcp::start(engine);
    engine.send(
        "PUT",
        "/v1/servers/memory",
        Some(json!({"command": [memory], "idle_timeout_seconds": 600})),
    );
    let mut cold = Vec::new();
    for _ in 0..5 {
        let (t, session) = http.session("memory", "read_graph");
        cold.push(ms(t));
        http.end("memory", &session);
    }
    out.push(figure(
        "Hosted: /servers/NAME/mcp session start → first result, cold",
        "ms",
        cold,
        None,
        "server-memory: initialize (a new sandbox, the server started in it and initialized), then read_graph; Streamable HTTP, `serve --http --dev`",
    ));
    engine.send(
        "PUT",
        "/v1/servers/memory-warm",
        Some(json!({"command": [memory], "warm": 2, "idle_timeout_seconds": 600})),
    );
    // The pool fills for the operator's servers at start: restart the HTTP server to pick it up.
    drop(http);
    let http = HttpMcp::start(engine);
    let mut warm = Vec::new();
    for _ in 0..8 {
        // Let the pool refill between sessions: what a steady trickle of sessions sees.
        std::thread::sleep(Duration::from_millis(2500));
        let (t, session) = http.session("memory-warm", "read_graph");
        warm.push(ms(t));
        http.end("memory-warm", &session);
    }
    out.push(figure(
        "Hosted: /servers/NAME/mcp session start → first result, from `--warm`",
        "ms",
        warm,
        None,
        "server-memory, `warm: 2`: the session takes an initialized instance; 2.5 s between sessions for the pool to refill",
    ));

    // 3. Memory per idle hosted session.
    let n = 10;
    let mut sessions = Vec::new();
    for _ in 0..n {
        sessions.push(http.session("memory", "read_graph").1);
    }
    std::thread::sleep(Duration::from_secs(2));
    let ids: Vec<String> = engine
        .get("/v1/sandboxes?metadata=sandbox-mcp.server%3Dmemory")
        .unwrap()["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let charged: Vec<f64> = ids
        .iter()
        .filter_map(|id| cgroup_memory(id))
        .map(|b| b as f64 / 1024.0 / 1024.0)
        .collect();
    let note = format!(
        "{} sessions of server-memory (node) open and idle: each session's sandbox, charged to its memory cgroup (the server process, its node runtime, the agent)",
        ids.len()
    );
    if !charged.is_empty() {
        out.push(figure(
            "Hosted: memory per idle session",
            "MiB",
            charged,
            None,
            &note,
        ));
    }
    for s in &sessions {
        http.end("memory", s);
    }
    String::new()
}
