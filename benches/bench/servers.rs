//! The binary measured, run as in production: an engine process (`sandbox-mcp engine`) and the
//! stdio MCP server in front of it, with the blocking clients the figures time them through. In
//! A/B mode the binary is whichever build's round it is.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub(crate) const THIS_BUILD: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

/// The binary being measured: this build, or in A/B mode whichever side's round it is.
pub(crate) static BIN: RwLock<&'static str> = RwLock::new(THIS_BUILD);

pub(crate) fn bin() -> &'static str {
    *BIN.read().unwrap()
}

pub(crate) const KEY: &str = "bench-key";

pub(crate) struct Engine {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) _dir: tempfile::TempDir,
}

impl Engine {
    pub(crate) fn start() -> Engine {
        Self::start_with(&[])
    }

    /// An engine with these extra environment variables (its settings: `SANDBOX_MCP_…`).
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Engine {
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

    pub(crate) fn http() -> &'static reqwest::blocking::Client {
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

    pub(crate) fn get(&self, path: &str) -> Result<Value, String> {
        let r = Self::http()
            .get(format!("{}{path}", self.url))
            .bearer_auth(KEY)
            .send()
            .map_err(|e| e.to_string())?;
        r.json().map_err(|e| e.to_string())
    }

    pub(crate) fn send(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, path, body).unwrap()
    }

    /// An engine call whose failure is a figure's reason not to be measured, not a panic.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
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

    pub(crate) fn create(&self) -> String {
        self.send("POST", "/v1/sandboxes", Some(json!({})))["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub(crate) fn exec(&self, id: &str, command: &str) -> Value {
        self.send(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": command, "timeout_ms": 600000})),
        )
    }

    pub(crate) fn kill(&self, id: &str) {
        self.send("DELETE", &format!("/v1/sandboxes/{id}"), None);
    }

    pub(crate) fn status_kib(&self, field: &str) -> u64 {
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
pub(crate) struct Mcp {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: BufReader<ChildStdout>,
    pub(crate) next_id: u64,
}

impl Mcp {
    /// Our server, in front of the engine at `url`.
    pub(crate) fn spawn(url: &str) -> Mcp {
        Self::from_command(Command::new(bin()), url)
    }

    /// The peer: FastMCP serving the same spec against the same engine.
    pub(crate) fn fastmcp(url: &str) -> Mcp {
        let mut cmd = Command::new("python3");
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fastmcp_server.py"));
        Self::from_command(cmd, url)
    }

    pub(crate) fn from_command(mut cmd: Command, url: &str) -> Mcp {
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

    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
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
    pub(crate) fn rss_mib(&self) -> f64 {
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

    pub(crate) fn initialize(&mut self) -> Value {
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

    pub(crate) fn call(&mut self, name: &str, args: Value) -> Value {
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

/// How this engine's sandboxes are networked, read from one of them: a short label for the
/// figure's name, and what it means for its notes.
pub(crate) fn networking(engine: &Engine, id: &str) -> (&'static str, &'static str) {
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
