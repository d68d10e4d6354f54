//! The MCP layer over Streamable HTTP: 50 concurrent sessions, each calling a tool in a loop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::figures::{Figure, figure, ms, percentile};
use crate::servers::{Engine, KEY, bin};

/// `sandbox-mcp serve --http` on a free port, with one tenant key: in front of an engine process
/// of its own, or serving its own engine (no `SANDBOX_MCP_URL`, the default deployment).
struct HttpMcp {
    child: Child,
    url: String,
    token: String,
    /// The engine's API (where the sandboxes are made) and its key.
    engine_url: String,
    engine_key: String,
    _dir: tempfile::TempDir,
}

impl HttpMcp {
    fn start(engine: Option<&Engine>) -> HttpMcp {
        let dir = tempfile::Builder::new()
            .prefix("smcph")
            .tempdir_in("/tmp")
            .unwrap();
        let data = dir.path().join("data");
        let keys = Command::new(bin())
            .args(["keys", "create", "--tenant", "bench"])
            .env("SANDBOX_MCP_DATA_DIR", &data)
            .output()
            .unwrap();
        let token = String::from_utf8(keys.stdout).unwrap().trim().to_string();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(bin());
        command
            .args([
                "serve",
                "--http",
                &format!("127.0.0.1:{port}"),
                "--rate-limit",
                "0",
            ])
            .env("SANDBOX_MCP_DATA_DIR", &data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match engine {
            Some(engine) => {
                command
                    .env("SANDBOX_MCP_URL", &engine.url)
                    .env("SANDBOX_MCP_API_KEY", KEY);
            }
            // The engine's settings, as `Engine::start` gives its own.
            None => {
                command
                    .env_remove("SANDBOX_MCP_URL")
                    .env("SANDBOX_MCP_MAX_SANDBOXES", "1000")
                    .env("SANDBOX_MCP_IDLE_PAUSE", "0");
            }
        }
        let child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "HTTP MCP server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (engine_url, engine_key) = match engine {
            Some(engine) => (engine.url.clone(), KEY.to_string()),
            // The embedded engine publishes where it listens for other local processes.
            None => loop {
                let published = std::fs::read_to_string(data.join("engine.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok());
                if let Some(e) = published {
                    break (
                        e["url"].as_str().unwrap().to_string(),
                        e["key"].as_str().unwrap().to_string(),
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "the embedded engine did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            },
        };
        HttpMcp {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            token,
            engine_url,
            engine_key,
            _dir: dir,
        }
    }

    /// A call to the engine's API, as the bench tenant.
    fn engine(&self, method: reqwest::Method, path: &str) -> Value {
        self.engine_with(method, path, json!({}))
    }

    fn engine_with(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = Engine::http()
                .request(method.clone(), format!("{}{path}", self.engine_url))
                .bearer_auth(&self.engine_key)
                .header("x-sandbox-tenant", "bench")
                .json(&body)
                .send();
            match r {
                Ok(r) => return r.json().unwrap_or(Value::Null),
                // The embedded engine publishes its address just before it answers.
                Err(e) => assert!(Instant::now() < deadline, "engine: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// POSTs one JSON-RPC message; the response message (from JSON or the SSE stream) and the
    /// session id header.
    async fn post(
        &self,
        client: &reqwest::Client,
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
        let resp = req.send().await.unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        let sid = session_of(resp.headers());
        (message_in(&resp.text().await.unwrap()), sid)
    }

    async fn open_session(&self, client: &reqwest::Client) -> String {
        let (_, sid) = self
            .post(
                client,
                None,
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}),
            )
            .await;
        let sid = sid.unwrap();
        self.post(
            client,
            Some(&sid),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        sid
    }
}

impl Drop for HttpMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The store its own engine mounted (a loop-mounted image off btrfs) goes with the dir.
        sandbox_mcp_linux::disk::release(&self._dir.path().join("data/sandboxes"));
    }
}

/// 50 concurrent sessions over Streamable HTTP, each calling a tool in a loop: first against
/// `serve --http` serving its own engine (the default, and the targets: its calls reach
/// the engine in process), then in front of `engine`, a process of its own (each call crosses
/// loopback to it).
pub(crate) fn http_figures(engine: &Engine, out: &mut Vec<Figure>) {
    load(&HttpMcp::start(None), "", true, out);
    load(
        &HttpMcp::start(Some(engine)),
        ", engine in a process of its own",
        false,
        out,
    );
}

/// The label of the last load: `sandbox_info` on sandboxes each running a background job.
const WITH_JOB: &str = "sandbox_info (each sandbox running a background job)";

fn load(server: &HttpMcp, topology: &str, targets: bool, out: &mut Vec<Figure>) {
    const SESSIONS: usize = 50;
    // Sandboxes belong to the bench tenant; the engine's own key acts for it with the header.
    let ids: Vec<String> = (0..SESSIONS)
        .map(|_| {
            server.engine(reqwest::Method::POST, "/v1/sandboxes")["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for (tool, calls, label) in [
        // Several seconds each: a p99 of a one-second run is mostly its first and last moments.
        ("sandbox_info", 300usize, "sandbox_info"),
        ("sandbox_exec", 60, "sandbox_exec `true`"),
        // A description of a sandbox with no jobs skips asking its agent while nothing has
        // happened in it (`AgentClient::described_jobs`); one with a job asks on every call.
        ("sandbox_info", 300, WITH_JOB),
    ] {
        if label == WITH_JOB {
            for id in &ids {
                let job = server.engine_with(
                    reqwest::Method::POST,
                    &format!("/v1/sandboxes/{id}/exec"),
                    json!({"command": "sleep 600", "background": true}),
                );
                assert!(job["job_id"].is_string(), "{job}");
            }
        }
        // The load: one async runtime of two threads driving every session (one connection
        // each), so that the clients take little of the two cores the servers are measured on.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (samples, wall) = runtime.block_on(async {
            let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(SESSIONS + 1));
            let sessions: Vec<_> = ids
                .iter()
                .map(|id| {
                    let barrier = barrier.clone();
                    async move {
                        sandbox_mcp_api::install_tls();
                        let client = reqwest::Client::builder().no_proxy().build().unwrap();
                        let sid = server.open_session(&client).await;
                        barrier.wait().await;
                        let mut samples = Vec::with_capacity(calls);
                        for i in 0..calls {
                            let mut args = json!({"sandbox_id": id});
                            if tool == "sandbox_exec" {
                                args["command"] = json!("true");
                            }
                            let msg = json!({"jsonrpc": "2.0", "id": i + 2, "method": "tools/call", "params": {"name": tool, "arguments": args}});
                            let started = Instant::now();
                            let (r, _) = server.post(&client, Some(&sid), &msg).await;
                            samples.push(ms(started.elapsed()));
                            assert_ne!(r["result"]["isError"], true, "{r}");
                            assert!(r["result"].is_object(), "{r}");
                        }
                        let _ = client
                            .delete(&server.url)
                            .bearer_auth(&server.token)
                            .header("mcp-session-id", &sid)
                            .send()
                            .await;
                        samples
                    }
                })
                .collect();
            let all = futures::future::join_all(sessions);
            let (samples, start) = tokio::join!(all, async {
                barrier.wait().await;
                Instant::now()
            });
            (samples.concat(), start.elapsed())
        });
        let throughput = samples.len() as f64 / wall.as_secs_f64();
        let p99 = percentile(&mut samples.clone(), 0.99);
        out.push(figure(
            &format!("HTTP MCP: tools/call {label}, {SESSIONS} concurrent sessions{topology}"),
            "ms",
            samples,
            None,
            &format!(
                "latency per call; p99 {p99:.3} ms; Streamable HTTP with bearer auth, SSE responses; {}; the clients: one async runtime of 2 threads, a connection per session",
                if targets {
                    "`serve --http` serving its own engine, reached in process"
                } else {
                    "`serve --http` in front of `sandbox-mcp engine` over loopback"
                }
            ),
        ));
        // The targets for sandbox_info: ≥ 4,000 calls/s and p99 ≤ 25 ms.
        let (rate_target, p99_target) = if label == "sandbox_info" && targets {
            (Some((4000.0, "≥ 4,000 calls/s")), Some((25.0, "≤ 25 ms")))
        } else {
            (None, None)
        };
        out.push(Figure {
            name: format!("HTTP MCP: {label} throughput, {SESSIONS} concurrent sessions{topology}"),
            unit: "calls/s",
            median: throughput,
            p95: f64::NAN,
            target: rate_target,
            note: format!(
                "{} calls in {:.2} s of wall time",
                SESSIONS * calls,
                wall.as_secs_f64()
            ),
        });
        out.push(Figure {
            name: format!(
                "HTTP MCP: {label} p99 latency, {SESSIONS} concurrent sessions{topology}"
            ),
            unit: "ms",
            median: p99,
            p95: f64::NAN,
            target: p99_target,
            note: format!(
                "the 99th percentile of the {} calls above",
                SESSIONS * calls
            ),
        });
        eprintln!("HTTP MCP {label}{topology}: {throughput:.0} calls/s, p99 {p99:.3} ms");
    }
    for id in ids {
        server.engine(reqwest::Method::DELETE, &format!("/v1/sandboxes/{id}"));
    }
}

/// A Streamable HTTP answer's session id header.
fn session_of(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

/// The JSON-RPC response in a Streamable HTTP answer's body: the JSON body itself, or the SSE
/// event that carries it.
fn message_in(text: &str) -> Value {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(text))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .unwrap_or(Value::Null)
}

/// A Streamable HTTP answer: the JSON-RPC response in it and the session id header.
pub(crate) fn reply(resp: reqwest::blocking::Response) -> (Value, Option<String>) {
    let sid = session_of(resp.headers());
    (message_in(&resp.text().unwrap()), sid)
}
