//! Rules and flags: bad rules and bad network flags are refused, saying how to write them.

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;

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
