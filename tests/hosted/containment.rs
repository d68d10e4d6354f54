//! A hosted server is contained like any sandbox: it reads none of the host's files, sees a
//! stand-in for its secret, cannot reach the engine or the MCP endpoint, and `DELETE` leaves none
//! of its processes behind.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_hosted_server_sees_no_host_file_and_only_a_stand_in_for_its_secret() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let token = hosted.token("alice");
    // A file only the host has.
    let host_only = tempfile::Builder::new()
        .prefix("host-only-")
        .tempfile_in("/tmp")
        .unwrap();
    std::fs::write(host_only.path(), "the host's private notes").unwrap();
    let mut fs = reference_registration("filesystem");
    fs["command"] = json!([server_program("mcp-server-filesystem").unwrap(), "/"]);
    hosted.register_ok(None, "fs-root", fs).await;
    let client = hosted.connect("fs-root", &token).await;
    let r = tool(
        client.peer(),
        "read_text_file",
        json!({"path": host_only.path()}),
    )
    .await;
    assert!(
        !said(&r).contains("the host's private notes"),
        "{}",
        said(&r)
    );
    assert_eq!(r.is_error, Some(true), "{}", said(&r));
    client.cancel().await.unwrap();

    // A secret: the server's variable holds a stand-in, never the value.
    let status = hosted
        .http()
        .put(format!("{}/v1/secrets/api-token", hosted.engine.url))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "alice")
        .json(&json!({"value": "real-secret-value-123456", "hosts": ["api.example.test"]}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    let mut everything = reference_registration("everything");
    everything["secrets"] = json!({"API_TOKEN": "api-token"});
    everything["env_vars"] = json!({"PLAIN": "visible"});
    hosted
        .register_ok(Some("alice"), "everything", everything)
        .await;
    let client = hosted.connect("everything", &token).await;
    let r = tool(client.peer(), "get-env", json!({})).await;
    let env = said(&r);
    assert!(env.contains("API_TOKEN"), "{env}");
    assert!(
        !env.contains("real-secret-value-123456"),
        "the secret's value reached the server: {env}"
    );
    assert!(env.contains("visible"), "{env}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hosted_server_cannot_reach_the_engine_or_the_mcp_endpoint() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let token = hosted.token("alice");
    let mut fetch = reference_registration("fetch");
    // Even asked for: loopback is the sandbox's own, and the host is never a destination.
    fetch["allow_out"] = json!(["127.0.0.1/32"]);
    hosted.register_ok(None, "fetch", fetch).await;
    let client = hosted.connect("fetch", &token).await;
    let engine_port = hosted.engine.url.rsplit(':').next().unwrap().to_string();
    let mcp_port = hosted.server.addr.port().to_string();
    for url in [
        format!("http://127.0.0.1:{engine_port}/v1/health"),
        format!("http://127.0.0.1:{mcp_port}/servers/fetch/mcp"),
        format!("http://localhost:{mcp_port}/mcp"),
    ] {
        let r = tool(client.peer(), "fetch", json!({"url": url, "raw": true})).await;
        assert_eq!(r.is_error, Some(true), "{url}: {}", said(&r));
        assert!(!said(&r).contains("\"status\""), "{url}: {}", said(&r));
    }
    client.cancel().await.unwrap();
}

/// The host's own address, asked for by name in `allow_out`: a server listening there (as an
/// engine or MCP endpoint on a non-loopback address would) never gets a connection.
#[tokio::test(flavor = "multi_thread")]
async fn a_hosted_server_cannot_reach_the_hosts_own_address() {
    crate::require_reference_servers!();
    let net = crate::require_testnet!();
    let hosted = Hosted::start(Some(&net)).await;
    let token = hosted.token("alice");
    let listener = std::net::TcpListener::bind((net.host_ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let mut fetch = reference_registration("fetch");
    fetch["allow_out"] = json!([format!("{}/32", net.host_ip)]);
    hosted.register_ok(None, "fetch", fetch).await;
    let client = hosted.connect("fetch", &token).await;
    let url = format!("http://{}:{port}/", net.host_ip);
    let r = tool(client.peer(), "fetch", json!({"url": url, "raw": true})).await;
    assert_eq!(r.is_error, Some(true), "{url}: {}", said(&r));
    assert!(
        listener.accept().is_err(),
        "a connection from the hosted server reached the host's {url}"
    );
    client.cancel().await.unwrap();
}

/// Processes on this machine whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let needle = marker.as_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_and_eviction_leave_no_process_behind() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let token = hosted.token("alice");
    let marker = format!("HOSTED_MARKER=m{}", std::process::id());
    let mut memory = reference_registration("memory");
    memory["env_vars"] = json!({"HOSTED_MARKER": marker.trim_start_matches("HOSTED_MARKER=")});
    memory["idle_timeout_seconds"] = json!(10);
    hosted.register_ok(None, "memory", memory).await;
    let deleted = hosted.connect("memory", &token).await;
    let evicted = hosted.connect("memory", &token).await;
    let _ = tool(deleted.peer(), "read_graph", json!({})).await;
    let _ = tool(evicted.peer(), "read_graph", json!({})).await;
    assert_eq!(
        processes_with(&marker).len(),
        2,
        "two sessions, two server processes"
    );
    deleted.cancel().await.unwrap();
    hosted
        .wait_until("the deleted session's process is gone", || {
            processes_with(&marker).len() == 1
        })
        .await;
    // The other goes when idle past its timeout.
    hosted
        .wait_until("the idle session's process is gone", || {
            processes_with(&marker).is_empty()
        })
        .await;
    drop(evicted);
}
