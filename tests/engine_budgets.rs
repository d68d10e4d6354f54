//! The engine's own budgets against a sandbox that tries to spend them: its memory (relayed
//! connections holding full buffers both ways), its file descriptors (a systemd-sized
//! `RLIMIT_NOFILE`), and its state and log databases (a DNS flood). Each runs an engine process
//! of its own, so that its memory and descriptors can be read from `/proc`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use sandbox_mcp_testkit::procfs::status_kib;

use crate::common::*;
use crate::require_sandboxes;
use crate::testnet::TestNet;

/// An engine process on the test internet, with `configure` applied to its command.
struct Engine {
    child: std::process::Child,
    url: String,
    data: tempfile::TempDir,
}

impl Engine {
    async fn start(net: &TestNet, configure: impl FnOnce(&mut std::process::Command)) -> Engine {
        let data = tempfile::tempdir_in("/tmp").unwrap();
        let (dns, allow) = (net.dns.to_string(), format!("{}/32", net.net_ip));
        let (child, url) = spawn_engine_with(
            data.path(),
            &[
                ("SANDBOX_MCP_DNS_UPSTREAM", &dns),
                ("SANDBOX_MCP_EGRESS_ALLOW", &allow),
            ],
            std::process::Stdio::null(),
            configure,
        )
        .await;
        Engine { child, url, data }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The engine's resident memory, in MiB.
    fn rss_mib(&self) -> f64 {
        status_kib(self.pid(), "VmRSS:").unwrap() as f64 / 1024.0
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    async fn create(&self, tenant: Option<&str>, body: Value) -> (u16, Value) {
        self.call("POST", "/v1/sandboxes", Some(body), tenant).await
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        tenant: Option<&str>,
    ) -> (u16, Value) {
        let http = sandbox_mcp_api::http_builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let mut req = http
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(KEY);
        if let Some(t) = tenant {
            req = req.header("x-sandbox-tenant", t);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn exec(&self, id: &str, command: &str, background: bool) -> Value {
        let (status, r) = self
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": command, "timeout_ms": 120000, "background": background})),
                None,
            )
            .await;
        assert_eq!(status, 200, "{command}: {r}");
        r
    }

    /// Waits for `path` to appear in the sandbox; its content.
    async fn wait_file(&self, id: &str, path: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let r = self
                .exec(id, &format!("cat {path} 2>/dev/null"), false)
                .await;
            let out = r["stdout"].as_str().unwrap_or("").to_string();
            if !out.is_empty() {
                return out;
            }
            assert!(Instant::now() < deadline, "{path} never appeared");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn stop(mut self) {
        let (_, list) = self.call("GET", "/v1/sandboxes", None, None).await;
        for s in list["sandboxes"].as_array().cloned().unwrap_or_default() {
            let id = s["id"].as_str().unwrap();
            self.call("DELETE", &format!("/v1/sandboxes/{id}"), None, None)
                .await;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        kill_left_behind(self.data.path());
    }
}

/// Holds `n` connections to the test internet's TCP echo with full buffers both ways: it
/// sends until the kernel refuses more and never reads, so the echo server blocks on its
/// writes and stops reading too. Writes /tmp/held when done, then holds them.
const HOLD: &str = r#"
import socket, sys, time
n = int(sys.argv[1])
socks = []
for i in range(n):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect(("pypi.test", 7))
    except OSError:
        continue
    s.setblocking(False)
    socks.append(s)
junk = b"x" * 65536
for _ in range(30):
    for s in socks:
        try:
            while True:
                s.send(junk)
        except OSError:
            pass
    time.sleep(0.05)
open("/tmp/held", "w").write(str(len(socks)))
time.sleep(900)
"#;

async fn write_script(engine: &Engine, id: &str, name: &str, text: &str) {
    let (status, r) = engine
        .call(
            "PUT",
            &format!("/v1/sandboxes/{id}/files"),
            Some(json!({"path": name, "content": text})),
            None,
        )
        .await;
    assert!(status == 200 || status == 201, "{r}");
}

/// 512 relayed connections with full buffers both ways used to grow the engine by ~410 MiB
/// (while the sandbox's own cgroup showed 9), and the engine kept 337 MiB after the sandbox
/// was killed. Now each connection starts with small buffers, a sandbox has a few large ones
/// to share, and the memory goes back when the sandbox does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_holding_full_connections_costs_the_engine_little_and_gives_it_back() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = Engine::start(&net, |_| {}).await;
    let (status, made) = engine.create(None, json!({})).await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    write_script(&engine, &id, "/root/hold.py", HOLD).await;
    // A first relayed connection and a settled engine, for the baseline.
    engine
        .exec(&id, "curl -sS -o /dev/null http://pypi.test/", false)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = engine.rss_mib();
    engine.exec(&id, "python3 /root/hold.py 512", true).await;
    let held: usize = engine
        .wait_file(&id, "/tmp/held", Duration::from_secs(240))
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(held >= 500, "only {held} connections were made");
    let mut peak: f64 = 0.0;
    for _ in 0..10 {
        peak = peak.max(engine.rss_mib());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let grown = peak - before;
    eprintln!("engine RSS {before:.1} MiB, holding {held} full connections {peak:.1} MiB");
    assert!(
        grown < 64.0,
        "the engine grew {grown:.1} MiB for {held} connections (before {before:.1}, at peak {peak:.1})"
    );
    // Killed: what the engine held for it goes back.
    let (status, r) = engine
        .call("DELETE", &format!("/v1/sandboxes/{id}"), None, None)
        .await;
    assert_eq!(status, 200, "{r}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = engine.rss_mib();
    while after - before > 16.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = engine.rss_mib();
    }
    eprintln!("after the kill: {after:.1} MiB");
    assert!(
        after - before < 16.0,
        "the engine kept {:.1} MiB after the sandbox was killed (before {before:.1}, peak {peak:.1})",
        after - before
    );
    engine.stop().await;
}

/// With the soft and hard `RLIMIT_NOFILE` of 1024 (a systemd service's soft limit, made hard so
/// the engine cannot raise it), one sandbox's connections used to exhaust the engine: other
/// sandboxes' commands and creates failed, and so did the attacker's kill. Now sandbox traffic
/// gets a budget, a sandbox at most half of it, and the engine's own work keeps a reserve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_spend_the_engines_descriptors() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = Engine::start(&net, |c| {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            c.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 1024,
                    rlim_max: 1024,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    })
    .await;
    let (_, attacker) = engine.create(None, json!({})).await;
    let attacker = attacker["id"].as_str().unwrap().to_string();
    let (_, bystander) = engine.create(Some("t2"), json!({})).await;
    let bystander = bystander["id"].as_str().unwrap().to_string();
    write_script(&engine, &attacker, "/root/hold.py", HOLD).await;
    engine
        .exec(&attacker, "python3 /root/hold.py 900", true)
        .await;
    engine
        .wait_file(&attacker, "/tmp/held", Duration::from_secs(240))
        .await;
    let fds = engine.open_fds();
    eprintln!("engine descriptors with the attacker at its cap: {fds}");
    assert!(fds < 900, "the engine holds {fds} of its 1024 descriptors");
    // Everything else still works: another tenant's commands and connections, a create, and
    // the attacker's kill.
    let (status, r) = engine
        .call(
            "POST",
            &format!("/v1/sandboxes/{bystander}/exec"),
            Some(json!({"command": "echo alive; curl -sS http://pypi.test/ | head -c 10"})),
            Some("t2"),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "alive\nhello from", "{r}");
    let (status, r) = engine.create(None, json!({})).await;
    assert_eq!(status, 201, "{r}");
    let (status, log) = engine
        .call(
            "GET",
            &format!("/v1/sandboxes/{attacker}/network/log?verdict=blocked"),
            None,
            None,
        )
        .await;
    assert_eq!(status, 200, "{log}");
    assert!(log.to_string().contains("connection cap"), "{log}");
    let (status, r) = engine
        .call("DELETE", &format!("/v1/sandboxes/{attacker}"), None, None)
        .await;
    assert_eq!(status, 200, "the attacker's kill: {r}");
    engine.stop().await;
}

/// Floods the sandbox's resolver with queries for random names, from two processes, for 8 s.
const FLOOD: &str = r#"
import os, random, socket, struct, sys, time
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
end = time.time() + 8
sent = 0
while time.time() < end:
    labels = [os.urandom(6).hex(), "tunnel", "test"]
    q = struct.pack(">HHHHHH", random.getrandbits(16), 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in labels) + b"\0" + struct.pack(">HH", 1, 1)
    try:
        s.sendto(q, (ns, 53))
        sent += 1
    except OSError:
        pass
    try:
        while True:
            s.recv(512)
    except OSError:
        pass
open("/tmp/flood.%d" % os.getpid(), "w").write("%d\n" % sent)
"#;

/// ~1.4 million refused DNS queries in 10 s from one sandbox used to grow the engine to
/// 268 MiB, make another tenant's network log take 18 s, and fail a create with "database is
/// locked". Now the flood costs the flooding sandbox: its queries and log rows beyond a rate
/// are dropped and counted, and the log has a database of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_flood_costs_only_the_flooding_sandbox() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = Engine::start(&net, |_| {}).await;
    let (_, flooder) = engine
        .create(
            None,
            json!({"network": {"allow_out": ["pypi.test"], "deny_out": ["0.0.0.0/0"]}}),
        )
        .await;
    let flooder = flooder["id"].as_str().unwrap().to_string();
    let (_, other) = engine.create(Some("t2"), json!({})).await;
    let other = other["id"].as_str().unwrap().to_string();
    let (status, r) = engine
        .call(
            "POST",
            &format!("/v1/sandboxes/{other}/exec"),
            Some(json!({"command": "curl -sS -o /dev/null http://pypi.test/"})),
            Some("t2"),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    write_script(&engine, &flooder, "/root/flood.py", FLOOD).await;
    let before = engine.rss_mib();
    engine
        .exec(
            &flooder,
            "python3 /root/flood.py & python3 /root/flood.py & wait",
            true,
        )
        .await;
    // During the flood: the other tenant's log reads, and creates, answer.
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut peak: f64 = 0.0;
    while started.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        let (status, log) = engine
            .call(
                "GET",
                &format!("/v1/sandboxes/{other}/network/log"),
                None,
                Some("t2"),
            )
            .await;
        slowest = slowest.max(t.elapsed());
        assert_eq!(status, 200, "{log}");
        assert!(!log["entries"].as_array().unwrap().is_empty(), "{log}");
        peak = peak.max(engine.rss_mib());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, made) = engine.create(Some("t2"), json!({})).await;
    assert_eq!(status, 201, "a create during the flood: {made}");
    let sent: u64 = {
        let out = engine
            .exec(&flooder, "sleep 1; cat /tmp/flood.*", false)
            .await;
        out["stdout"]
            .as_str()
            .unwrap()
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    };
    eprintln!(
        "{sent} queries in 8 s; slowest log read of another tenant {slowest:?}; engine RSS {before:.1} → {peak:.1} MiB"
    );
    assert!(
        sent > 20_000,
        "the flood was too small to show anything: {sent}"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "another tenant's log read took {slowest:?}"
    );
    assert!(
        peak - before < 64.0,
        "the engine grew {:.1} MiB during the flood",
        peak - before
    );
    // The flooding sandbox's log says what was left out, and how much (every page of it).
    let (mut counted, mut rows, mut cursor) = (0u64, 0usize, String::new());
    loop {
        let (_, log) = engine
            .call(
                "GET",
                &format!("/v1/sandboxes/{flooder}/network/log?limit=200{cursor}"),
                None,
                None,
            )
            .await;
        let entries = log["entries"].as_array().unwrap();
        rows += entries.len();
        counted += entries
            .iter()
            .filter(|e| e["rule"].as_str().unwrap_or("").contains("a flood"))
            .map(|e| e["count"].as_u64().unwrap())
            .sum::<u64>();
        match log["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    eprintln!("the flooder's log: {rows} entries, {counted} queries counted as left out");
    assert!(rows <= 1000);
    assert!(counted > 1000, "{counted} of {sent}");
    engine.stop().await;
}
