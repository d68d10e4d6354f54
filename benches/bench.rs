//! Every benchmark, in one run: `cargo bench` measures and rewrites docs/benchmarks.md.
//!
//! The engine runs as its own process (`sandbox-mcp engine`), as in production; the MCP server is
//! the real binary over stdio. Figures are medians and 95th percentiles of repeated runs on this
//! machine; targets come from the issues that set them. Timed assertions do not belong in tests on
//! shared machines, so the targets are checked here and reported, not enforced.
//!
//! A/B mode: `SANDBOX_MCP_BENCH_BASELINE=<another sandbox-mcp binary> cargo bench` measures that
//! build and this one in alternating rounds (`SANDBOX_MCP_BENCH_ROUNDS`, default 2) in the same
//! run, and writes docs/benchmarks-ab.md: per figure, each build's median over its rounds and the
//! ratio. That is how a change shows it costs nothing, on a machine whose speed drifts by the hour.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const THIS_BUILD: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

/// The binary being measured: this build, or in A/B mode whichever side's round it is.
static BIN: RwLock<&'static str> = RwLock::new(THIS_BUILD);

fn bin() -> &'static str {
    *BIN.read().unwrap()
}
const KEY: &str = "bench-key";

/// One measured figure.
struct Figure {
    name: String,
    unit: &'static str,
    median: f64,
    p95: f64,
    target: Option<(f64, &'static str)>,
    note: String,
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx]
}

fn figure(
    name: &str,
    unit: &'static str,
    mut samples: Vec<f64>,
    target: Option<(f64, &'static str)>,
    note: &str,
) -> Figure {
    let median = percentile(&mut samples, 0.5);
    let p95 = percentile(&mut samples, 0.95);
    eprintln!(
        "{name}: median {median:.3} {unit}, p95 {p95:.3} {unit} ({} runs)",
        samples.len()
    );
    Figure {
        name: name.into(),
        unit,
        median,
        p95,
        target,
        note: format!("{note} ({} runs)", samples.len()),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Engine {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Engine {
    fn start() -> Engine {
        let dir = tempfile::Builder::new()
            .prefix("smcpb")
            .tempdir_in("/tmp")
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin())
            .args(["engine", "--listen", &format!("127.0.0.1:{port}")])
            .env("SANDBOX_MCP_DATA_DIR", dir.path().join("data"))
            .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
            .env("SANDBOX_MCP_MAX_SANDBOXES", "1000")
            .env("SANDBOX_MCP_IDLE_PAUSE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let engine = Engine {
            child,
            url,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while engine.get("/v1/health").is_err() {
            assert!(Instant::now() < deadline, "engine did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        engine
    }

    fn http() -> &'static reqwest::blocking::Client {
        static CLIENT: std::sync::OnceLock<reqwest::blocking::Client> = std::sync::OnceLock::new();
        CLIENT.get_or_init(|| {
            {
                sandbox_mcp::client::install_tls();
                reqwest::blocking::Client::builder()
            }
            .no_proxy()
            .timeout(Duration::from_secs(600))
            .build()
            .unwrap()
        })
    }

    fn get(&self, path: &str) -> Result<Value, String> {
        let r = Self::http()
            .get(format!("{}{path}", self.url))
            .bearer_auth(KEY)
            .send()
            .map_err(|e| e.to_string())?;
        r.json().map_err(|e| e.to_string())
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let mut req = Self::http()
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().unwrap();
        let status = resp.status();
        let v: Value = resp.json().unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v
    }

    fn create(&self) -> String {
        self.send("POST", "/v1/sandboxes", Some(json!({})))["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn exec(&self, id: &str, command: &str) -> Value {
        self.send(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": command, "timeout_ms": 600000})),
        )
    }

    fn kill(&self, id: &str) {
        self.send("DELETE", &format!("/v1/sandboxes/{id}"), None);
    }

    fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Ok(v) = self.get("/v1/sandboxes") {
            for s in v["sandboxes"].as_array().into_iter().flatten() {
                let _ = Self::http()
                    .delete(format!(
                        "{}/v1/sandboxes/{}",
                        self.url,
                        s["id"].as_str().unwrap_or("")
                    ))
                    .bearer_auth(KEY)
                    .send();
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        sandbox_mcp::engine::linux::disk::release(&self._dir.path().join("data/sandboxes"));
    }
}

/// The MCP server binary over stdio.
struct Mcp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Mcp {
    /// Our server, in front of the engine at `url`.
    fn spawn(url: &str) -> Mcp {
        Self::from_command(Command::new(bin()), url)
    }

    /// The peer: FastMCP serving the same spec against the same engine.
    fn fastmcp(url: &str) -> Mcp {
        let mut cmd = Command::new("python3");
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fastmcp_server.py"));
        Self::from_command(cmd, url)
    }

    fn from_command(mut cmd: Command, url: &str) -> Mcp {
        let mut child = cmd
            .env("SANDBOX_MCP_URL", url)
            .env("SANDBOX_MCP_API_KEY", KEY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Mcp {
            child,
            stdin,
            stdout,
            next_id: 1,
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).unwrap();
        self.stdin.flush().unwrap();
        // Skip notifications (log messages, list changes) until the answer to this request.
        loop {
            let mut buf = String::new();
            let n = self.stdout.read_line(&mut buf).unwrap();
            assert!(
                n > 0,
                "the MCP server closed stdout while answering {method}"
            );
            let v: Value = serde_json::from_str(&buf).unwrap();
            if v["id"] == self.next_id {
                return v;
            }
        }
    }

    /// Resident memory of the server process (for Python, the interpreter and everything loaded).
    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        kib / 1024.0
    }

    fn initialize(&mut self) -> Value {
        let r = self.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}),
        );
        self.stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
            .unwrap();
        self.stdin.flush().unwrap();
        r
    }

    fn call(&mut self, name: &str, args: Value) -> Value {
        let r = self.request("tools/call", json!({"name": name, "arguments": args}));
        assert_ne!(r["result"]["isError"], true, "{name}: {r}");
        r
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let start = Instant::now();
    let v = f();
    (start.elapsed(), v)
}

/// Whether the peer (FastMCP) can run here; installs it from PyPI when it is missing.
fn fastmcp_version() -> Result<String, String> {
    let version = || {
        Command::new("python3")
            .args(["-c", "import fastmcp, httpx; print(fastmcp.__version__)"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(v) = version() {
        return Ok(v);
    }
    eprintln!("installing fastmcp from PyPI for the side-by-side figures");
    let _ = Command::new("python3")
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg("fastmcp>=2.12,<4")
        .status();
    version().ok_or_else(|| {
        "python3 with the `fastmcp` package is not available (`pip install fastmcp`)".into()
    })
}

/// One server's figures, for the side-by-side table.
#[derive(Default)]
struct Side {
    start: (f64, f64),
    list: (f64, f64),
    call: (f64, f64),
    /// Median of the raw HTTP calls interleaved with this server's.
    raw: f64,
    overhead: f64,
    rss_mib: f64,
    list_bytes: usize,
    tools: usize,
}

fn median_p95(samples: &[f64]) -> (f64, f64) {
    let mut s = samples.to_vec();
    (percentile(&mut s, 0.5), percentile(&mut s, 0.95))
}

fn start_samples(runs: usize, spawn: impl Fn() -> Mcp) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let (d, r) = time(|| {
                let mut mcp = spawn();
                mcp.initialize()
            });
            assert!(r["result"]["serverInfo"].is_object(), "{r}");
            ms(d)
        })
        .collect()
}

fn list_samples(mcp: &mut Mcp, runs: usize, side: &mut Side) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let (d, r) = time(|| mcp.request("tools/list", json!({})));
            side.tools = r["result"]["tools"].as_array().unwrap().len();
            side.list_bytes = serde_json::to_vec(&r["result"]).unwrap().len();
            ms(d)
        })
        .collect()
}

/// `runs` calls through `call`, interleaved with as many raw HTTP calls of the same operation.
fn call_samples(
    engine: &Engine,
    id: &str,
    runs: usize,
    mut call: impl FnMut(&str),
) -> (Vec<f64>, Vec<f64>) {
    let (mut via, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        via.push(ms(time(|| call(id)).0));
        raw.push(ms(time(|| {
            engine.get(&format!("/v1/sandboxes/{id}")).unwrap()
        })
        .0));
    }
    (via, raw)
}

/// The MCP layer: ours, and (in the same run, against the same engine) FastMCP serving the same
/// spec. Returns the side-by-side section of the report.
fn mcp_figures(engine: &Engine, out: &mut Vec<Figure>, with_peer: bool) -> String {
    let peer = if with_peer {
        fastmcp_version()
    } else {
        Err("not measured in A/B mode".into())
    };
    let mut ours = Side::default();
    let mut theirs = Side::default();

    // Floor for the start figure: running the same binary to print its version, which loads it
    // and exits before any runtime, registry or MCP work.
    let samples: Vec<f64> = (0..40)
        .map(|_| {
            let (d, s) = time(|| {
                Command::new(bin())
                    .arg("--version")
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
            });
            assert!(s.success());
            ms(d)
        })
        .collect();
    out.push(figure(
        "Floor: exec of `sandbox-mcp --version`",
        "ms",
        samples,
        None,
        "loading the binary alone; the figure below includes it",
    ));

    // Process start → initialize response.
    let samples = start_samples(40, || Mcp::spawn(&engine.url));
    ours.start = median_p95(&samples);
    out.push(figure(
        "MCP: process start → initialize response",
        "ms",
        samples,
        Some((5.0, "≤ 5 ms")),
        "stdio, release binary, remote engine",
    ));
    let mut mcp = Mcp::spawn(&engine.url);
    mcp.initialize();
    let samples = list_samples(&mut mcp, 300, &mut ours);
    assert_eq!(ours.tools, 22);
    ours.list = median_p95(&samples);
    out.push(figure(
        "MCP: tools/list round trip",
        "ms",
        samples,
        Some((1.0, "≤ 1 ms")),
        "all tools (22), the full tools/list JSON over stdio",
    ));

    // Per-call overhead: tools/call of "get one sandbox" minus the raw HTTP call it makes,
    // interleaved so that both series see the same machine noise.
    let id = engine.create();
    let (via_mcp, raw) = call_samples(engine, &id, 400, |id| {
        mcp.call("sandbox_info", json!({"sandbox_id": id}));
    });
    ours.raw = median_p95(&raw).0;
    ours.call = median_p95(&via_mcp);
    ours.overhead = ours.call.0 - ours.raw;
    ours.rss_mib = mcp.rss_mib();
    out.push(figure(
        "MCP: tools/call sandbox_info (stdio, end to end)",
        "ms",
        via_mcp,
        None,
        "includes the HTTP call below",
    ));
    out.push(figure(
        "HTTP: GET /v1/sandboxes/{id} (raw reqwest)",
        "ms",
        raw,
        None,
        "the same engine call without MCP",
    ));
    out.push(Figure {
        name: "MCP layer overhead per call (median difference)".into(),
        unit: "ms",
        median: ours.overhead,
        p95: f64::NAN,
        target: Some((0.2, "≤ 0.2 ms")),
        note: "tools/call minus raw HTTP, medians of the two series above".into(),
    });
    out.push(Figure {
        name: "MCP server resident memory after the calls above".into(),
        unit: "MiB",
        median: ours.rss_mib,
        p95: f64::NAN,
        target: None,
        note: "VmRSS of the stdio server process (the engine is separate)".into(),
    });
    drop(mcp);

    // The peer, measured the same way once ours has exited, so neither steals the other's CPU.
    if peer.is_ok() {
        theirs.start = median_p95(&start_samples(10, || Mcp::fastmcp(&engine.url)));
        let mut fast = Mcp::fastmcp(&engine.url);
        fast.initialize();
        theirs.list = median_p95(&list_samples(&mut fast, 100, &mut theirs));
        let (via_peer, raw) = call_samples(engine, &id, 200, |id| {
            let r = fast.call("get_sandbox", json!({"sandbox_id": id}));
            assert!(r.to_string().contains(id), "{r}");
        });
        theirs.raw = median_p95(&raw).0;
        theirs.call = median_p95(&via_peer);
        theirs.overhead = theirs.call.0 - theirs.raw;
        theirs.rss_mib = fast.rss_mib();
    }
    engine.kill(&id);
    side_by_side(&peer, &ours, &theirs)
}

fn side_by_side(peer: &Result<String, String>, ours: &Side, theirs: &Side) -> String {
    let mut md = String::from("\n## Side by side: FastMCP serving the same spec\n\n");
    let version = match peer {
        Ok(v) => v,
        Err(why) => {
            md.push_str(&format!("Not measured in this run: {why}.\n"));
            eprintln!("side by side SKIPPED: {why}");
            return md;
        }
    };
    md.push_str(&format!(
        "The same `openapi/sandbox-mcp.json`, served as MCP tools by FastMCP {version}'s \
         `FastMCP.from_openapi` ([benches/fastmcp_server.py](../benches/fastmcp_server.py)), over \
         stdio, against the same engine, in the same run as the table above. Calls: our \
         `sandbox_info` and FastMCP's `get_sandbox`, both one `GET /v1/sandboxes/{{id}}`, \
         each interleaved with the raw HTTP call (measured one server after the other, so that neither \
         takes the other's CPU). Medians, p95 in brackets.\n\n"
    ));
    md.push_str(
        "| Figure | sandbox-mcp | FastMCP | FastMCP ÷ sandbox-mcp |\n|---|---:|---:|---:|\n",
    );
    type Row<'a> = (&'a str, (f64, f64), (f64, f64), &'a str);
    let rows: [Row; 3] = [
        (
            "Process start → initialize response",
            ours.start,
            theirs.start,
            "ms",
        ),
        ("tools/list round trip", ours.list, theirs.list, "ms"),
        ("tools/call, end to end", ours.call, theirs.call, "ms"),
    ];
    for (name, a, b, unit) in rows {
        md.push_str(&format!(
            "| {name} | {:.3} {unit} ({:.3}) | {:.3} {unit} ({:.3}) | {:.1}× |\n",
            a.0,
            a.1,
            b.0,
            b.1,
            b.0 / a.0
        ));
    }
    md.push_str(&format!(
        "| MCP layer overhead per call (tools/call − raw HTTP: {:.3} / {:.3} ms) | {:.3} ms | {:.3} ms | {:.1}× |\n",
        ours.raw,
        theirs.raw,
        ours.overhead,
        theirs.overhead,
        theirs.overhead / ours.overhead
    ));
    md.push_str(&format!(
        "| Server resident memory | {:.1} MiB | {:.1} MiB | {:.1}× |\n",
        ours.rss_mib,
        theirs.rss_mib,
        theirs.rss_mib / ours.rss_mib
    ));
    md.push_str(&format!(
        "| tools/list: tools, bytes | {}, {} B | {}, {} B | {:.1}× (bytes) |\n",
        ours.tools,
        ours.list_bytes,
        theirs.tools,
        theirs.list_bytes,
        theirs.list_bytes as f64 / ours.list_bytes as f64
    ));
    md.push_str(
        "\nWhat the numbers leave out: FastMCP turns every operation into a tool as the spec \
         states it; ours bind 22 tools through tool-defs, with annotations, output caps, \
         model-facing descriptions and error messages, validated before any HTTP call.\n",
    );
    md
}

/// `sandbox-mcp serve --http` on a free port in front of `engine`, with one tenant key.
struct HttpMcp {
    child: Child,
    url: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl HttpMcp {
    fn start(engine: &Engine) -> HttpMcp {
        let dir = tempfile::tempdir().unwrap();
        let keys = Command::new(bin())
            .args(["keys", "create", "--tenant", "bench"])
            .env("SANDBOX_MCP_DATA_DIR", dir.path())
            .output()
            .unwrap();
        let token = String::from_utf8(keys.stdout).unwrap().trim().to_string();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin())
            .args([
                "serve",
                "--http",
                &format!("127.0.0.1:{port}"),
                "--rate-limit",
                "0",
            ])
            .env("SANDBOX_MCP_DATA_DIR", dir.path())
            .env("SANDBOX_MCP_URL", &engine.url)
            .env("SANDBOX_MCP_API_KEY", KEY)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let http = HttpMcp {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            token,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "HTTP MCP server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        http
    }

    /// POSTs one JSON-RPC message; the response message (from JSON or the SSE stream) and the
    /// session id header.
    fn post(
        &self,
        client: &reqwest::blocking::Client,
        session: Option<&str>,
        msg: &Value,
    ) -> (Value, Option<String>) {
        let mut req = client
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .json(msg);
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-11-25");
        }
        let resp = req.send().unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let text = resp.text().unwrap();
        let body = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(std::iter::once(text.as_str()))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("result").is_some() || m.get("error").is_some())
            .unwrap_or(Value::Null);
        (body, sid)
    }

    fn open_session(&self, client: &reqwest::blocking::Client) -> String {
        let (_, sid) = self.post(
            client,
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}),
        );
        let sid = sid.unwrap();
        self.post(
            client,
            Some(&sid),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        sid
    }
}

impl Drop for HttpMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 50 concurrent sessions over Streamable HTTP, each calling a tool in a loop.
fn http_figures(engine: &Engine, out: &mut Vec<Figure>) {
    const SESSIONS: usize = 50;
    let server = HttpMcp::start(engine);
    // Sandboxes belong to the bench tenant; the engine's own key acts for it with the header.
    let ids: Vec<String> = (0..SESSIONS)
        .map(|_| {
            let r = Engine::http()
                .post(format!("{}/v1/sandboxes", engine.url))
                .bearer_auth(KEY)
                .header("x-sandbox-tenant", "bench")
                .json(&json!({}))
                .send()
                .unwrap();
            r.json::<Value>().unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for (tool, calls, label) in [
        ("sandbox_info", 100usize, "sandbox_info"),
        ("sandbox_exec", 20, "sandbox_exec `true`"),
    ] {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(SESSIONS + 1));
        let server = &server;
        let (samples, wall) = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        let client = {
                sandbox_mcp::client::install_tls();
                reqwest::blocking::Client::builder()
            }.no_proxy().build().unwrap();
                        let sid = server.open_session(&client);
                        barrier.wait();
                        let mut samples = Vec::with_capacity(calls);
                        for i in 0..calls {
                            let mut args = json!({"sandbox_id": id});
                            if tool == "sandbox_exec" {
                                args["command"] = json!("true");
                            }
                            let msg = json!({"jsonrpc": "2.0", "id": i + 2, "method": "tools/call", "params": {"name": tool, "arguments": args}});
                            let (d, (r, _)) = time(|| server.post(&client, Some(&sid), &msg));
                            assert_ne!(r["result"]["isError"], true, "{r}");
                            assert!(r["result"].is_object(), "{r}");
                            samples.push(ms(d));
                        }
                        let _ = client
                            .delete(&server.url)
                            .bearer_auth(&server.token)
                            .header("mcp-session-id", &sid)
                            .send();
                        samples
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            let samples: Vec<f64> = handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect();
            (samples, start.elapsed())
        });
        let throughput = samples.len() as f64 / wall.as_secs_f64();
        let p99 = percentile(&mut samples.clone(), 0.99);
        out.push(figure(
            &format!("HTTP MCP: tools/call {label}, {SESSIONS} concurrent sessions"),
            "ms",
            samples,
            None,
            &format!(
                "latency per call; p99 {p99:.3} ms; Streamable HTTP with bearer auth, SSE responses"
            ),
        ));
        out.push(Figure {
            name: format!("HTTP MCP: {label} throughput, {SESSIONS} concurrent sessions"),
            unit: "calls/s",
            median: throughput,
            p95: f64::NAN,
            target: None,
            note: format!(
                "{} calls in {:.2} s of wall time",
                SESSIONS * calls,
                wall.as_secs_f64()
            ),
        });
        eprintln!("HTTP MCP {label}: {throughput:.0} calls/s, p99 {p99:.3} ms");
    }
    for id in ids {
        engine.kill(&id);
    }
}

fn engine_figures(engine: &Engine, out: &mut Vec<Figure>) {
    // Floor: a bare fork+exec of `true` on the host.
    let mut samples = Vec::new();
    for _ in 0..200 {
        let (d, s) = time(|| Command::new("/bin/true").status().unwrap());
        assert!(s.success());
        samples.push(ms(d));
    }
    out.push(figure(
        "Floor: fork+exec of /bin/true on the host",
        "ms",
        samples,
        None,
        "std::process::Command",
    ));

    // create → first exec result.
    let mut samples = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..40 {
        let (d, id) = time(|| {
            let id = engine.create();
            let r = engine.exec(&id, "true");
            assert_eq!(r["exit_code"], 0);
            id
        });
        samples.push(ms(d));
        ids.push(id);
    }
    out.push(figure(
        "Engine: create → first exec result (`true`)",
        "ms",
        samples,
        Some((15.0, "≤ 15 ms")),
        "HTTP API, base template",
    ));
    for id in ids.drain(..) {
        engine.kill(&id);
    }

    let id = engine.create();
    let mut samples = Vec::new();
    for _ in 0..300 {
        let (d, _) = time(|| engine.exec(&id, "true"));
        samples.push(ms(d));
    }
    out.push(figure(
        "Engine: exec round trip in a warm sandbox (`true`)",
        "ms",
        samples,
        Some((2.0, "≤ 2 ms")),
        "HTTP API",
    ));

    // run_code: warm round trip of `1+1` in the default Python context.
    let code = |c: &str| {
        engine.send(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(json!({"code": c})),
        )
    };
    assert_eq!(code("1+1")["result"], "2");
    let mut samples = Vec::new();
    for _ in 0..300 {
        let (d, r) = time(|| code("1+1"));
        assert_eq!(r["result"], "2");
        samples.push(ms(d));
    }
    out.push(figure(
        "Engine: run_code `1+1`, warm Python context",
        "ms",
        samples,
        Some((5.0, "≤ 5 ms")),
        "HTTP API",
    ));
    let node = |c: &str| {
        engine.send(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(json!({"code": c, "language": "node"})),
        )
    };
    assert_eq!(node("1+1")["result"], "2");
    let mut samples = Vec::new();
    for _ in 0..300 {
        let (d, _) = time(|| node("1+1"));
        samples.push(ms(d));
    }
    out.push(figure(
        "Engine: run_code `1+1`, warm Node.js context",
        "ms",
        samples,
        None,
        "HTTP API",
    ));

    let (mut pause, mut resume) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let (d, _) = time(|| engine.send("POST", &format!("/v1/sandboxes/{id}/pause"), None));
        pause.push(ms(d));
        let (d, _) = time(|| engine.send("POST", &format!("/v1/sandboxes/{id}/resume"), None));
        resume.push(ms(d));
    }
    out.push(figure(
        "Engine: pause (freeze) round trip",
        "ms",
        pause,
        Some((1.0, "≤ 1 ms")),
        "HTTP API, includes the state commit",
    ));
    out.push(figure(
        "Engine: resume (thaw) round trip",
        "ms",
        resume,
        Some((1.0, "≤ 1 ms")),
        "HTTP API, includes the state commit",
    ));

    // 1 GiB of stdout: drain rate and the engine's peak RSS.
    let before = engine.status_kib("VmHWM:");
    let mut rates = Vec::new();
    for _ in 0..3 {
        let (d, r) = time(|| engine.exec(&id, "yes | head -c 1073741824"));
        assert_eq!(r["stdout_bytes"], 1_073_741_824u64);
        rates.push(1024.0 / d.as_secs_f64());
    }
    let peak = engine.status_kib("VmHWM:");
    out.push(figure(
        "Engine: 1 GiB of stdout through exec, drain rate",
        "MiB/s",
        rates,
        None,
        "yes | head -c 1G, capped to 32 KiB",
    ));
    out.push(Figure {
        name: "Engine: peak RSS after draining 3 × 1 GiB".into(),
        unit: "MiB",
        median: peak as f64 / 1024.0,
        p95: f64::NAN,
        target: Some((50.0, "≤ 50 MiB")),
        note: format!("VmHWM of the engine process ({} MiB before)", before / 1024),
    });
    engine.kill(&id);
}

fn meminfo_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn cgroup_memory(id: &str) -> Option<u64> {
    for p in [
        format!("/sys/fs/cgroup/memory/sandbox-mcp/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/sandbox-mcp/{id}/memory.current"),
    ] {
        if let Ok(v) = std::fs::read_to_string(&p) {
            return v.trim().parse().ok();
        }
    }
    None
}

fn idle_memory(engine: &Engine, out: &mut Vec<Figure>) {
    let n = 200;
    // Warm the page cache and the template first, so the delta is per-sandbox cost.
    let warm = engine.create();
    engine.exec(&warm, "true");
    engine.kill(&warm);
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    let used_before = meminfo_kib("MemTotal:") - meminfo_kib("MemAvailable:");
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(engine.create());
    }
    std::thread::sleep(Duration::from_secs(2));
    let charged: Vec<f64> = ids
        .iter()
        .filter_map(|id| cgroup_memory(id))
        .map(|b| b as f64 / 1024.0 / 1024.0)
        .collect();
    let used_after = meminfo_kib("MemTotal:") - meminfo_kib("MemAvailable:");
    let per_sandbox_host = (used_after.saturating_sub(used_before)) as f64 / 1024.0 / n as f64;
    if !charged.is_empty() {
        out.push(figure(
            &format!("Memory per idle sandbox, {n} alive (charged to its cgroup)"),
            "MiB",
            charged,
            Some((1.0, "≤ 1 MiB")),
            "memory cgroup usage of each idle sandbox: agent plus kernel objects",
        ));
    }
    out.push(Figure {
        name: format!("Memory per idle sandbox, {n} alive (host-wide)"),
        unit: "MiB",
        median: per_sandbox_host,
        p95: f64::NAN,
        target: None,
        note: "(MemTotal − MemAvailable) delta / N, including page tables and the engine's bookkeeping".into(),
    });
    for id in ids {
        engine.kill(&id);
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = meminfo_kib("MemTotal:") / 1024 / 1024;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({cpu}), {mem} GiB, Linux {}", kernel.trim())
}

fn now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn render(figures: &[Figure], extra: &str) -> String {
    let date = now();
    let mut md = String::new();
    md.push_str("# Benchmarks\n\n");
    md.push_str("Generated by `cargo bench` (benches/bench.rs), which rewrites this file. Do not edit by hand.\n\n");
    md.push_str(&format!(
        "- Run: {date}\n- Machine: {}\n- Build: release profile of sandbox-mcp {}\n\n",
        machine(),
        env!("CARGO_PKG_VERSION")
    ));
    md.push_str("All figures come from one run on a shared machine; compare medians and ratios, not single samples.\n\n");
    md.push_str("| Figure | Median | p95 | Target | Notes |\n|---|---:|---:|---|---|\n");
    for f in figures {
        let fmt = |v: f64| {
            if v.is_nan() {
                "—".to_string()
            } else if v >= 100.0 {
                format!("{v:.0} {}", f.unit)
            } else {
                format!("{v:.3} {}", f.unit)
            }
        };
        let target = match f.target {
            Some((limit, label)) => {
                let met = if f.unit == "MiB/s" {
                    f.median >= limit
                } else {
                    f.median <= limit
                };
                format!("{label} {}", if met { "✅" } else { "❌" })
            }
            None => String::new(),
        };
        let cell = |s: &str| s.replace('|', "\\|");
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            cell(&f.name),
            fmt(f.median),
            fmt(f.p95),
            target,
            cell(&f.note)
        ));
    }
    md.push_str(extra);
    md
}

/// Every figure of the binary `bin()` names, with the side-by-side section when `with_peer`.
fn suite(with_peer: bool) -> (Vec<Figure>, String) {
    let mut figures = Vec::new();
    let engine = Engine::start();
    let side_by_side = mcp_figures(&engine, &mut figures, with_peer);
    http_figures(&engine, &mut figures);
    engine_figures(&engine, &mut figures);
    idle_memory(&engine, &mut figures);
    drop(engine);
    (figures, side_by_side)
}

/// A/B, paired: the hot per-call paths of both builds, interleaved in blocks of 50 calls so
/// that each block of one build has the other's beside it in time. Each build's MCP server talks
/// to its own engine, and the raw HTTP series goes to each engine directly.
fn ab_paired(baseline: &'static str) -> String {
    let builds = [baseline, THIS_BUILD];
    let engines: Vec<Engine> = builds
        .iter()
        .map(|b| {
            *BIN.write().unwrap() = b;
            Engine::start()
        })
        .collect();
    let mut servers: Vec<Mcp> = builds
        .iter()
        .zip(&engines)
        .map(|(b, e)| {
            *BIN.write().unwrap() = b;
            let mut m = Mcp::spawn(&e.url);
            m.initialize();
            m
        })
        .collect();
    *BIN.write().unwrap() = THIS_BUILD;
    let ids: Vec<String> = engines.iter().map(Engine::create).collect();
    let series = [
        "MCP: tools/list",
        "MCP: tools/call sandbox_info",
        "HTTP: GET /v1/sandboxes/{id}",
        "Engine: exec `true`",
    ];
    // samples[series][build]
    let mut samples = vec![[Vec::new(), Vec::new()]; series.len()];
    for _block in 0..20 {
        for side in 0..2 {
            let (mcp, engine, id) = (&mut servers[side], &engines[side], &ids[side]);
            for _ in 0..50 {
                samples[0][side].push(ms(time(|| mcp.request("tools/list", json!({}))).0));
                samples[1][side].push(ms(time(|| {
                    mcp.call("sandbox_info", json!({"sandbox_id": id}))
                })
                .0));
                samples[2][side].push(ms(time(|| {
                    engine.get(&format!("/v1/sandboxes/{id}")).unwrap()
                })
                .0));
            }
            for _ in 0..10 {
                samples[3][side].push(ms(time(|| engine.exec(id, "true")).0));
            }
        }
    }
    for (engine, id) in engines.iter().zip(&ids) {
        engine.kill(id);
    }
    let mut md = String::from(
        "\n## Paired: the per-call paths, interleaved\n\nBoth builds at once, each with its own \
         engine and stdio server, in alternating blocks (50 calls, 10 execs) for 20 rounds; the \
         medians of all samples. This is the comparison to trust for small differences.\n\n\
         | Path | A (baseline) | B (this build) | B / A | samples each |\n|---|---:|---:|---:|---:|\n",
    );
    for (name, [a, b]) in series.iter().zip(samples.iter_mut()) {
        let n = a.len();
        let (ma, mb) = (percentile(a, 0.5), percentile(b, 0.5));
        md.push_str(&format!(
            "| {name} | {ma:.3} ms | {mb:.3} ms | {:.2} | {n} |\n",
            mb / ma
        ));
    }
    md
}

/// A/B mode: `baseline` and this build in alternating rounds (ABBA…), then each figure's median
/// over its rounds, side by side.
fn ab(baseline: &str) -> String {
    let rounds: usize = std::env::var("SANDBOX_MCP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let baseline: &'static str = Box::leak(baseline.to_string().into_boxed_str());
    // Figure name → (unit, baseline medians, this build's medians), in first-seen order.
    let mut table: Vec<(String, &'static str, Vec<f64>, Vec<f64>)> = Vec::new();
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [(baseline, true), (THIS_BUILD, false)]
        } else {
            [(THIS_BUILD, false), (baseline, true)]
        };
        for (binary, is_baseline) in order {
            eprintln!("== round {} of {rounds}: {binary}", round + 1);
            *BIN.write().unwrap() = binary;
            for f in suite(false).0 {
                let row = match table.iter().position(|r| r.0 == f.name) {
                    Some(i) => &mut table[i],
                    None => {
                        table.push((f.name.clone(), f.unit, Vec::new(), Vec::new()));
                        table.last_mut().unwrap()
                    }
                };
                if is_baseline { &mut row.2 } else { &mut row.3 }.push(f.median);
            }
        }
    }
    *BIN.write().unwrap() = THIS_BUILD;
    let paired = ab_paired(baseline);
    // The middle value, or the mean of the two middle ones (two rounds: their mean).
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    let fmt = |v: f64, unit: &str| {
        if v.is_nan() {
            "—".to_string()
        } else if v.abs() >= 100.0 {
            format!("{v:.0} {unit}")
        } else {
            format!("{v:.3} {unit}")
        }
    };
    let spread = |v: &[f64], unit: &str| match (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => format!("{} – {}", fmt(lo, unit), fmt(hi, unit)),
        _ => "—".into(),
    };
    let mut md = String::from("# Benchmarks: A/B\n\n");
    md.push_str(
        "Generated by `SANDBOX_MCP_BENCH_BASELINE=<binary> cargo bench` (benches/bench.rs), which \
         rewrites this file. Do not edit by hand.\n\n",
    );
    md.push_str(&format!(
        "- Run: {}\n- Machine: {}\n- A: the baseline binary given; B: this build (sandbox-mcp {})\n\
         - {rounds} rounds of the whole suite each, alternating (A B, B A, …) so that both see \
         the same drift of this shared machine\n\n",
        now(),
        machine(),
        env!("CARGO_PKG_VERSION")
    ));
    md.push_str(
        "Each cell is the median over rounds of that round's median; the ranges are the rounds' \
         medians. B / A below 1 means B is faster (for MiB/s, above 1 does).\n\n",
    );
    md.push_str("| Figure | A (baseline) | B (this build) | B / A | A's rounds | B's rounds |\n");
    md.push_str("|---|---:|---:|---:|---|---|\n");
    for (name, unit, a, b) in &table {
        let (ma, mb) = (median(a), median(b));
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            name.replace('|', "\\|"),
            fmt(ma, unit),
            fmt(mb, unit),
            if ma.is_nan() || mb.is_nan() || ma == 0.0 {
                "—".to_string()
            } else {
                format!("{:.2}", mb / ma)
            },
            spread(a, unit),
            spread(b, unit),
        ));
    }
    md.push_str(&paired);
    md
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would pass nothing useful: skip then.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/bench.rs: run with `cargo bench`");
        return;
    }
    let (doc, file) = match std::env::var("SANDBOX_MCP_BENCH_BASELINE") {
        Ok(baseline) if !baseline.is_empty() => (ab(&baseline), "docs/benchmarks-ab.md"),
        _ => {
            let (figures, side_by_side) = suite(true);
            (render(&figures, &side_by_side), "docs/benchmarks.md")
        }
    };
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, doc).unwrap();
    eprintln!("wrote {}", path.display());
}
