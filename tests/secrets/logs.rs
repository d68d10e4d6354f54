//! The engine's log holds no credential at its most verbose: an engine process at
//! `RUST_LOG=trace` swaps a secret in, has its value reflected back and cut, serves a private
//! preview, and is called with its key; its stderr holds none of the value, the key or the
//! preview's token.

use std::io::{Read, Seek};

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::VALUE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_line_holds_a_secret_a_key_or_a_token() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let data = tempfile::tempdir_in("/tmp").unwrap();
    let mut log = tempfile::tempfile().unwrap();
    let (dns, allow) = (net.dns.to_string(), format!("{}/32", net.net_ip));
    let ca = net.ca_pem().display().to_string();
    let preview_port = sandbox_mcp_testkit::engine::free_port();
    let preview_listen = format!("127.0.0.1:{preview_port}");
    let (mut child, url) = spawn_engine_logged(
        data.path(),
        &[
            ("RUST_LOG", "trace"),
            ("SANDBOX_MCP_DNS_UPSTREAM", &dns),
            ("SANDBOX_MCP_EGRESS_ALLOW", &allow),
            ("SANDBOX_MCP_EGRESS_CA", &ca),
            ("SANDBOX_MCP_PREVIEW_LISTEN", &preview_listen),
        ],
        log.try_clone().unwrap().into(),
    )
    .await;
    let (status, body) = api(
        &url,
        "PUT",
        "/v1/secrets/example",
        Some(json!({"hosts": ["api.example.test"], "value": VALUE})),
    )
    .await;
    assert!(status < 300, "{body}");
    let (status, made) = api(
        &url,
        "POST",
        "/v1/sandboxes",
        Some(json!({"secrets": {"API_KEY": "example"}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let exec = |command: &str| {
        let (url, id) = (url.clone(), id.clone());
        let command = command.to_string();
        async move {
            let (status, out) = api(
                &url,
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": command})),
            )
            .await;
            assert_eq!(status, 200, "{out}");
            out
        }
    };
    // The swap, and the value handed back by the host (cut before it reaches the sandbox).
    let sent = exec(
        "curl -sS -H \"Authorization: Bearer $API_KEY\" https://api.example.test/record; printf %s \"$API_KEY\"",
    )
    .await;
    let standin = sent["stdout"].as_str().unwrap().to_string();
    assert!(standin.contains("sbxsecret_"), "{sent}");
    exec("curl -sS -H \"Authorization: Bearer $API_KEY\" 'https://api.example.test/reflect?how=json'")
        .await;
    let recorded = net.recorded();
    assert!(
        recorded.iter().any(|r| r.to_string().contains(VALUE)),
        "the swap did not happen: {recorded:?}"
    );
    // A private preview, opened with its token in the header and in the query.
    let (status, preview) = api(
        &url,
        "POST",
        &format!("/v1/sandboxes/{id}/previews"),
        Some(json!({"port": 8000})),
    )
    .await;
    assert!(status < 300, "{preview}");
    let token = preview["token"].as_str().unwrap().to_string();
    let preview_url = preview["url"].as_str().unwrap().to_string();
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let host = reqwest::Url::parse(&preview_url).unwrap();
    let host = host.host_str().unwrap().to_string();
    for query in ["", &format!("?preview_token={token}")] {
        let r = http
            .get(format!("http://{preview_listen}/{query}"))
            .header("host", format!("{host}:{preview_port}"))
            .header("x-preview-token", &token)
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 403, "the token was refused");
    }
    api(&url, "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    let _ = child.kill();
    let _ = child.wait();
    let mut said = String::new();
    log.rewind().unwrap();
    log.read_to_string(&mut said).unwrap();
    assert!(
        said.lines().count() > 100,
        "a trace log was expected:\n{said}"
    );
    for (what, credential) in [
        ("the secret's value", VALUE),
        ("the engine's key", KEY),
        ("the preview's token", token.as_str()),
    ] {
        if let Some(line) = said.lines().find(|l| l.contains(credential)) {
            panic!("{what} is in the engine's log: {line}");
        }
    }
    kill_left_behind(data.path());
}
