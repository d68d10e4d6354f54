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
//!
//! `SANDBOX_MCP_BENCH_ONLY=network cargo bench` runs the network section alone (egress, previews,
//! secrets), `…=templates` the templates section, `…=forks` the snapshots and forks section,
//! `…=desktop` the computer-use section, `…=kubernetes` the kubernetes driver's section, and
//! prints its table and text instead of writing any file: for working on it. The kubernetes
//! section needs `SANDBOX_MCP_TEST_K8S_RIG` (as its tests do); without it, it says so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

// Fixtures shared with the tests.
use sandbox_mcp_testkit::{images, kubernetes, netlinks};

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
    // The slow tail: for a rate, the one 95% of runs reach.
    let p95 = percentile(
        &mut samples,
        if higher_is_better(unit) { 0.05 } else { 0.95 },
    );
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

/// Units whose figures are better when larger (rates, shares): their targets are minimums.
fn higher_is_better(unit: &str) -> bool {
    matches!(unit, "MiB/s" | "MB/s" | "GB/s" | "calls/s" | "%")
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
        Self::start_with(&[])
    }

    /// An engine with these extra environment variables (its settings: `SANDBOX_MCP_…`).
    fn start_with(env: &[(&str, &str)]) -> Engine {
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
            .envs(env.iter().copied())
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
                sandbox_mcp_api::install_tls();
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
        self.call(method, path, body).unwrap()
    }

    /// An engine call whose failure is a figure's reason not to be measured, not a panic.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut req = Self::http()
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status();
        let text = resp.text().map_err(|e| format!("{method} {path}: {e}"))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            return Err(format!("{method} {path}: {status} {v}"));
        }
        Ok(v)
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
        // A clean stop, which also kills the warm pools' sandboxes (no listing shows them):
        // killed outright, the engine would leave them running for its next start, and with
        // the data dir deleted no next start comes.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        sandbox_mcp_linux::disk::release(&self._dir.path().join("data/sandboxes"));
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
    // Every tool the binary has, not a toolset.
    if let Some(all) = tool_count() {
        assert_eq!(ours.tools, all, "tools/list lists every tool");
    }
    ours.list = median_p95(&samples);
    out.push(figure(
        "MCP: tools/list round trip",
        "ms",
        samples,
        Some((1.0, "≤ 1 ms")),
        &format!(
            "all tools ({}), the full tools/list JSON over stdio",
            ours.tools
        ),
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
    md.push_str(&format!(
        "\nWhat the numbers leave out: FastMCP turns every operation into a tool as the spec \
         states it; ours bind {} tools through tool-defs, with annotations, output caps, \
         model-facing descriptions and error messages, validated before any HTTP call.\n",
        ours.tools
    ));
    md
}

/// How many tools `sandbox-mcp tools --json` says the binary has (None: it cannot say).
fn tool_count() -> Option<usize> {
    let out = Command::new(bin())
        .args(["tools", "--json"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["tools"].as_array().map(Vec::len)
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
                sandbox_mcp_api::install_tls();
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
    let (label, how) = networking(engine, &ids[0]);
    out.push(figure(
        &format!("Engine: create → first exec result (`true`), {label}"),
        "ms",
        samples,
        Some((15.0, "≤ 15 ms")),
        &format!("HTTP API, base template; {how}"),
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
    let (label, how) = networking(engine, &ids[0]);
    if !charged.is_empty() {
        out.push(figure(
            &format!("Memory per idle sandbox, {n} alive, {label} (charged to its cgroup)"),
            "MiB",
            charged,
            Some((1.0, "≤ 1 MiB")),
            &format!("memory cgroup usage of each idle sandbox: agent plus kernel objects; {how}"),
        ));
    }
    out.push(Figure {
        name: format!("Memory per idle sandbox, {n} alive, {label} (host-wide)"),
        unit: "MiB",
        median: per_sandbox_host,
        p95: f64::NAN,
        target: None,
        note: format!(
            "(MemTotal − MemAvailable) delta / N, including page tables, the engine's bookkeeping \
             and its relay sockets; {how}"
        ),
    });
    for id in ids {
        engine.kill(&id);
    }
}

// ---------------------------------------------------------------------------------------------
// Computer use: a desktop's start, screenshots, input, and what an idle one costs.

/// The Tk app the desktop tests drive: a real window with text on the screen.
const DESKTOP_APP: &str = include_str!("../tests/fixtures/desktop/app.py");

fn desktop_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Computer use\n\n";
    if !Path::new("/usr/bin/Xvfb").exists() {
        return format!(
            "{heading}Not measured: this machine has no Xvfb (apt-get install xvfb).\n"
        );
    }
    let engine = Engine::start();
    match measure_desktop(&engine, out) {
        Ok(text) => format!("{heading}{text}\n"),
        Err(why) => {
            eprintln!("desktop figures FAILED: {why}");
            format!("{heading}Not (all) measured: {why}\n")
        }
    }
}

/// The kubernetes driver on the k8s-local cluster (`SANDBOX_MCP_TEST_K8S_RIG`), beside the
/// namespaces driver on this machine, in the same run.
fn kubernetes_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Kubernetes driver\n\n";
    let target = Path::new(THIS_BUILD).parent().unwrap().parent().unwrap();
    let rig = match kubernetes::Rig::start(Path::new(env!("CARGO_MANIFEST_DIR")), target, true) {
        Ok(rig) => rig,
        Err(why) => return format!("{heading}Not measured: {why}.\n"),
    };
    match measure_kubernetes(&rig, out) {
        Ok(text) => format!("{heading}{text}\n"),
        Err(why) => {
            eprintln!("kubernetes figures FAILED: {why}");
            format!("{heading}Not (all) measured: {why}\n")
        }
    }
}

fn measure_kubernetes(rig: &kubernetes::Rig, out: &mut Vec<Figure>) -> Result<String, String> {
    // Small pods: fifty of them share this one node.
    let shape = json!({"shape": {"vcpus": 0.1, "memory_mb": 64, "disk_mb": 64}});
    let create = |engine: &Engine| -> Result<String, String> {
        let made = engine.call("POST", "/v1/sandboxes", Some(shape.clone()))?;
        Ok(made["id"].as_str().unwrap_or_default().to_string())
    };
    let first_exec = |engine: &Engine, runs: usize| -> Result<Vec<f64>, String> {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (d, id) = time(|| -> Result<String, String> {
                let id = create(engine)?;
                let r = engine.call(
                    "POST",
                    &format!("/v1/sandboxes/{id}/exec"),
                    Some(json!({"command": "true"})),
                )?;
                if r["exit_code"] != 0 {
                    return Err(format!("`true` failed: {r}"));
                }
                Ok(id)
            });
            let id = id?;
            samples.push(ms(d));
            engine.call("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
        }
        Ok(samples)
    };
    let warm = |engine: &Engine, runs: usize| -> Result<Vec<f64>, String> {
        let id = create(engine)?;
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (d, r) = time(|| {
                engine.call(
                    "POST",
                    &format!("/v1/sandboxes/{id}/exec"),
                    Some(json!({"command": "true"})),
                )
            });
            r?;
            samples.push(ms(d));
        }
        engine.call("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
        Ok(samples)
    };

    let ns = kubernetes::Namespace::new(rig);
    let env = rig.engine_env(&ns.name);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&**k, &**v)).collect();
    let kube = Engine::start_with(&env);
    let local = Engine::start();

    let k = first_exec(&kube, 10)?;
    let n = first_exec(&local, 10)?;
    let ratio = |a: &[f64], b: &[f64]| median_p95(a).0 / median_p95(b).0;
    let first_ratio = ratio(&k, &n);
    out.push(figure(
        "Kubernetes: create → first exec result (`true`)",
        "ms",
        k,
        None,
        "HTTP API; a pod scheduled, its init container copying the agent, then the first exec through the API server",
    ));
    out.push(figure(
        "Kubernetes, beside it: the namespaces driver's create → first exec",
        "ms",
        n,
        None,
        "HTTP API, same run, same shape",
    ));
    let k = warm(&kube, 100)?;
    let n = warm(&local, 100)?;
    let warm_ratio = ratio(&k, &n);
    out.push(figure(
        "Kubernetes: exec round trip in a warm sandbox (`true`)",
        "ms",
        k,
        None,
        "HTTP API; one stream on the pod's multiplexed exec",
    ));
    out.push(figure(
        "Kubernetes, beside it: the namespaces driver's warm exec round trip",
        "ms",
        n,
        None,
        "HTTP API, same run",
    ));
    drop(local);

    // Fifty creates at once, each on its own connection.
    let (wall, results) = time(|| {
        std::thread::scope(|scope| {
            let tasks: Vec<_> = (0..50).map(|_| scope.spawn(|| create(&kube))).collect();
            tasks
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err("panicked".into())))
                .collect::<Vec<_>>()
        })
    });
    let errors: Vec<String> = results.iter().filter_map(|r| r.clone().err()).collect();
    let made = results.len() - errors.len();
    out.push(figure(
        "Kubernetes: 50 sandboxes created concurrently (wall time)",
        "s",
        vec![wall.as_secs_f64()],
        None,
        &format!("{made} created, {} errors", errors.len()),
    ));
    let listed = kube.get("/v1/sandboxes")?;
    let running = listed["sandboxes"].as_array().map_or(0, Vec::len);
    drop(kube);
    drop(ns);
    let mut text = format!(
        "The kubernetes driver against a single-node Kubernetes 1.20 on this machine (the \
         k8s-local rig: containerd and runc, pods reached through the API server's exec), \
         with the namespaces driver measured beside it in the same run. Pods ask for 0.1 vCPU \
         (overcommitted 50 times, as the tests do), 64 MiB and 64 MiB of disk. Create → first \
         exec is {first_ratio:.0}× the namespaces driver's, most of it the kubelet starting two \
         containers; a warm exec round trip is {warm_ratio:.1}× (one hop through the API \
         server and the pod's multiplexed exec). Fifty concurrent creates: {made} made, {} \
         errors, {running} listed running afterwards, in {:.1} s.",
        errors.len(),
        wall.as_secs_f64()
    );
    if let Some(first) = errors.first() {
        text.push_str(&format!(" First error: {first}."));
    }
    Ok(text)
}

fn png_bytes(shot: &Value) -> Result<usize, String> {
    use base64::Engine as _;
    let data = shot["png_base64"]
        .as_str()
        .ok_or_else(|| format!("no image in {shot}"))?;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map(|b| b.len())
        .map_err(|e| e.to_string())
}

fn measure_desktop(engine: &Engine, out: &mut Vec<Figure>) -> Result<String, String> {
    // create → first screenshot, each on a new desktop.
    let mut first = Vec::new();
    for _ in 0..10 {
        let begun = Instant::now();
        let made = engine.call("POST", "/v1/computers", Some(json!({})))?;
        let id = made["id"].as_str().unwrap().to_string();
        engine.call(
            "GET",
            &format!("/v1/sandboxes/{id}/desktop/screenshot"),
            None,
        )?;
        first.push(ms(begun.elapsed()));
        engine.kill(&id);
    }
    out.push(figure(
        "Desktop: computer_create → first screenshot (1280×800)",
        "ms",
        first,
        None,
        "HTTP API: a new sandbox, its display server and window manager started, then one PNG",
    ));

    // An idle desktop's memory: display server, window manager and agent, nothing else.
    let idle = engine.call("POST", "/v1/computers", Some(json!({})))?;
    let idle_id = idle["id"].as_str().unwrap().to_string();
    engine.call(
        "GET",
        &format!("/v1/sandboxes/{idle_id}/desktop/screenshot"),
        None,
    )?;
    std::thread::sleep(Duration::from_secs(2));
    if let Some(bytes) = cgroup_memory(&idle_id) {
        out.push(figure(
            "Desktop: memory of an idle desktop sandbox",
            "MiB",
            vec![bytes as f64 / 1024.0 / 1024.0],
            None,
            "its memory cgroup after one screenshot: Xvfb, matchbox and the agent (page cache included)",
        ));
    }
    engine.kill(&idle_id);

    // One desktop with the app on screen for the rest.
    let made = engine.call("POST", "/v1/computers", Some(json!({})))?;
    let id = made["id"].as_str().unwrap().to_string();
    engine.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/app.py", "content": DESKTOP_APP})),
    )?;
    let started = engine.exec(
        &id,
        "python3 /root/app.py /root/log.jsonl > /root/app.out 2>&1 &
         for i in $(seq 100); do grep -q ready /root/log.jsonl 2>/dev/null && break; sleep 0.1; done
         grep -c ready /root/log.jsonl",
    );
    if started["stdout"].as_str().unwrap_or("").trim() != "1" {
        return Err(format!("the app did not start: {started}"));
    }
    let shot_path = format!("/v1/sandboxes/{id}/desktop/screenshot");
    let mut round = Vec::new();
    let mut sizes = Vec::new();
    for _ in 0..50 {
        let begun = Instant::now();
        let shot = engine.call("GET", &shot_path, None)?;
        round.push(ms(begun.elapsed()));
        sizes.push(png_bytes(&shot)? as f64 / 1024.0);
    }
    out.push(figure(
        "Desktop: screenshot round trip, 1280×800 PNG",
        "ms",
        round,
        Some((50.0, "≤ 50 ms p50")),
        "HTTP API: grab, pointer drawn in, PNG encoded in the sandbox's agent, base64 in JSON",
    ));
    out.push(figure(
        "Desktop: PNG size per screenshot, 1280×800, the test app on screen",
        "KiB",
        sizes,
        None,
        "a white window with a button, an entry and a canvas",
    ));
    let mut half = Vec::new();
    let mut half_sizes = Vec::new();
    for _ in 0..20 {
        let begun = Instant::now();
        let shot = engine.call("GET", &format!("{shot_path}?scale=0.5"), None)?;
        half.push(ms(begun.elapsed()));
        half_sizes.push(png_bytes(&shot)? as f64 / 1024.0);
    }
    out.push(figure(
        "Desktop: screenshot round trip at scale 0.5 (640×400)",
        "ms",
        half,
        None,
        "box-filtered before encoding",
    ));
    out.push(figure(
        "Desktop: PNG size at scale 0.5",
        "KiB",
        half_sizes,
        None,
        "the same screen",
    ));

    // Through MCP: the image content the model gets.
    let mut mcp = Mcp::spawn(&engine.url);
    mcp.initialize();
    let mut via_mcp = Vec::new();
    for _ in 0..20 {
        let begun = Instant::now();
        let r = mcp.call("computer_screenshot", json!({"sandbox_id": id}));
        via_mcp.push(ms(begun.elapsed()));
        if r["result"]["content"][1]["type"] != "image" {
            return Err(format!("no image content: {}", r["result"]));
        }
    }
    out.push(figure(
        "Desktop: computer_screenshot through MCP (stdio), 1280×800",
        "ms",
        via_mcp,
        None,
        "the MCP server's image content: the PNG once, as base64",
    ));

    let act = format!("/v1/sandboxes/{id}/desktop/actions");
    let mut clicks = Vec::new();
    for i in 0..50 {
        let begun = Instant::now();
        engine.call(
            "POST",
            &act,
            Some(json!({"action": "click", "x": 1000 + (i % 10), "y": 700})),
        )?;
        clicks.push(ms(begun.elapsed()));
    }
    out.push(figure(
        "Desktop: click round trip",
        "ms",
        clicks,
        None,
        "HTTP API: pointer moved, button pressed and released through XTEST, server synced",
    ));
    let mut clicked_shot = Vec::new();
    for i in 0..10 {
        let begun = Instant::now();
        engine.call(
            "POST",
            &act,
            Some(json!({"action": "click", "x": 1000 + i, "y": 700, "screenshot": true})),
        )?;
        clicked_shot.push(ms(begun.elapsed()));
    }
    out.push(figure(
        "Desktop: click with `screenshot: true`",
        "ms",
        clicked_shot,
        None,
        "the screenshot waits until two grabs 40 ms apart agree",
    ));
    engine.call(
        "POST",
        &act,
        Some(json!({"action": "click", "x": 400, "y": 270})),
    )?;
    let ascii: String =
        "The quick brown fox jumps over the lazy dog. ".repeat(23)[..1000].to_string();
    let other: String = ('А'..='я').chain('α'..='ω').cycle().take(1000).collect();
    for (label, text) in [("ASCII", &ascii), ("Cyrillic and Greek", &other)] {
        let mut typed = Vec::new();
        for _ in 0..5 {
            let begun = Instant::now();
            engine.call("POST", &act, Some(json!({"action": "type", "text": text})))?;
            typed.push(ms(begun.elapsed()));
            engine.call(
                "POST",
                &act,
                Some(json!({"action": "key", "keys": "ctrl+a"})),
            )?;
        }
        out.push(figure(
            &format!("Desktop: type 1,000 characters, {label}"),
            "ms",
            typed,
            None,
            "until the display server has taken every key event (the app reads them after)",
        ));
    }
    engine.kill(&id);
    Ok(
        "Desktops are sandboxes of the built-in `desktop` template running Xvfb and matchbox; \
         the agent in each is the X client that grabs the screen and sends input. Screenshots \
         and actions are timed through the HTTP API (one call each), and once through the MCP \
         server to show what the model's image content adds."
            .to_string(),
    )
}

// ---------------------------------------------------------------------------------------------
// Templates: starting from a built or imported template and from a warm pool, a cached
// rebuild, importing an image, and the disk sandboxes of one template share.

/// Polls the template until it is no longer building; its final state.
fn template_ready(engine: &Engine, name: &str) -> Value {
    loop {
        let t = engine.send("GET", &format!("/v1/templates/{name}"), None);
        if t["status"] != "building" {
            assert_eq!(t["status"], "ready", "{t}");
            return t;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A `docker save` archive: a static busybox userland, then `blobs` files of `blob_mib` MiB of
/// random bytes each (incompressible, as real layers' binaries mostly are).
fn bench_image(blobs: usize, blob_mib: usize) -> Vec<u8> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let blobs: Vec<(String, Vec<u8>)> = (0..blobs)
        .map(|i| {
            let data: Vec<u8> = (0..blob_mib << 17)
                .flat_map(|_| {
                    // xorshift: fast, and enough to defeat any compression.
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed.to_le_bytes()
                })
                .collect();
            (format!("data/blob{i}"), data)
        })
        .collect();
    let files: Vec<(&str, &[u8], u32)> = blobs
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice(), 0o644))
        .collect();
    images::docker_save(
        &[images::busybox_layer(), images::layer(&files, &[])],
        json!({"Env": ["PATH=/bin"]}),
    )
}

/// Bytes allocated under `dir` (`du`), the way a disk fills.
fn du_bytes(dir: &Path) -> u64 {
    let out = Command::new("du").arg("-sb").arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn template_figures(out: &mut Vec<Figure>) -> String {
    if !Path::new("/bin/busybox").exists() {
        return "\n## Templates\n\nNot measured: needs busybox-static (`/bin/busybox`).\n".into();
    }
    let engine = Engine::start();
    if engine.call("GET", "/v1/templates/base", None).is_err() {
        // An older build (A/B mode's baseline, say) that cannot make templates.
        return "\n## Templates\n\nNot measured: this build has no template API.\n".into();
    }
    let data = engine._dir.path().join("data");
    let build = |name: &str, steps: Value, warm: u32| {
        engine.send(
            "POST",
            "/v1/templates",
            Some(json!({"name": name, "steps": steps, "warm": warm})),
        );
        template_ready(&engine, name)
    };
    let steps = json!([{"run": "mkdir -p /opt/tool && head -c 1048576 /dev/urandom > /opt/tool/blob"}, {"env": {"TOOL": "1"}}]);
    let (first, _) = time(|| build("tool", steps.clone(), 0));

    // An unchanged rebuild: every step a cache hit.
    let mut cached = Vec::new();
    for i in 0..20 {
        let (d, _) = time(|| build(&format!("tool-{i}"), steps.clone(), 0));
        cached.push(ms(d));
    }
    out.push(figure(
        "Templates: rebuild with every step cached, create → ready",
        "ms",
        cached,
        None,
        &format!(
            "HTTP API, polled every 1 ms; the first build of the same steps took {:.0} ms",
            ms(first)
        ),
    ));

    // Import rate: a 200 MiB image through the API (streamed upload, digests, unpacking).
    let image = bench_image(20, 10);
    let mb = image.len() as f64 / 1e6;
    let mut rates = Vec::new();
    for i in 0..3 {
        let (d, r) = time(|| {
            Engine::http()
                .put(format!("{}/v1/templates/big-{i}/image", engine.url))
                .bearer_auth(KEY)
                .header("content-type", "application/octet-stream")
                .body(image.clone())
                .send()
                .unwrap()
        });
        assert_eq!(r.status().as_u16(), 201, "{:?}", r.text());
        rates.push(mb / d.as_secs_f64());
    }
    out.push(figure(
        &format!("Templates: import a {mb:.0} MB image (docker save, uncompressed layers)"),
        "MB/s",
        rates,
        None,
        "PUT /v1/templates/{name}/image from memory: upload to disk, SHA-256 of every layer, unpacking",
    ));

    // create → first exec: base, the built template and the imported image, in turns. The
    // sandboxes are killed afterwards, as in the engine figures: a kill's teardown (network
    // namespace, subvolume) would otherwise run under the next create.
    let mut alive = Vec::new();
    let mut start = |template: &str| {
        let (d, id) = time(|| {
            let id =
                engine.send("POST", "/v1/sandboxes", Some(json!({"template": template})))["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
            assert_eq!(engine.exec(&id, "true")["exit_code"], 0);
            id
        });
        alive.push(id);
        ms(d)
    };
    let (mut base, mut built, mut imported) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..40 {
        base.push(start("base"));
        built.push(start("tool"));
        imported.push(start("big-0"));
    }
    let diff = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<_>>();
    let (built_diff, imported_diff) = (diff(&built, &base), diff(&imported, &base));
    out.push(figure(
        "Templates: create → first exec, base (interleaved with the two below)",
        "ms",
        base,
        None,
        "HTTP API",
    ));
    out.push(figure(
        "Templates: create → first exec, built template (1 layer over base)",
        "ms",
        built,
        None,
        "HTTP API",
    ));
    out.push(figure(
        "Templates: create → first exec, imported image (3 layers, own userland)",
        "ms",
        imported,
        None,
        "HTTP API; busybox `true` from the image",
    ));
    out.push(figure(
        "Templates: built template − base, per pair of runs",
        "ms",
        built_diff,
        Some((2.0, "≤ 2 ms")),
        "difference of each round's two runs",
    ));
    out.push(figure(
        "Templates: imported image − base, per pair of runs",
        "ms",
        imported_diff,
        Some((2.0, "≤ 2 ms")),
        "difference of each round's two runs",
    ));

    // A warm pool: each create hands out a started sandbox. Back to back, as every other round
    // trip here is measured: a pool of 16, taken 15 at a time (the replacements start 200 ms
    // after each handover, so none runs meanwhile), then refilled, twice.
    build("burst", steps.clone(), 16);
    let mut burst = Vec::new();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_secs(5));
        for _ in 0..15 {
            burst.push(start("burst"));
        }
    }
    out.push(figure(
        "Templates: create → first exec from a warm pool",
        "ms",
        burst,
        Some((3.0, "≤ 3 ms")),
        "HTTP API, `warm: 16`, creates back to back (each followed by its first exec), 15 at a time from a full pool",
    ));
    // The same with the machine idle in between, as an agent's think time leaves it: each call
    // then also pays the idle CPUs' wake-up (see the exec round trip after idle below).
    build("pooled", steps.clone(), 2);
    let mut warm = Vec::new();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(300));
        warm.push(start("pooled"));
    }
    out.push(figure(
        "Templates: create → first exec from a warm pool, 300 ms idle before each",
        "ms",
        warm,
        None,
        "HTTP API, `warm: 2`, 300 ms between creates for the pool to refill",
    ));
    // The machine's own floor under any command: starting `sh -c true` on the host and waiting
    // for it, with no sandbox and no engine in between.
    let mut spawn = Vec::new();
    for _ in 0..100 {
        let (d, status) = time(|| {
            std::process::Command::new("/bin/sh")
                .args(["-c", "true"])
                .status()
                .unwrap()
        });
        assert!(status.success());
        spawn.push(ms(d));
    }
    out.push(figure(
        "Templates: host floor, `sh -c true` started and waited for (no sandbox, no engine)",
        "ms",
        spawn,
        None,
        "std::process::Command on the host; what every exec pays before anything of ours",
    ));
    // What of that is the exec itself: round trips in one of those sandboxes, in the same run.
    let id = alive.last().unwrap().clone();
    let mut rtt = Vec::new();
    for _ in 0..100 {
        let (d, _) = time(|| engine.exec(&id, "true"));
        rtt.push(ms(d));
    }
    out.push(figure(
        "Templates: exec round trip in a sandbox from the pool (`true`)",
        "ms",
        rtt,
        None,
        "HTTP API; the floor under the figures above",
    ));
    let mut idle = Vec::new();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(300));
        let (d, _) = time(|| engine.exec(&id, "true"));
        idle.push(ms(d));
    }
    out.push(figure(
        "Templates: the same round trip after 300 ms idle",
        "ms",
        idle,
        None,
        "HTTP API; what the idle pause adds to any call on this machine",
    ));
    for id in alive {
        engine.kill(&id);
    }

    // Disk: ten sandboxes of the imported image share its layers.
    let layer_bytes = du_bytes(&data.join("layers"));
    let sandboxes = data.join("sandboxes");
    let before = du_bytes(&sandboxes);
    let ids: Vec<String> = (0..10)
        .map(|_| {
            let id = engine.send("POST", "/v1/sandboxes", Some(json!({"template": "big-0"})))["id"]
                .as_str()
                .unwrap()
                .to_string();
            engine.exec(&id, "cat /data/blob0 > /dev/null");
            id
        })
        .collect();
    let per_sandbox = du_bytes(&sandboxes).saturating_sub(before) as f64 / 10.0 / 1024.0;
    for id in ids {
        engine.kill(&id);
    }
    out.push(Figure {
        name: format!("Templates: disk per sandbox, 10 from one {mb:.0} MB image"),
        unit: "KiB",
        median: per_sandbox,
        p95: f64::NAN,
        target: None,
        note: format!(
            "`du` of the sandbox store, delta / 10; the layers themselves: {:.0} MiB on disk once, whatever the count",
            layer_bytes as f64 / (1 << 20) as f64
        ),
    });
    String::new()
}

/// The issue's workspace: 20,000 files of 5,000 bytes (100 MB) in 200 directories under
/// /root/ws, written in one exec.
const WORKSPACE: &str = r#"python3 -c '
import os
for d in range(200):
    p = "/root/ws/d%03d" % d
    os.makedirs(p)
    for f in range(100):
        with open("%s/f%03d" % (p, f), "wb") as o:
            o.write(os.urandom(5000))
'"#;

/// What a sample of the fork figures carries: 20,000 files, 100 MB.
const WORKSPACE_NOTE: &str = "workspace of 20,000 files / 100 MB in the sandbox";

fn fork_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Snapshots and forks\n\n";
    let engine = Engine::start();
    let method = match fork_path(&engine, 10, out, None) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("fork figures FAILED: {why}");
            return format!("{heading}Not (all) measured: {why}\n");
        }
    };
    drop(engine);
    let mut text = String::from(heading);
    text.push_str(
        "A snapshot, and each child of a fork, starts as a copy of the sandbox's own files only \
         (its overlay upper directory): the template's layers underneath are shared read-only by \
         every sandbox and are never copied. On the btrfs store that copy is a copy-on-write \
         subvolume snapshot, which copies none of the files' bytes; on the copy path (a plain \
         store: no root, no btrfs, or `SANDBOX_MCP_DISK_LIMITS=off`) the sandbox's own files \
         are copied, here all 100 MB of them for each snapshot, restore or child. A fork's \
         children are copied side by side, then start their agents in parallel, and the \
         call returns once all of them are running. Every figure is the wall time of HTTP API \
         calls, with the issue's workspace (20,000 files of 5,000 bytes, 100 MB) in the sandbox.",
    );
    if method == "btrfs" {
        let copy = Engine::start_with(&[("SANDBOX_MCP_DISK_LIMITS", "off")]);
        if let Err(why) = fork_path(&copy, 3, out, Some("copy")) {
            eprintln!("fork figures on the copy path FAILED: {why}");
            text.push_str(&format!(" The copy path was not measured: {why}."));
        }
    } else {
        text.push_str(&format!(
            " The btrfs store was not available on this machine (the default engine's snapshots \
             came back with method `{method}`), so only the copy path was measured."
        ));
    }
    text.push('\n');
    text
}

/// The fork and snapshot figures of one engine, `runs` samples each; the copy method its
/// snapshots used (`expect`: the one it must use, or the figures are not taken).
fn fork_path(
    engine: &Engine,
    runs: usize,
    out: &mut Vec<Figure>,
    expect: Option<&str>,
) -> Result<String, String> {
    let id = engine.create();
    let built = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": WORKSPACE, "timeout_ms": 120000})),
    )?;
    if built["exit_code"] != 0 {
        return Err(format!("the workspace was not written: {built}"));
    }
    let snapshots = format!("/v1/sandboxes/{id}/snapshots");
    let snapshot = |engine: &Engine| engine.call("POST", &snapshots, Some(json!({})));
    // One untimed snapshot: which store this is, and what a snapshot holds.
    let first = snapshot(engine)?;
    let method = first["method"].as_str().unwrap_or("unknown").to_string();
    if expect.is_some_and(|m| m != method) {
        return Err(format!("its snapshots came back with method `{method}`"));
    }
    let held_mb = first["size_bytes"].as_u64().unwrap_or(0) as f64 / 1e6;
    let snap_id = first["id"].as_str().unwrap().to_string();
    let path = if method == "btrfs" {
        "btrfs"
    } else {
        "copy path"
    };
    let name = |what: &str| format!("Forks ({path}): {what}");
    // The issue's targets are for the btrfs store; the copy path's figures stand beside them.
    let btrfs_target = |t: (f64, &'static str)| (method == "btrfs").then_some(t);
    let note = |what: &str| format!("HTTP API call wall time, {WORKSPACE_NOTE}; {what}");

    let fork = |count: u32| -> Result<(f64, Vec<String>), String> {
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{id}/fork"),
                Some(json!({"count": count})),
            )
        });
        let r = r?;
        if r["method"] != method.as_str() {
            return Err(format!(
                "a fork used another method than the snapshots: {r}"
            ));
        }
        let ids: Vec<String> = r["ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some(c.as_str()?.to_string()))
            .collect();
        Ok((ms(d), ids))
    };
    for count in [1, 8] {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (t, children) = fork(count)?;
            samples.push(t);
            for c in children {
                engine.kill(&c);
            }
        }
        out.push(figure(
            &name(&format!("fork n={count}, call → children running")),
            "ms",
            samples,
            btrfs_target(if count == 1 {
                (30.0, "≤ 30 ms")
            } else {
                (100.0, "≤ 100 ms")
            }),
            &note(&format!(
                "POST /v1/sandboxes/{{id}}/fork `count: {count}` until it returns with the \
                 children running; they are killed after each run, untimed"
            )),
        ));
    }

    // Time to usable: the fork, then the first command in the child.
    let mut usable = Vec::new();
    for _ in 0..runs {
        let (d, r) = time(|| -> Result<String, String> {
            let (_, children) = fork(1)?;
            let child = children.into_iter().next().ok_or("a fork with no child")?;
            let ran = engine.call(
                "POST",
                &format!("/v1/sandboxes/{child}/exec"),
                Some(json!({"command": "true", "timeout_ms": 120000})),
            )?;
            if ran["exit_code"] != 0 {
                return Err(format!("`true` in a child failed: {ran}"));
            }
            Ok(child)
        });
        usable.push(ms(d));
        engine.kill(&r?);
    }
    out.push(figure(
        &name("fork n=1 → first exec in the child (`true`)"),
        "ms",
        usable,
        None,
        &note("the fork call, then exec `true` in the child until it returns: time to usable"),
    ));

    let mut created = Vec::new();
    for _ in 0..runs {
        let (d, r) = time(|| snapshot(engine));
        created.push(ms(d));
        let s = r?;
        engine.call(
            "DELETE",
            &format!("{snapshots}/{}", s["id"].as_str().unwrap_or("")),
            None,
        )?;
    }
    out.push(figure(
        &name("snapshot create"),
        "ms",
        created,
        btrfs_target((20.0, "≤ 20 ms")),
        &note(&format!(
            "POST /v1/sandboxes/{{id}}/snapshots; its size_bytes: {held_mb:.0} MB (the \
             100 MB in 4 KiB blocks); each is deleted after its run, untimed"
        )),
    ));

    let mut restored = Vec::new();
    for _ in 0..runs {
        let (d, r) = time(|| engine.call("POST", &format!("{snapshots}/{snap_id}/restore"), None));
        r?;
        restored.push(ms(d));
    }
    out.push(figure(
        &name("restore"),
        "ms",
        restored,
        btrfs_target((30.0, "≤ 30 ms")),
        &note(
            "POST …/snapshots/{snapshot_id}/restore of the same snapshot each run: the \
             processes stopped, the files put back and the sandbox restarted on them",
        ),
    ));

    // Two siblings, one with ten files changed.
    let (_, pair) = fork(2)?;
    let [a, b] = <[String; 2]>::try_from(pair).map_err(|p| format!("a fork of 2 made {p:?}"))?;
    let changed = engine.call(
        "POST",
        &format!("/v1/sandboxes/{a}/exec"),
        Some(json!({
            "command": "for d in 0 1 2 3 4 5 6 7 8 9; do echo changed >> /root/ws/d00$d/f000; done",
            "timeout_ms": 120000,
        })),
    )?;
    if changed["exit_code"] != 0 {
        return Err(format!("the child's files were not changed: {changed}"));
    }
    let mut diffs = Vec::new();
    let mut found = Value::Null;
    // A read on either path, and cheap: as many runs as the btrfs figures.
    for _ in 0..runs.max(10) {
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{a}/diff"),
                Some(json!({"against": b})),
            )
        });
        found = r?;
        diffs.push(ms(d));
    }
    if found["modified"].as_u64().unwrap_or(0) < 10 {
        return Err(format!("the diff missed the ten changed files: {found}"));
    }
    out.push(figure(
        &name("diff of two siblings (10 files changed in one)"),
        "ms",
        diffs,
        btrfs_target((100.0, "≤ 100 ms")),
        &note(&format!(
            "POST /v1/sandboxes/{{a}}/diff `against: b`, two children of one fork; found \
             {} added, {} removed, {} modified",
            found["added"], found["removed"], found["modified"]
        )),
    ));
    for s in [&a, &b, &id] {
        engine.kill(s);
    }
    Ok(method)
}

/// How this engine's sandboxes are networked, read from one of them: a short label for the
/// figure's name, and what it means for its notes.
fn networking(engine: &Engine, id: &str) -> (&'static str, &'static str) {
    let info = engine
        .get(&format!("/v1/sandboxes/{id}"))
        .unwrap_or_default();
    match info["network"]["mode"].as_str() {
        Some("filtered") => (
            "networking on",
            "each sandbox with its own network namespace, nf_tables rules and the engine's relay \
             sockets in it",
        ),
        Some("loopback_only") => (
            "loopback only",
            "no networking: the engine does not run as root, so sandboxes have loopback only",
        ),
        _ => (
            "networking unknown",
            "the engine did not say how sandboxes are networked",
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Network: the egress path against the direct one, on a test internet of the bench's own.

/// The namespace is `smcp-bench-<pid>-0`, the host's end of the veth pair `bn<pid>-0` (see
/// [`netlinks`], shared with the tests, which take the lowest free /28 where the bench takes the
/// highest).
const NET_NS_PREFIX: &str = "smcp-bench-";
const NET_LINK_PREFIX: &str = "bn";
/// The test internet's servers: `GET /bytes/N` over HTTP/1.1, and a one-message TCP echo.
const BYTES_PORT: u16 = 8000;
const ECHO_PORT: u16 = 7;
/// And HTTPS/1.1 with keep-alive, for the secrets swap: a certificate for `*.bench.test` (the
/// secret's hosts) and `*.other.test` (passthrough), from a CA of the bench's own.
const HTTPS_PORT: u16 = 443;
const GIB: u64 = 1 << 30;

/// A network namespace joined to the host by a veth pair addressed from a /28 of TEST-NET-2, with
/// the servers listening on its end: real traffic that never leaves this machine. The sandboxes
/// reach it through the engine's relay, the host directly. Dropping it (also when a figure
/// panics) stops the servers and removes the namespace and both interfaces.
struct BenchNet {
    /// The namespace's end of the pair: where the servers listen.
    net_ip: std::net::Ipv4Addr,
    /// Clones of the listeners, shut down on drop to end the accept loops.
    listeners: Vec<std::net::TcpListener>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The HTTPS server, or why there is none (the figures that need it say so).
    https: Result<Https, String>,
    /// The namespace and the veth pair into it (dropped after the servers stop).
    links: netlinks::Links,
}

/// The test internet's HTTPS server: its CA, and what it was sent.
struct Https {
    /// The CA's certificate (PEM), and the same in a file for the engine's `--egress-ca`.
    ca_pem: String,
    ca_file: tempfile::NamedTempFile,
    /// The last `Authorization` header received, by TLS server name.
    seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
}

impl BenchNet {
    /// Err names what this machine lacks: root, network namespaces, veth, the `ip` command.
    fn start() -> Result<BenchNet, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "needs root (network namespaces, a veth pair, and sandboxes with networking)"
                    .into(),
            );
        }
        let links = netlinks::claim(NET_NS_PREFIX, NET_LINK_PREFIX, 0, true)?;
        let mut net = BenchNet {
            net_ip: links.net_ip(),
            listeners: Vec::new(),
            threads: Vec::new(),
            stop: Default::default(),
            https: Err("not started".into()),
            links,
        };
        let bytes = net.bind(BYTES_PORT)?;
        net.serve(bytes, |conn| {
            // One thread per download: a slow client holds up no other.
            std::thread::spawn(move || serve_bytes(conn));
        })?;
        let echo = net.bind(ECHO_PORT)?;
        net.serve(echo, serve_echo)?;
        net.https = net.start_https();
        Ok(net)
    }

    /// The HTTPS server on [`HTTPS_PORT`], with a CA and a certificate made for this run.
    fn start_https(&mut self) -> Result<Https, String> {
        let (config, ca_pem) = https_config()?;
        let mut ca_file = tempfile::Builder::new()
            .prefix("smcp-bench-ca")
            .suffix(".pem")
            .tempfile()
            .map_err(|e| format!("a temporary file for the bench CA: {e}"))?;
        ca_file
            .write_all(ca_pem.as_bytes())
            .map_err(|e| format!("writing the bench CA: {e}"))?;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Default::default()));
        let listener = self.bind(HTTPS_PORT)?;
        let handler_seen = seen.clone();
        self.serve(listener, move |conn| {
            let (config, seen) = (config.clone(), handler_seen.clone());
            std::thread::spawn(move || serve_https(conn, config, seen));
        })?;
        Ok(Https {
            ca_pem,
            ca_file,
            seen,
        })
    }

    /// A listener on the namespace's end, port `port`: bound by a thread that enters the
    /// namespace and ends (the socket stays in the namespace it was made in).
    fn bind(&self, port: u16) -> Result<std::net::TcpListener, String> {
        let path = format!("/run/netns/{}", self.links.ns);
        let addr = (self.net_ip, port);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("setns({path}): {e}"))?;
                std::net::TcpListener::bind(addr).map_err(|e| format!("bind {addr:?}: {e}"))
            })
            .join()
            .unwrap()
        })
    }

    /// Accepts on `listener` until dropped, handing each connection to `handle`.
    fn serve(
        &mut self,
        listener: std::net::TcpListener,
        handle: impl Fn(std::net::TcpStream) + Send + 'static,
    ) -> Result<(), String> {
        self.listeners
            .push(listener.try_clone().map_err(|e| e.to_string())?);
        let stop = self.stop.clone();
        self.threads.push(std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => handle(conn),
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }));
        Ok(())
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // A listener shut down fails its pending and future accepts at once.
        for l in &self.listeners {
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(l),
                nix::sys::socket::Shutdown::Both,
            );
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Then `links` goes: the pair and the namespace.
    }
}

/// The seconds of a transfer a probe reported as "BYTES SECONDS", checking it moved `expected`
/// bytes.
fn transfer_secs(got: &str, expected: u64) -> Result<f64, String> {
    let mut words = got.split_whitespace();
    let bytes: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let secs: f64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::NAN);
    if bytes == expected {
        Ok(secs)
    } else {
        Err(format!("printed {got:?}, not {expected} bytes"))
    }
}

/// `GET /bytes/N`: N bytes after a minimal HTTP/1.1 head, then close; written from a 1 MiB
/// buffer, so the sender costs next to nothing beside the path measured.
fn serve_bytes(mut conn: std::net::TcpStream) {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(n) if n > 0 && head.len() < 8192 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let Some(mut left) = head
        .strip_prefix("GET /bytes/")
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
    else {
        let _ = conn
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let header = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {left}\r\n\
         Connection: close\r\n\r\n"
    );
    if conn.write_all(header.as_bytes()).is_err() {
        return;
    }
    let chunk = vec![b'x'; 1 << 20];
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if conn.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n as u64;
    }
    // Close once the client has everything and closed its side.
    let _ = conn.shutdown(std::net::Shutdown::Write);
    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
}

/// The HTTPS server's TLS setting: a throwaway CA and a leaf it signs for `*.bench.test`,
/// `bench.test` and `*.other.test`; and the CA's PEM.
fn https_config() -> Result<(std::sync::Arc<rustls::ServerConfig>, String), String> {
    let err = |e: rcgen::Error| format!("bench certificates: {e}");
    let ca_key = rcgen::KeyPair::generate().map_err(err)?;
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "sandbox-mcp bench CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key).map_err(err)?.pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf_key = rcgen::KeyPair::generate().map_err(err)?;
    let mut leaf = rcgen::CertificateParams::new(vec![
        "*.bench.test".to_string(),
        "bench.test".to_string(),
        "*.other.test".to_string(),
    ])
    .map_err(err)?;
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "bench.test");
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf = leaf.signed_by(&leaf_key, &issuer).map_err(err)?;
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der())
        .map_err(|e| format!("bench leaf key: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .map_err(|e| format!("bench TLS server: {e}"))?;
    Ok((std::sync::Arc::new(config), ca_pem))
}

/// HTTP/1.1 over TLS, keep-alive: each request's head and `Content-Length` body are read (the
/// body thrown away as it comes), its `Authorization` noted under the TLS server name, and a
/// short 200 sent back; until the client closes or sends `Connection: close`.
fn serve_https(
    conn: std::net::TcpStream,
    config: std::sync::Arc<rustls::ServerConfig>,
    seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
) {
    use std::io::Read;
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(server) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(server, conn);
    let mut buf = vec![0u8; 256 * 1024];
    // Read but not yet used: the start of a head, or what followed a body.
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if pending.len() > 64 * 1024 {
                return;
            }
            match tls.read(&mut buf) {
                Ok(n @ 1..) => pending.extend_from_slice(&buf[..n]),
                _ => return,
            }
        };
        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
        pending.drain(..end);
        let (mut length, mut close, mut auth) = (0u64, false, None);
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap_or(0),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                "authorization" => auth = Some(value.to_string()),
                _ => {}
            }
        }
        if let (Some(name), Some(auth)) = (tls.conn.server_name(), auth) {
            seen.lock().unwrap().insert(name.to_string(), auth);
        }
        let early = (pending.len() as u64).min(length) as usize;
        pending.drain(..early);
        let mut left = length - early as u64;
        while left > 0 {
            match tls.read(&mut buf) {
                Ok(n @ 1..) => {
                    if n as u64 > left {
                        pending.extend_from_slice(&buf[left as usize..n]);
                        left = 0;
                    } else {
                        left -= n as u64;
                    }
                }
                _ => return,
            }
        }
        let answer: &[u8] = if close {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        };
        if tls.write_all(answer).and_then(|()| tls.flush()).is_err() {
            return;
        }
        if close {
            tls.conn.send_close_notify();
            let _ = tls.flush();
            return;
        }
    }
}

/// One message back as it came, then close: the round trip a connection's first request makes.
fn serve_echo(mut conn: std::net::TcpStream) {
    use std::io::Read;
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    if let Ok(n @ 1..) = conn.read(&mut buf) {
        let _ = conn.write_all(&buf[..n]);
    }
}

/// The client of every network figure, run with the system's Python as the same script on
/// the host and in a sandbox (which sees the host's /usr), timing itself:
///
/// - `bytes IP PORT N`: one `GET /bytes/N`, read into a 1 MiB buffer; prints the body's bytes
///   and the seconds from before connect to the last byte;
/// - `tcp IP PORT N`: N times (after one untimed) connect, send one byte, read it back, close;
///   prints each in µs;
/// - `http IP PORT HOST PATH N [NAME:VALUE…]`: N times (after one untimed) connect, `GET PATH`
///   with `Host: HOST` and these headers, read to the end (a 200 answer), close; prints each in
///   µs;
/// - `tls IP PORT NAME CAFILE N [NAME:VALUE…]`: one TLS connection (server name NAME, trusting
///   the CAs in CAFILE), then N times (after one untimed) `GET` with `Host: NAME` and these
///   headers, reading the whole answer: requests on a warm keep-alive connection; prints each
///   in µs;
/// - `tlsnew IP PORT NAMES CAFILE N [NAME:VALUE…]`: N times (after one untimed) connect, TLS
///   handshake, the `GET` above, close; each time with a new server name, NAMES with `@`
///   replaced by the count; prints each in µs;
/// - `tlsup IP PORT NAME CAFILE BYTES [NAME:VALUE…]`: one TLS connection, one untimed `GET`,
///   then a `POST` of BYTES (sent from a 1 MiB buffer) and its answer; prints BYTES and the
///   seconds from the first byte sent to the answer.
const PROBE: &str = r#"
import socket, ssl, sys, time

def connect(ip, port):
    s = socket.create_connection((ip, int(port)), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def tcp(ip, port):
    s = connect(ip, port)
    s.sendall(b"x")
    assert s.recv(1) == b"x", "no echo"
    s.close()

def http(ip, port, host, path, *headers):
    s = connect(ip, port)
    extra = "".join(f"{h}\r\n" for h in headers)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode())
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    assert got[:9] in (b"HTTP/1.0 ", b"HTTP/1.1 ") and got[9:12] == b"200", got[:200]
    s.close()

def answer(s):
    got = b""
    while b"\r\n\r\n" not in got:
        d = s.recv(65536)
        assert d, "closed before the answer"
        got += d
    head, _, body = got.partition(b"\r\n\r\n")
    assert head[:9] == b"HTTP/1.1 " and head[9:12] == b"200", got[:300]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        d = s.recv(65536)
        assert d, "closed in the answer"
        body += d

def request(s, name, headers, size=0, chunk=None):
    extra = "".join(f"{h}\r\n" for h in headers)
    if size:
        s.sendall(f"POST /upload HTTP/1.1\r\nHost: {name}\r\n{extra}Content-Length: {size}\r\n\r\n".encode())
        while size:
            k = min(size, len(chunk))
            s.sendall(chunk[:k])
            size -= k
    else:
        s.sendall(f"GET /hello HTTP/1.1\r\nHost: {name}\r\n{extra}\r\n".encode())
    answer(s)

def tls(ctx, ip, port, name):
    return ctx.wrap_socket(connect(ip, port), server_hostname=name)

def timed(n, once):
    once()
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        once()
        out.append((time.perf_counter_ns() - t) / 1000)
    print(" ".join(f"{x:.1f}" for x in out))

mode, args = sys.argv[1], sys.argv[2:]
if mode == "bytes":
    ip, port, n = args
    t = time.perf_counter()
    s = connect(ip, port)
    s.sendall(f"GET /bytes/{n} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    buf = memoryview(bytearray(1 << 20))
    head = b""
    while b"\r\n\r\n" not in head:
        k = s.recv_into(buf)
        assert k, "closed before the head"
        head += bytes(buf[:k])
    assert head[:9] in (b"HTTP/1.0 ", b"HTTP/1.1 ") and head[9:12] == b"200", head[:200]
    body = len(head) - head.index(b"\r\n\r\n") - 4
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        body += k
    print(body, time.perf_counter() - t)
elif mode == "tcp":
    ip, port, n = args
    timed(int(n), lambda: tcp(ip, port))
elif mode == "http":
    ip, port, host, path, n, *headers = args
    timed(int(n), lambda: http(ip, port, host, path, *headers))
elif mode == "tls":
    ip, port, name, cafile, n, *headers = args
    s = tls(ssl.create_default_context(cafile=cafile), ip, port, name)
    timed(int(n), lambda: request(s, name, headers))
    s.close()
elif mode == "tlsnew":
    ip, port, names, cafile, n, *headers = args
    ctx = ssl.create_default_context(cafile=cafile)
    count = iter(range(1 << 30))
    def first():
        name = names.replace("@", str(next(count)))
        s = tls(ctx, ip, port, name)
        request(s, name, headers)
        s.close()
    timed(int(n), first)
elif mode == "tlsup":
    ip, port, name, cafile, size, *headers = args
    s = tls(ssl.create_default_context(cafile=cafile), ip, port, name)
    request(s, name, headers)
    chunk = memoryview(b"x" * (1 << 20))
    t = time.perf_counter()
    request(s, name, headers, int(size), chunk)
    print(size, time.perf_counter() - t)
    s.close()
"#;

/// Runs [`PROBE`] with `args` in sandbox `id`: its stdout, or why it failed.
fn probe_inside(engine: &Engine, id: &str, args: &str) -> Result<String, String> {
    let r = engine.exec(
        id,
        &format!("/usr/bin/python3 - {args} <<'EOF'\n{PROBE}\nEOF"),
    );
    if r["exit_code"] != 0 {
        return Err(format!("in the sandbox, probe {args}: {r}"));
    }
    Ok(r["stdout"].as_str().unwrap_or_default().to_string())
}

/// Runs [`PROBE`] with `args` on the host: its stdout, or why it failed.
fn probe_host(args: &str) -> Result<String, String> {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(PROBE)
        .args(args.split_whitespace())
        .output()
        .map_err(|e| format!("/usr/bin/python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "on the host, probe {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Samples of a `tcp`/`http` probe's output, in ms.
fn probe_ms(out: &str) -> Result<Vec<f64>, String> {
    out.split_whitespace()
        .map(|v| v.parse::<f64>().map(|us| us / 1000.0))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("probe output {out:?}: {e}"))
}

/// Runs `probe` for one side (`true`: in the sandbox, or through the path measured) and the
/// other (`false`: on the host, or the path compared with) in alternating order, `rounds` times
/// each: what each side returned, in the order of the rounds.
fn interleaved<T>(
    rounds: usize,
    mut probe: impl FnMut(bool) -> Result<T, String>,
) -> Result<(Vec<T>, Vec<T>), String> {
    let (mut inside, mut host) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for in_sandbox in order {
            let v = probe(in_sandbox)?;
            if in_sandbox { &mut inside } else { &mut host }.push(v);
        }
    }
    Ok((inside, host))
}

/// The egress path against the direct one: a sandbox's download and connections through the
/// engine's relay, and the host's own to the same servers with the same client, interleaved.
/// Returns the section of the report that says how (or why nothing was measured).
fn network_figures(out: &mut Vec<Figure>) -> String {
    let mut md = String::from("\n## Network: the egress path against the direct one\n\n");
    let net = match BenchNet::start() {
        Ok(net) => net,
        Err(why) => {
            eprintln!("network figures SKIPPED: {why}");
            for heading in ["", PREVIEW_HEADING, SECRETS_HEADING] {
                md.push_str(&format!("{heading}Not measured in this run: {why}.\n"));
            }
            return md;
        }
    };
    // Only the namespace's address is opened, as an operator opens a private server; previews
    // on a port of their own; the HTTPS server's CA trusted upstream of the secrets swap.
    let allow = format!("{}/32", net.net_ip);
    let ca_path = net
        .https
        .as_ref()
        .map(|h| h.ca_file.path().to_string_lossy().into_owned());
    let mut env = vec![
        ("SANDBOX_MCP_EGRESS_ALLOW", allow.as_str()),
        ("SANDBOX_MCP_PREVIEW_LISTEN", "127.0.0.1:0"),
    ];
    if let Ok(path) = &ca_path {
        env.push(("SANDBOX_MCP_EGRESS_CA", path));
    }
    let engine = Engine::start_with(&env);
    let id = engine.create();
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string()
    };
    let load_before = load();
    match measure_network(&engine, &id, &net, out) {
        Ok(()) => md.push_str(&format!(
            "A test internet of the bench's own: a network namespace joined to the host by a veth \
             pair ({allow} at its end, TEST-NET-2: nothing leaves this machine), serving `GET \
             /bytes/N` and a TCP echo from threads of the bench. The engine runs with \
             `--egress-allow {allow}`. The same client, a Python script run by the system's \
             Python, talks to the same servers from a sandbox, through the engine's relay (the \
             sandbox's nf_tables rules redirect the connection to the engine's listener in its \
             namespace; the engine connects out from the host's namespace and copies both ways), \
             and from the host, directly, in alternating order. The sandbox has the base \
             template's shape (1 vCPU); the host's client has no limit. Load average (1 min) \
             of this shared machine: {load_before} before, {} after.\n",
            load()
        )),
        Err(why) => {
            eprintln!("network figures FAILED: {why}");
            md.push_str(&format!("Not measured in this run: {why}.\n"));
        }
    }
    md.push_str(PREVIEW_HEADING);
    match preview_figures(&engine, &id, out) {
        Ok(how) => md.push_str(&how),
        Err(why) => {
            eprintln!("preview figures FAILED: {why}");
            md.push_str(&format!("Not measured in this run: {why}.\n"));
        }
    }
    engine.kill(&id);
    md.push_str(SECRETS_HEADING);
    match secrets_figures(&engine, &net, out) {
        Ok(how) => md.push_str(&how),
        Err(why) => {
            eprintln!("secrets figures FAILED: {why}");
            md.push_str(&format!("Not measured in this run: {why}.\n"));
        }
    }
    drop(engine);
    drop(net);
    md
}

fn measure_network(
    engine: &Engine,
    id: &str,
    net: &BenchNet,
    out: &mut Vec<Figure>,
) -> Result<(), String> {
    let (label, how) = networking(engine, id);
    if label != "networking on" {
        return Err(format!(
            "the engine's sandboxes have no network here ({how})"
        ));
    }

    // 1 GiB on each side per round; the share compares each round's pair, so drift cancels.
    const ROUNDS: usize = 5;
    let args = format!("bytes {} {BYTES_PORT} {GIB}", net.net_ip);
    let (relay, direct) = interleaved(ROUNDS, |in_sandbox| {
        let got = if in_sandbox {
            probe_inside(engine, id, &args)?
        } else {
            probe_host(&args)?
        };
        let secs = transfer_secs(&got, GIB).map_err(|e| format!("a download {e}"))?;
        Ok(GIB as f64 / secs / 1e9)
    })?;
    let shares: Vec<f64> = relay
        .iter()
        .zip(&direct)
        .map(|(r, d)| r / d * 100.0)
        .collect();
    for (round, (r, d)) in relay.iter().zip(&direct).enumerate() {
        eprintln!("1 GiB, round {round}: relay {r:.3} GB/s, direct {d:.3} GB/s");
    }
    out.push(figure(
        "Network: 1 GiB download in a sandbox, through the egress relay",
        "GB/s",
        relay,
        Some((1.0, "≥ 1 GB/s")),
        "GET /bytes/1073741824 from the test internet; connect to last byte; 1 GB = 10⁹ bytes",
    ));
    out.push(figure(
        "Network: the same download on the host, direct",
        "GB/s",
        direct,
        None,
        "same server, same client, rounds alternating with the above",
    ));
    out.push(figure(
        "Network: egress relay ÷ direct, 1 GiB download",
        "%",
        shares,
        Some((80.0, "≥ 80% of direct")),
        "relay rate ÷ direct rate of each round's pair of downloads",
    ));

    // A new connection and its first round trip: what an application waits for before its
    // first answer. The relay's work (accept, decide, connect out) happens after the sandbox's
    // connect() returns, so the round trip is what shows it.
    let args = format!("tcp {} {ECHO_PORT} 50", net.net_ip);
    let (relay, direct) = interleaved(10, |in_sandbox| {
        probe_ms(&if in_sandbox {
            probe_inside(engine, id, &args)?
        } else {
            probe_host(&args)?
        })
    })?;
    let (relay, direct) = (relay.concat(), direct.concat());
    let added = median_p95(&relay).0 - median_p95(&direct).0;
    out.push(figure(
        "Network: connect + 1-byte round trip from a sandbox, through the relay",
        "ms",
        relay,
        None,
        "to the test internet's TCP echo; connect, send, read the echo (then close)",
    ));
    out.push(figure(
        "Network: the same from the host, direct",
        "ms",
        direct,
        None,
        "same server, same client, blocks of 50 alternating with the above",
    ));
    out.push(Figure {
        name: "Network: latency the engine adds to a new connection (p50 difference)".into(),
        unit: "ms",
        median: added,
        p95: f64::NAN,
        target: Some((0.3, "≤ 0.3 ms")),
        note: "medians of the two series above".into(),
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Previews: a request through the engine's preview listener against the same request made in
// the sandbox.

const PREVIEW_HEADING: &str =
    "\n## Previews: through the preview URL against inside the sandbox\n\n";
/// The port of the sandbox's app.
const APP_PORT: u16 = 8080;
/// The sandbox's app: one request per connection, answered `200 ok`, then close; one at a time,
/// so that it costs the same whoever asks.
const APP: &str = r#"
import socket, sys
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(128)
while True:
    c, _ = s.accept()
    try:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        got = b""
        while b"\r\n\r\n" not in got:
            d = c.recv(65536)
            if not d:
                break
            got += d
        if got:
            c.sendall(ANSWER)
    except OSError:
        pass
    c.close()
"#;

/// The preview figures: the same client (the probe's `http` mode: connect, one `GET`, read to
/// the end) from the host through a private preview of the app, and in the sandbox straight to
/// the app; interleaved. Returns what the report says about how.
fn preview_figures(engine: &Engine, id: &str, out: &mut Vec<Figure>) -> Result<String, String> {
    let (label, how) = networking(engine, id);
    if label != "networking on" {
        return Err(format!(
            "the engine's sandboxes have no network namespace here ({how})"
        ));
    }
    engine.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/bench_app.py", "content": APP})),
    )?;
    engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": format!("/usr/bin/python3 /root/bench_app.py {APP_PORT}"), "background": true})),
    )?;
    let inside = format!("http 127.0.0.1 {APP_PORT} localhost:{APP_PORT} /");
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(why) = probe_inside(engine, id, &format!("{inside} 1")) {
        if Instant::now() > deadline {
            return Err(format!("the sandbox's app did not answer: {why}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let preview = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/previews"),
        Some(json!({"port": APP_PORT})),
    )?;
    let url = preview["url"].as_str().unwrap_or_default();
    let token = preview["token"]
        .as_str()
        .ok_or(format!("a private preview without a token: {preview}"))?;
    // http://{port}-{id}.localhost:{listen port}/?preview_token=…
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .ok_or(format!("a preview URL of an unknown form: {url}"))?;
    let (host, listen) = authority
        .rsplit_once(':')
        .ok_or(format!("a preview URL without a port: {url}"))?;
    // The token in its header, as non-browser clients send it (a browser trades the query
    // parameter for a cookie once, then sends that).
    let via = format!("http 127.0.0.1 {listen} {host} / ");
    let token_header = format!("X-Preview-Token:{token}");
    probe_host(&format!("{via} 1 {token_header}"))?;

    let (direct, proxied) = interleaved(10, |in_sandbox| {
        probe_ms(&if in_sandbox {
            probe_inside(engine, id, &format!("{inside} 50"))?
        } else {
            probe_host(&format!("{via} 50 {token_header}"))?
        })
    })?;
    let (direct, proxied) = (direct.concat(), proxied.concat());
    let added = median_p95(&proxied).0 - median_p95(&direct).0;

    // What the proxy does for each connection before it can connect: start a thread that enters
    // the sandbox's network namespace and makes the socket there. The same, here, against the
    // same without entering (a thread and a socket), in alternating blocks.
    let ns = netns_of(engine, id)?;
    let (mut entering, mut staying) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        for _ in 0..50 {
            entering.push(namespace_thread(&ns, true)?);
        }
        for _ in 0..50 {
            staying.push(namespace_thread(&ns, false)?);
        }
    }
    let thread = median_p95(&entering).0;
    let without_setns = median_p95(&staying).0;

    out.push(figure(
        "Preview: GET in the sandbox, straight to the app",
        "ms",
        direct,
        None,
        "new connection to 127.0.0.1:8080 in the sandbox, GET /, read to the end (the app \
         closes)",
    ));
    out.push(figure(
        "Preview: the same GET from the host, through the preview URL",
        "ms",
        proxied,
        None,
        "new connection to the preview listener, Host: {port}-{id}.localhost, X-Preview-Token; \
         same client, blocks of 50 alternating with the above",
    ));
    out.push(Figure {
        name: "Preview: latency the preview proxy adds (p50 difference)".into(),
        unit: "ms",
        median: added,
        p95: f64::NAN,
        target: Some((0.5, "≤ 0.5 ms")),
        note: "medians of the two series above".into(),
    });
    out.push(figure(
        "Preview: of which, a thread entering the sandbox's network namespace",
        "ms",
        entering,
        None,
        &format!(
            "what the proxy does per connection, done by the bench: spawn a thread, setns into \
             the sandbox's namespace, make the socket, hand it back; without the setns: \
             {without_setns:.3} ms"
        ),
    ));
    let verdict = if added <= 0.5 {
        format!("The target (≤ 0.5 ms) is met: the proxy adds {added:.3} ms.")
    } else {
        format!(
            "The target (≤ 0.5 ms) is missed by {:.3} ms: the proxy adds {added:.3} ms, of which \
             the thread that enters the sandbox's namespace accounts for about {thread:.3} ms \
             ({:.0}%; {without_setns:.3} ms of it without the setns).",
            added - 0.5,
            thread / added * 100.0
        )
    };
    Ok(format!(
        "The engine serves previews on 127.0.0.1 (`--preview-listen 127.0.0.1:0`, a free port). \
         In the sandbox (the one of the figures above), a one-connection-at-a-time Python app on \
         127.0.0.1:{APP_PORT} answers `200 ok` and closes; it has a private preview. The probe's \
         `http` mode (a new connection, one GET, read to the end; Python, the same script) runs \
         in the sandbox to the app directly, and on the host through the preview URL with the \
         token in the `X-Preview-Token` header, in alternating blocks of 50. The proxy's own \
         path per connection: hyper reads the request, the token is checked, a thread enters the \
         sandbox's network namespace to make the socket, the connection to the app is made and \
         the request relayed. {verdict}\n"
    ))
}

/// The sandbox's network namespace, opened from the process of the host that is in it.
fn netns_of(engine: &Engine, id: &str) -> Result<std::fs::File, String> {
    let r = engine.exec(id, "readlink /proc/self/ns/net");
    let want = r["stdout"].as_str().unwrap_or_default().trim().to_string();
    let own = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
    if !want.starts_with("net:[") || Path::new(&want) == own {
        return Err(format!(
            "the sandbox's network namespace is not one of its own: {r}"
        ));
    }
    for entry in std::fs::read_dir("/proc")
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let path = entry.path().join("ns/net");
        if std::fs::read_link(&path).is_ok_and(|l| l == Path::new(&want)) {
            return std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()));
        }
    }
    Err(format!("no process of the host is in {want}"))
}

/// The preview proxy's step before connecting: a thread that enters `ns` (when `enter`), makes a
/// non-blocking TCP socket there and hands it back; its ms from spawn to the socket in hand.
fn namespace_thread(ns: &std::fs::File, enter: bool) -> Result<f64, String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let ns = ns.try_clone().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("preview-connect".into())
        .spawn(move || {
            let made = if enter {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            } else {
                Ok(())
            }
            .and_then(|()| {
                socket(
                    AddressFamily::Inet,
                    SockType::Stream,
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    None,
                )
            });
            let _ = tx.send(made);
        })
        .map_err(|e| e.to_string())?;
    let socket = rx
        .recv()
        .map_err(|_| "the namespace thread died".to_string())?
        .map_err(|e| format!("setns or socket: {e}"))?;
    let took = ms(started.elapsed());
    drop(socket);
    Ok(took)
}

// ---------------------------------------------------------------------------------------------
// Secrets: requests through the swap against TLS passthrough, from the same sandbox.

const SECRETS_HEADING: &str = "\n## Secrets: the swap against TLS passthrough\n\n";
/// The secret's value: as long as a stand-in, so that both paths send requests of one size.
const SECRET_VALUE: &str = "sk-bench-REAL-VALUE-0123456789abcdefghijkl";
/// One upload's size.
const UPLOAD: u64 = 100 << 20;

/// The secrets figures, on a sandbox of their own with the secret bound. Returns what the report
/// says about how.
fn secrets_figures(
    engine: &Engine,
    net: &BenchNet,
    out: &mut Vec<Figure>,
) -> Result<String, String> {
    let https = net
        .https
        .as_ref()
        .map_err(|why| format!("the test internet has no HTTPS server: {why}"))?;
    engine.call(
        "PUT",
        "/v1/secrets/bench",
        Some(json!({"hosts": ["*.bench.test"], "value": SECRET_VALUE})),
    )?;
    let created = engine.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"secrets": {"API_KEY": "bench"}})),
    )?;
    let id = created["id"]
        .as_str()
        .ok_or(format!("create answered {created}"))?
        .to_string();
    let measured = measure_secrets(engine, &id, net, https, out);
    let _ = engine.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    measured
}

fn measure_secrets(
    engine: &Engine,
    id: &str,
    net: &BenchNet,
    https: &Https,
    out: &mut Vec<Figure>,
) -> Result<String, String> {
    let (label, how) = networking(engine, id);
    if label != "networking on" {
        return Err(format!(
            "the engine's sandboxes have no network here ({how})"
        ));
    }
    // One bundle for both paths: the engine's CA (the swap's certificates) and the bench's
    // (passthrough: the server's own), so that both clients do the same work.
    engine.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/bench-ca.pem", "content": https.ca_pem})),
    )?;
    let r = engine.exec(
        id,
        "cat /etc/ssl/certs/sandbox-mcp-egress-ca.pem /root/bench-ca.pem > /root/trust.pem \
         && printf %s \"$API_KEY\"",
    );
    let standin = r["stdout"].as_str().unwrap_or_default().to_string();
    if r["exit_code"] != 0 || !standin.starts_with("sbxsecret_") {
        return Err(format!("the sandbox has no stand-in or no engine CA: {r}"));
    }
    let ip = net.net_ip;
    let tls = |mode: &str, name: &str, n: u64| {
        probe_inside(
            engine,
            id,
            &format!(
                "{mode} {ip} {HTTPS_PORT} {name} /root/trust.pem {n} \"Authorization:Bearer $API_KEY\""
            ),
        )
    };
    let seen = |name: &str| https.seen.lock().unwrap().get(name).cloned();
    // Once, untimed: the swap delivers the value, passthrough the stand-in.
    let (swapped, passed) = ("api.bench.test", "plain.other.test");
    tls("tls", swapped, 1)?;
    tls("tls", passed, 1)?;
    let value = format!("Bearer {SECRET_VALUE}");
    if seen(swapped).as_deref() != Some(value.as_str()) {
        return Err(format!(
            "through the swap, the server received Authorization {:?}, not the secret's value",
            seen(swapped)
        ));
    }
    if seen(passed) != Some(format!("Bearer {standin}")) {
        return Err(format!(
            "through passthrough, the server received Authorization {:?}, not the stand-in",
            seen(passed)
        ));
    }

    // A warm connection each: request and answer.
    let (swap, pass) = interleaved(10, |swap| {
        probe_ms(&tls("tls", if swap { swapped } else { passed }, 50)?)
    })?;
    let (swap, pass) = (swap.concat(), pass.concat());
    let warm_added = median_p95(&swap).0 - median_p95(&pass).0;
    out.push(figure(
        "Secrets: request on a warm connection, through the swap",
        "ms",
        swap,
        None,
        "GET with Authorization: Bearer $API_KEY to api.bench.test (a bound secret's host) on \
         a kept-alive TLS connection; send to the whole answer",
    ));
    out.push(figure(
        "Secrets: the same request on a warm TLS passthrough connection",
        "ms",
        pass,
        None,
        "to plain.other.test (no secret names it), same sandbox, same client; blocks of 50 \
         alternating with the above",
    ));
    out.push(Figure {
        name: "Secrets: latency the swap adds on a warm connection (p50 difference)".into(),
        unit: "ms",
        median: warm_added,
        p95: f64::NAN,
        target: Some((1.0, "≤ 1 ms")),
        note: "medians of the two series above".into(),
    });

    // A new connection to a host name not seen before: the swap mints its certificate.
    let mut round = 0;
    let (swap, pass) = interleaved(10, |swap| {
        round += 1;
        let names = if swap {
            format!("n{round}-@.bench.test")
        } else {
            format!("p{round}-@.other.test")
        };
        probe_ms(&tls("tlsnew", &names, 20)?)
    })?;
    if seen("n1-1.bench.test").as_deref() != Some(value.as_str()) {
        return Err("a new host's first request did not get the secret's value".into());
    }
    let (swap, pass) = (swap.concat(), pass.concat());
    let first_added = median_p95(&swap).0 - median_p95(&pass).0;
    out.push(figure(
        "Secrets: first connection to a new host, through the swap (certificate minted)",
        "ms",
        swap,
        None,
        "connect, TLS handshake, one GET with the stand-in, answer; a new name under \
         *.bench.test each time; the engine connects and handshakes upstream and mints a \
         certificate for the name before it answers the sandbox's handshake",
    ));
    out.push(figure(
        "Secrets: first connection through TLS passthrough",
        "ms",
        pass,
        None,
        "the same, a new name under *.other.test each time; blocks of 20 alternating with the \
         above",
    ));
    out.push(Figure {
        name: "Secrets: what the swap adds to a first connection (p50 difference)".into(),
        unit: "ms",
        median: first_added,
        p95: f64::NAN,
        target: None,
        note: "medians of the two series above".into(),
    });

    // 100 MiB up, on a warm connection.
    let (swap, pass) = interleaved(9, |swap| {
        let got = tls("tlsup", if swap { swapped } else { passed }, UPLOAD)?;
        let secs = transfer_secs(&got, UPLOAD).map_err(|e| format!("an upload {e}"))?;
        Ok(UPLOAD as f64 / secs / 1e6)
    })?;
    let shares: Vec<f64> = swap.iter().zip(&pass).map(|(s, p)| s / p * 100.0).collect();
    for (round, (s, p)) in swap.iter().zip(&pass).enumerate() {
        eprintln!("100 MiB up, round {round}: swap {s:.0} MB/s, passthrough {p:.0} MB/s");
    }
    out.push(figure(
        "Secrets: 100 MiB upload through the swap",
        "MB/s",
        swap,
        None,
        "POST of 104857600 bytes with the stand-in in Authorization, on a warm connection; \
         first byte sent to the answer; the engine scans the body for stand-ins on the way; \
         1 MB = 10⁶ bytes",
    ));
    out.push(figure(
        "Secrets: the same upload through TLS passthrough",
        "MB/s",
        pass,
        None,
        "same client, same server; rounds alternating with the above",
    ));
    out.push(figure(
        "Secrets: swap ÷ passthrough, 100 MiB upload",
        "%",
        shares,
        None,
        "swap rate ÷ passthrough rate of each round's pair of uploads",
    ));

    Ok(format!(
        "The test internet above also serves HTTPS/1.1 with keep-alive on port {HTTPS_PORT} (a \
         Rust server of the bench's: rustls, a certificate for `*.bench.test` and `*.other.test` \
         from a CA made for the run, given to the engine with `--egress-ca`), reading each \
         request's body and answering `200 ok`. The operator's secret `bench` (hosts \
         `*.bench.test`) is bound to a sandbox of its own as `API_KEY`. In it, the probe's TLS \
         modes (Python's `ssl`, trusting the engine's CA and the bench's from one file) connect \
         to the server's address with a server name: under `*.bench.test` the engine decrypts, \
         swaps the stand-in for the value and talks TLS to the server itself; under \
         `*.other.test` the connection passes through the relay untouched. Both send \
         `Authorization: Bearer $API_KEY` (checked once, untimed: the server received the value \
         through the swap and the stand-in through passthrough). Both paths go through the \
         relay, which reads the first bytes of every connection of a sandbox with a secret \
         bound. Passthrough is the baseline: the difference is the swap's own cost.\n"
    ))
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
    md.push_str("All figures come from one run on a shared machine; compare medians and ratios, not single samples. \
                 p95 is the slow tail: for times the 95th percentile, for rates the rate 95% of runs reach.\n\n");
    md.push_str("| Figure | Median | p95 | Target | Notes |\n|---|---:|---:|---|---|\n");
    for f in figures {
        let fmt = |v: f64| {
            if v.is_nan() {
                "—".to_string()
            } else if f.unit == "%" {
                format!("{v:.1} %")
            } else if v >= 100.0 {
                format!("{v:.0} {}", f.unit)
            } else {
                format!("{v:.3} {}", f.unit)
            }
        };
        let target = match f.target {
            Some((limit, label)) => {
                let met = if higher_is_better(f.unit) {
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
    // First, on an engine of its own: the sandboxes the other figures kill leave the kernel
    // tearing down their network namespaces for a while, which the transfers would feel.
    let mut network = Vec::new();
    let network_section = network_figures(&mut network);
    let engine = Engine::start();
    let side_by_side = mcp_figures(&engine, &mut figures, with_peer);
    http_figures(&engine, &mut figures);
    engine_figures(&engine, &mut figures);
    idle_memory(&engine, &mut figures);
    drop(engine);
    template_figures(&mut figures);
    let forks_section = fork_figures(&mut figures);
    let desktop_section = desktop_figures(&mut figures);
    let kubernetes_section = kubernetes_figures(&mut figures);
    // In the table, after the engine's own figures.
    figures.append(&mut network);
    (
        figures,
        side_by_side + &network_section + &forks_section + &desktop_section + &kubernetes_section,
    )
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
    let only = std::env::var("SANDBOX_MCP_BENCH_ONLY").unwrap_or_default();
    if ["network", "templates", "forks", "desktop", "kubernetes"].contains(&only.as_str()) {
        let mut figures = Vec::new();
        let section = match only.as_str() {
            "network" => network_figures(&mut figures),
            "templates" => template_figures(&mut figures),
            "desktop" => desktop_figures(&mut figures),
            "kubernetes" => kubernetes_figures(&mut figures),
            _ => fork_figures(&mut figures),
        };
        eprintln!("{}", render(&figures, &section));
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
