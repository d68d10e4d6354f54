//! Sandbox networking against a test internet (`testnet`): real DNS, HTTP, HTTPS and TCP on
//! addresses of a namespace the test makes, through the real engine and the real MCP server.
//! The engine asks the test internet's resolver and the operator opens only its server's
//! address (`--egress-allow`), so the host end of the veth stays "this host's own address".

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;
use crate::testnet::TestNet;

/// An engine whose sandboxes resolve through `net` and may reach its server.
async fn engine_for(
    net: &TestNet,
    adjust: impl FnOnce(&mut sandbox_mcp_model::config::EngineConfig),
) -> TestEngine {
    let dns = net.dns;
    let allow = format!("{}/32", net.net_ip);
    TestEngine::start_with(move |c| {
        c.network.dns_upstream = vec![dns];
        c.network.egress_allow = vec![allow];
        adjust(c);
    })
    .await
}

/// Runs Python in the sandbox; returns stdout (the script may fail: its output says how).
async fn py(client: &McpClient, id: &str, code: &str) -> String {
    let r = ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": format!("python3 - <<'EOF'\n{code}\nEOF"), "timeout_ms": 60000}),
    )
    .await;
    format!(
        "{}{}",
        r["stdout"].as_str().unwrap_or(""),
        r["stderr"].as_str().unwrap_or("")
    )
}

/// A fetch from inside the sandbox: `STATUS BODY` or `ERROR why`.
const FETCH: &str = r#"
import sys, urllib.request, urllib.error
def fetch(url, host=None):
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return f"{r.status} {r.read().decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode(errors='replace')}"
    except Exception as e:
        return f"ERROR {e}"
"#;

/// A strict allowlist: pypi.test and nothing else.
fn pypi_only() -> Value {
    json!({"allow_out": ["pypi.test"], "deny_out": ["0.0.0.0/0"]})
}

/// Puts the test internet's CA in the sandbox as /root/ca.pem.
async fn put_ca(client: &McpClient, id: &str, net: &TestNet) {
    let pem = std::fs::read_to_string(net.ca_pem()).unwrap();
    ok(
        client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/ca.pem", "content": pem}),
    )
    .await;
}

/// Creates a sandbox with these egress rules; returns its id.
async fn create_with(client: &McpClient, network: Value) -> String {
    let sandbox = ok(client, "sandbox_create", json!({"network": network})).await;
    sandbox["id"].as_str().unwrap().to_string()
}

async fn log(client: &McpClient, id: &str, extra: Value) -> Vec<Value> {
    let mut args = json!({"sandbox_id": id, "limit": 200});
    args.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let page = ok(client, "sandbox_network_log", args).await;
    page["entries"].as_array().unwrap().clone()
}

#[tokio::test]
async fn open_egress_reaches_names_over_http_and_https_and_logs_the_bytes() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(
        info["network"],
        json!({"allow_out": [], "deny_out": [], "default": "open", "mode": "filtered"})
    );
    put_ca(&client, &id, &net).await;
    let out = py(
        &client,
        &id,
        &format!(
            "{FETCH}\nprint(fetch('http://pypi.test/'))\nprint(len(fetch('http://api.example.test/bytes/100000')))"
        ),
    )
    .await;
    assert!(out.contains("200 hello from pypi.test"), "{out}");
    assert!(
        out.contains("100004"),
        "status, space and 100 000 bytes: {out}"
    );
    let https = sh(
        &client,
        &id,
        "curl -sS --cacert /root/ca.pem https://other.test/ && echo",
    )
    .await;
    assert_eq!(https, "hello from other.test\n");
    // A connection is logged when the engine's relay has seen both sides close, which can be a
    // moment after curl has exited: wait for it (CI once read the log in between).
    let mut entries = log(&client, &id, json!({})).await;
    let begun = std::time::Instant::now();
    while !entries
        .iter()
        .any(|e| e["host"] == "other.test" && e["protocol"] == "tls")
        && begun.elapsed() < std::time::Duration::from_secs(5)
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        entries = log(&client, &id, json!({})).await;
    }
    let find = |host: &str, protocol: &str| {
        entries
            .iter()
            .find(|e| e["host"] == host && e["protocol"] == protocol)
            .unwrap_or_else(|| panic!("no {protocol} entry for {host}: {entries:#?}"))
            .clone()
    };
    let big = find("api.example.test", "http");
    assert_eq!(big["verdict"], "allowed");
    assert_eq!(big["rule"], "default open");
    assert_eq!(big["port"], 80);
    assert_eq!(big["address"], net.net_ip.to_string());
    assert!(big["bytes_received"].as_u64().unwrap() > 100_000, "{big}");
    assert!(big["bytes_sent"].as_u64().unwrap() > 20, "{big}");
    let tls = find("other.test", "tls");
    assert_eq!(
        (tls["verdict"].clone(), tls["port"].clone()),
        (json!("allowed"), json!(443))
    );
    assert_eq!(find("pypi.test", "dns")["verdict"], "allowed");
    // The log is the engine's: readable while the sandbox is frozen.
    ok(&client, "sandbox_pause", json!({"sandbox_id": id})).await;
    assert_eq!(log(&client, &id, json!({})).await.len(), entries.len());
}

#[tokio::test]
async fn an_allowlist_admits_its_names_refuses_the_rest_with_a_reason_and_changes_at_runtime() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let created = ok(&client, "sandbox_create", json!({"network": pypi_only()})).await;
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["network"]["allow_out"], json!(["pypi.test"]));
    let ip = net.net_ip;
    // First, before the sandbox resolved anything: by address, naming an allowed host. The engine
    // connects where its own resolution of that name leads.
    let out = py(
        &client,
        &id,
        &format!("{FETCH}\nprint('N', fetch('http://{ip}/', host='pypi.test'))"),
    )
    .await;
    assert!(out.contains("N 200 hello from pypi.test"), "{out}");
    let script = format!(
        "{FETCH}\nprint('A', fetch('http://pypi.test/'))\nprint('B', fetch('http://other.test/'))\nprint('C', fetch('http://{ip}/', host='other.test'))"
    );
    let out = py(&client, &id, &script).await;
    assert!(out.contains("A 200 hello from pypi.test"), "{out}");
    // The name outside the allowlist does not even resolve.
    assert!(out.contains("B ERROR"), "{out}");
    // By address, the HTTP client is told which rule refused it and how to change it.
    assert!(out.contains("C 403"), "{out}");
    assert!(
        out.contains("deny_out 0.0.0.0/0") && out.contains("sandbox_update"),
        "{out}"
    );

    // TLS is judged by its server name: the allowed one passes, another one at the same address
    // is reset.
    put_ca(&client, &id, &net).await;
    let tls = sh(
        &client,
        &id,
        &format!("curl -sS --cacert ca.pem https://pypi.test/; echo; curl -sS --cacert ca.pem --resolve other.test:443:{ip} https://other.test/ 2>&1; echo rc=$?"),
    )
    .await;
    assert!(tls.starts_with("hello from pypi.test\n"), "{tls}");
    assert!(
        !tls.contains("hello from other.test") && !tls.ends_with("rc=0\n"),
        "{tls}"
    );
    // Any port: a protocol that names no host is judged by the name the sandbox resolved.
    let echo = py(
        &client,
        &id,
        "import socket\ns = socket.create_connection(('pypi.test', 7), timeout=5)\ns.sendall(b'ping')\nprint(s.recv(4))",
    )
    .await;
    assert_eq!(echo, "b'ping'\n");

    // DNS cannot carry data out: a refused name never reaches any resolver.
    let tunnel = exec(&client, &id, "getent hosts c2VjcmV0LWRhdGE.tunnel.test").await;
    assert_ne!(tunnel["exit_code"], 0, "{tunnel}");
    assert!(
        !net.dns_queries()
            .iter()
            .any(|q| q.contains("c2vjcmv0lwrhdge")),
        "the tunnelled name reached the upstream resolver: {:?}",
        net.dns_queries()
    );

    let blocked = log(&client, &id, json!({"verdict": "blocked"})).await;
    assert!(
        blocked
            .iter()
            .any(|e| e["protocol"] == "http" && e["host"] == "other.test"),
        "{blocked:#?}"
    );
    assert!(blocked.iter().all(|e| e["verdict"] == "blocked"));
    assert!(
        blocked
            .iter()
            .any(|e| e["protocol"] == "dns" && e["host"] == "c2vjcmv0lwrhdge.tunnel.test"),
        "{blocked:#?}"
    );

    // A changed policy applies to the next connection, without a restart.
    let updated = ok(
        &client,
        "sandbox_update",
        json!({"sandbox_id": id, "network": {"allow_out": ["pypi.test", "*.test"], "deny_out": ["0.0.0.0/0"]}}),
    )
    .await;
    assert_eq!(
        updated["network"]["allow_out"],
        json!(["pypi.test", "*.test"])
    );
    let out = py(
        &client,
        &id,
        &format!("{FETCH}\nprint('B', fetch('http://other.test/'))"),
    )
    .await;
    assert!(out.contains("B 200 hello from other.test"), "{out}");
    // The rules survive an engine restart with the sandbox.
    let data = engine.stop().await;
    let config = {
        let mut c = TestEngine::config_for(data.path());
        c.network.dns_upstream = vec![net.dns];
        c.network.egress_allow = vec![format!("{}/32", net.net_ip)];
        c
    };
    let engine = TestEngine::start_on(data, config).await;
    let client = engine.mcp().await;
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["network"]["allow_out"], json!(["pypi.test", "*.test"]));
    let out = py(
        &client,
        &id,
        &format!("{FETCH}\nprint('B', fetch('http://other.test/'))"),
    )
    .await;
    assert!(
        out.contains("B 200 hello from other.test"),
        "after a restart: {out}"
    );
}

#[tokio::test]
async fn pip_installs_a_package_by_name_from_the_test_index() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let id = create_with(&client, pypi_only()).await;
    let r = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "timeout_ms": 120000, "command":
            "python3 -m pip install --break-system-packages --no-cache-dir --index-url http://pypi.test/simple/ --trusted-host pypi.test sandboxtestpkg && python3 -c 'import sandboxtestpkg; print(sandboxtestpkg.VALUE)'"}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().ends_with("42\n"), "{r}");
}

#[tokio::test]
async fn forbidden_destinations_stay_unreachable_whatever_the_rules() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    // Even a sandbox that allows everything by name and address.
    let id = create_with(&client, json!({"allow_out": ["*.test", "0.0.0.0/0"]})).await;
    let host = net.host_ip;
    let engine_port = engine.url.rsplit(':').next().unwrap().to_string();
    let out = py(
        &client,
        &id,
        &format!(
            r#"{FETCH}
import socket
for name in ("rebind.test", "private.test", "metadata.test"):
    try:
        print(name, socket.gethostbyname(name))
    except OSError as e:
        print(name, "unresolved")
for url in ("http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://{host}/", "http://127.0.0.2:{engine_port}/v1/health"):
    print(url, fetch(url)[:3])
# A protocol whose server speaks first (the client sends nothing): reset, not left hanging.
s = socket.create_connection(("10.0.0.1", 22), timeout=10)
try:
    print("ssh", s.recv(100) or "closed")
except socket.timeout:
    print("ssh hung")
except OSError as e:
    print("ssh reset", e.errno)
"#
        ),
    )
    .await;
    for name in ["rebind.test", "private.test", "metadata.test"] {
        assert!(out.contains(&format!("{name} unresolved")), "{out}");
    }
    assert!(
        out.contains("169.254.169.254/latest/meta-data/ 403"),
        "{out}"
    );
    assert!(out.contains("http://10.0.0.1/ 403"), "{out}");
    assert!(
        out.contains(&format!("http://{host}/ 403")),
        "the host's own address: {out}"
    );
    assert!(!out.contains("health 200"), "{out}");
    assert!(out.contains("ssh reset 104"), "ECONNRESET, at once: {out}");
    let blocked = log(&client, &id, json!({"verdict": "blocked"})).await;
    let rules: Vec<&str> = blocked.iter().filter_map(|e| e["rule"].as_str()).collect();
    assert!(
        rules.iter().any(|r| r.contains("this host's own address")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.contains("DNS rebinding")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.contains("169.254.0.0/16")),
        "{rules:?}"
    );
}

#[tokio::test]
async fn root_in_the_sandbox_cannot_change_its_network() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let id = create_with(&client, pypi_only()).await;
    let ip = net.net_ip;
    let out = py(
        &client,
        &id,
        &format!(
            r#"{FETCH}
import socket, struct, subprocess
def run(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    print(cmd, "->", r.returncode)
run("ip route add 198.51.100.0/24 dev lo")
run("ip link add dummy0 type dummy")
run("ip addr add 10.9.9.9/32 dev lo")
run("ip link set lo down")
# `nft flush ruleset`, spoken directly: a netfilter batch deleting the steering table.
def nlmsg(kind, flags, body, seq):
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body
name = b"sandbox\0"
attr = struct.pack("=HH", 4 + len(name), 1) + name + b"\0" * (-len(name) % 4)
batch = (nlmsg(0x10, 1, struct.pack("=BBH", 0, 0, socket.htons(10)), 1)
         + nlmsg((10 << 8) | 2, 1 | 4, struct.pack("=BBH", 2, 0, 0) + attr, 2)
         + nlmsg(0x11, 1, struct.pack("=BBH", 0, 0, socket.htons(10)), 3))
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)
    s.send(batch)
    reply = s.recv(4096)
    code = struct.unpack("=i", reply[16:20])[0]
    print("nft delete table ->", code)
except OSError as e:
    print("nft delete table -> refused", e.errno)
for kind in (socket.SOCK_RAW,):
    try:
        socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP); print("raw socket opened")
    except OSError as e:
        print("raw socket refused", e.errno)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("{ip}", 9999)); print("udp sent")
except OSError as e:
    print("udp refused", e.errno)
print("after", fetch("http://pypi.test/")[:3], fetch("http://{ip}/", host="other.test")[:3])
"#
        ),
    )
    .await;
    for cmd in [
        "ip route add 198.51.100.0/24 dev lo",
        "ip link add dummy0 type dummy",
        "ip addr add 10.9.9.9/32 dev lo",
        "ip link set lo down",
    ] {
        assert!(out.contains(&format!("{cmd} ->")), "{out}");
        assert!(
            !out.contains(&format!("{cmd} -> 0")),
            "`{cmd}` succeeded: {out}"
        );
    }
    assert!(!out.contains("nft delete table -> 0\n"), "{out}");
    assert!(out.contains("raw socket refused"), "{out}");
    assert!(
        out.contains("udp refused 1"),
        "other UDP fails at once with EPERM: {out}"
    );
    // The rules still hold.
    assert!(out.contains("after 200 403"), "{out}");
}

#[tokio::test]
async fn bad_rules_are_refused_with_what_to_write() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let e = err(
        &client,
        "sandbox_create",
        json!({"network": {"allow_out": ["not a domain!"]}}),
    )
    .await;
    assert!(
        e.contains("not a domain!") && e.contains("*.github.com"),
        "{e}"
    );
    let e = err(
        &client,
        "sandbox_create",
        json!({"network": {"deny_out": ["example.com"]}}),
    )
    .await;
    assert!(e.contains("not a CIDR"), "{e}");
    // 10 000 rules: the schema caps the list before anything is sent.
    let many: Vec<String> = (0..10_000).map(|i| format!("h{i}.example.com")).collect();
    let e = err(
        &client,
        "sandbox_create",
        json!({"network": {"allow_out": many}}),
    )
    .await;
    assert!(e.contains("256"), "{e}");
    // And the engine itself, for API clients: 300 rules split over both lists.
    let resp = engine
        .http()
        .post(format!("{}/v1/sandboxes", engine.url))
        .header("authorization", format!("Bearer {KEY}"))
        .json(&json!({"network": {
            "allow_out": (0..150).map(|i| format!("h{i}.example.com")).collect::<Vec<_>>(),
            "deny_out": (0..150).map(|i| format!("10.{i}.0.0/16")).collect::<Vec<_>>()}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("at most 256"),
        "{body}"
    );
    // An update with nothing in it says what it needs.
    let id = create(&client).await;
    let e = err(&client, "sandbox_update", json!({"sandbox_id": id})).await;
    assert!(e.contains("metadata") && e.contains("network"), "{e}");
}

#[tokio::test]
async fn a_connection_flood_hits_the_cap_and_the_engine_stays_responsive() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |c| c.network.max_connections = 50).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let ip = net.net_ip;
    let out = py(
        &client,
        &id,
        &format!(
            r#"
import socket, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = 10_500 if hard == resource.RLIM_INFINITY else min(hard, 10_500)
resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
held, ok = [], 0
for i in range(10_000):
    try:
        s = socket.create_connection(("{ip}", 7), timeout=5)
        held.append(s)
    except OSError:
        pass
for s in held:
    try:
        s.settimeout(3)
        s.sendall(b"ping")
        if s.recv(4) == b"ping":
            ok += 1
    except OSError:
        pass
print("echoed", ok)
"#
        ),
    )
    .await;
    let echoed: usize = out
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        echoed > 0 && echoed <= 50,
        "at most the cap of 50 relayed: {out}"
    );
    // The engine answered throughout, and says why the rest were cut.
    ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    let blocked = log(&client, &id, json!({"verdict": "blocked"})).await;
    assert!(
        blocked
            .iter()
            .any(|e| e["rule"].as_str().unwrap().contains("connection cap")),
        "{blocked:#?}"
    );
}

#[test]
fn network_flags_are_checked_and_say_how_to_write_them() {
    for (flag, value, expected) in [
        ("--egress-allow", "10.0.0.0/33", "is not a CIDR"),
        (
            "--dns-upstream",
            "resolver.example",
            "is not a resolver address",
        ),
        ("--egress", "sideways", "open"),
    ] {
        assert_flag_refused_on_both_commands(flag, value, expected);
    }
    // And the environment variables are the same settings, checked before anything starts (a
    // bounded run: were the value accepted, the engine would start serving).
    let data = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("timeout")
        .args(["20", BIN, "engine", "--listen", "127.0.0.1:0"])
        .env("SANDBOX_MCP_DATA_DIR", data.path())
        .env("SANDBOX_MCP_EGRESS_ALLOW", "198.51.100.0/24,bad")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"bad\" is not a CIDR"));
}

/// Not a benchmark (`benches/` has those): a hand-run check of the relay's throughput against
/// the same transfer from the host, on the test internet. Run with
/// `cargo test --release --test all -- --ignored egress_throughput --nocapture`.
#[tokio::test]
#[ignore = "a measurement, run by hand"]
async fn egress_throughput_against_the_host() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let url = "http://pypi.test/bytes/1073741824";
    let format = "%{size_download} %{speed_download}";
    for round in 0..3 {
        let inside = sh(
            &client,
            &id,
            &format!("curl -s -o /dev/null -w '{format}' {url}"),
        )
        .await;
        let host = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", format, "--resolve"])
            .arg(format!("pypi.test:80:{}", net.net_ip))
            .arg(url)
            .output()
            .unwrap();
        let host = String::from_utf8_lossy(&host.stdout).to_string();
        for run in [&inside, &host] {
            assert!(
                run.starts_with("1073741824 "),
                "the whole GiB arrived: {run}"
            );
        }
        let speed = |s: &str| s.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1e9;
        eprintln!(
            "round {round}: relay {:.2} GB/s, host {:.2} GB/s",
            speed(&inside),
            speed(&host)
        );
    }
}

/// Run as an ordinary user, the engine cannot make a namespace the sandbox does not own, so the
/// agent steers its own namespace to the engine and hands it the sockets: the same filtered
/// network as root (names, allowlists, forbidden ranges, the log), and previews through the
/// agent. What root inside such a sandbox can do beyond root's sandboxes — flush those rules —
/// only takes its own network away (it has no route out either way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprivileged_engine_filters_the_same_way_and_serves_previews() {
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to start an engine as another, ordinary user");
        return;
    }
    let net = crate::require_testnet!();
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let (dns, allow) = (net.dns.to_string(), format!("{}/32", net.net_ip));
    let (mut engine, client) = unprivileged_engine(
        dir.path(),
        &[
            "--dns-upstream",
            &dns,
            "--egress-allow",
            &allow,
            "--preview-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    let id = create_with(&client, pypi_only()).await;
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["network"]["mode"], "filtered", "{info}");
    let out = py(
        &client,
        &id,
        &format!(
            "{FETCH}\nprint(fetch('http://pypi.test/')[:3])\nprint(fetch('http://api.example.test/')[:5])\n\
             print(fetch('http://{}/')[:5])",
            net.host_ip
        ),
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"200"), "{out}");
    assert_eq!(
        lines.get(1),
        Some(&"ERROR"),
        "a name outside the allowlist: {out}"
    );
    let verdicts = log(&client, &id, json!({})).await;
    let has = |host: &str, verdict: &str| {
        verdicts
            .iter()
            .any(|e| e["host"] == host && e["verdict"] == verdict)
    };
    assert!(has("pypi.test", "allowed"), "{verdicts:#?}");
    assert!(has("api.example.test", "blocked"), "{verdicts:#?}");
    assert!(
        verdicts
            .iter()
            .any(|e| e["address"] == json!(net.host_ip.to_string())
                && e["verdict"] == "blocked"
                && e["rule"].as_str().unwrap_or("").contains("forbidden")),
        "the host's own address: {verdicts:#?}"
    );

    // A preview: the agent connects for the engine.
    let app = include_str!("fixtures/preview_app.py");
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/app.py", "content": app}),
    )
    .await;
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "python3 /root/app.py 3000 rootless", "background": true}),
    )
    .await;
    sh(
        &client,
        &id,
        "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3000))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1",
    )
    .await;
    let preview = ok(
        &client,
        "sandbox_preview_create",
        json!({"sandbox_id": id, "port": 3000}),
    )
    .await;
    let url = preview["url"].as_str().unwrap();
    let (host, token) = url
        .strip_prefix("http://")
        .unwrap()
        .split_once("/?preview_token=")
        .unwrap();
    let listen: u16 = host.rsplit_once(':').unwrap().1.parse().unwrap();
    let answer = tokio::task::spawn_blocking({
        let (host, token) = (host.to_string(), token.to_string());
        move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", listen)).unwrap();
            write!(
                s,
                "GET / HTTP/1.1\r\nHost: {host}\r\nX-Preview-Token: {token}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            text
        }
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"name\": \"rootless\""), "{answer}");
    let _ = engine.kill();
    let _ = engine.wait();
}
