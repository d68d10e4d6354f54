//! An unprivileged engine filters the same way, and serves previews.

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::{FETCH, create_with, log, py, pypi_only};

/// Run as an ordinary user, the engine cannot make a namespace the sandbox does not own, so the
/// agent steers its own namespace to the engine and hands it the sockets: the same filtered
/// network as root (names, allowlists, forbidden ranges, the log), and previews through the
/// agent. What root inside such a sandbox can do beyond root's sandboxes — flush those rules —
/// only takes its own network away (it has no route out either way): tried last.
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
    let (engine, client) = unprivileged_engine(
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
    let app = include_str!("../fixtures/preview_app.py");
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

    // Root inside tries to flush the rules that steer its traffic to the engine (it owns this
    // namespace, which it does not under a root engine). Refused (it has no CAP_NET_ADMIN), the
    // rules hold: the test internet through the relay, the host and a private range not at all.
    // Flushed, it has taken its own network away: nothing is reached.
    let flushed = exec(&client, &id, "nft flush ruleset 2>&1; echo flushed $?").await;
    let flushed = flushed["stdout"].as_str().unwrap().contains("flushed 0");
    let out = py(
        &client,
        &id,
        &format!(
            r#"import socket
for ip, port in (("{net}", 80), ("{host}", 80), ("10.0.0.1", 80)):
    try:
        s = socket.create_connection((ip, port), timeout=3)
        s.sendall(b"GET / HTTP/1.0\r\nHost: pypi.test\r\n\r\n")
        print(ip, s.recv(12)[9:12].decode() or "closed")
    except OSError as e:
        print(ip, "unreachable", e.errno)
"#,
            net = net.net_ip,
            host = net.host_ip,
        ),
    )
    .await;
    // 200 is the server's answer; the engine's refusal is a 403.
    let served = |ip: &str| out.contains(&format!("{ip} 200"));
    assert_eq!(
        served(&net.net_ip.to_string()),
        !flushed,
        "flushed: {flushed}; {out}"
    );
    assert!(
        !served(&net.host_ip.to_string()),
        "the host's own address: {out}"
    );
    assert!(!served("10.0.0.1"), "a private range: {out}");
    drop(engine);
}
