//! E2B's network options through the door, against the test internet: `denyOut` and `allowOut`
//! at create (a name allowed inside a denied range), what `get_info` reports, and updates that
//! clear the rules or close the network; another tenant cannot change them.

use reqwest::Method as M;
use serde_json::json;

use super::E2bEngine;
use super::doors::{KEYS, control};
use super::envd::{outcome, start_as};
use crate::require_sandboxes;

/// The HTTP status a GET of `url` from inside the sandbox gets.
async fn status_of(engine: &E2bEngine, id: &str, token: &str, url: &str) -> String {
    let cmd = format!("curl -s -m 10 -o /dev/null -w '%{{http_code}}' {url}");
    let (_, frames) = start_as(engine, id, token, Some("root"), &["sh", "-c", &cmd]).await;
    outcome(&frames).0
}

/// A GET the engine refused: under an allowlist another name does not resolve (`000`), or the
/// engine answers for it (`403`).
fn assert_refused(status: &str) {
    assert!(status == "000" || status == "403", "reached: {status}");
}

#[tokio::test]
async fn network_options_become_the_sandboxs_egress_rules() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let (dns, allow) = (net.dns.to_string(), format!("{}/32", net.net_ip));
    let engine = E2bEngine::start_env(
        KEYS,
        &[
            ("SANDBOX_MCP_DNS_UPSTREAM", &dns),
            ("SANDBOX_MCP_EGRESS_ALLOW", &allow),
        ],
    )
    .await;
    // Both names are the test internet's one address: the rules tell them apart by name.
    let made = json!({"templateID": "base", "timeout": 300,
        "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.test"]}});
    let (status, made) = control(&engine, "key-alpha", M::POST, "/sandboxes", Some(made)).await;
    assert_eq!(status, 201, "{made}");
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let token = made["envdAccessToken"].as_str().unwrap().to_string();
    assert_eq!(
        status_of(&engine, &id, &token, "http://pypi.test/").await,
        "200"
    );
    assert_refused(&status_of(&engine, &id, &token, "http://api.example.test/").await);
    let (_, got) = control(
        &engine,
        "key-alpha",
        M::GET,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(
        got["network"],
        json!({"allowOut": ["pypi.test"], "denyOut": ["0.0.0.0/0", "::/0"]})
    );
    // Another tenant's update is refused as if the sandbox did not exist.
    let path = format!("/sandboxes/{id}/network");
    let (status, _) = control(&engine, "key-beta", M::PUT, &path, Some(json!({}))).await;
    assert_eq!(status, 404);
    // An empty update clears the rules; closing the internet denies everything.
    let (status, body) = control(&engine, "key-alpha", M::PUT, &path, Some(json!({}))).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        status_of(&engine, &id, &token, "http://api.example.test/").await,
        "200"
    );
    let closed = json!({"allow_internet_access": false});
    let (status, _) = control(&engine, "key-alpha", M::PUT, &path, Some(closed)).await;
    assert_eq!(status, 204);
    assert_refused(&status_of(&engine, &id, &token, "http://pypi.test/").await);
    // What the engine cannot do the way E2B does is refused, saying so.
    let masked = json!({"maskRequestHost": "x.example.com"});
    let (status, body) = control(&engine, "key-alpha", M::PUT, &path, Some(masked)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("not supported"),
        "{body}"
    );
}
