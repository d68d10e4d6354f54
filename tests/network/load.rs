//! Load: a connection flood hits the cap while the engine stays responsive, and egress throughput
//! is measured against the host's.

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::{engine_for, log, py};

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
