//! What a fork carries over and a restore keeps: egress rules, secret bindings, environment and
//! preview URLs.

use serde_json::json;

use crate::common::{TestEngine, api, ok, sh, snapshot_and_restore};
use crate::require_sandboxes;

use super::ids;

/// What the tools say a fork carries over and a restore keeps: egress rules, secret bindings
/// (a child gets its own stand-in), environment and preview URLs.
#[tokio::test]
async fn forks_and_restores_keep_rules_secrets_environment_and_previews() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (status, made) = api(
        &engine.url,
        "POST",
        "/v1/sandboxes",
        Some(json!({"env_vars": {"MARK": "kept"}, "network": {"allow_out": ["example.test"]}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let (status, secret) = api(
        &engine.url,
        "PUT",
        "/v1/secrets/tok",
        Some(json!({"hosts": ["api.example.test"], "value": "the-value"})),
    )
    .await;
    assert!((200..300).contains(&status), "{secret}");
    ok(
        &client,
        "sandbox_attach_secret",
        json!({"sandbox_id": id, "env": "TOKEN", "secret": "tok"}),
    )
    .await;
    let preview = ok(
        &client,
        "sandbox_preview_create",
        json!({"sandbox_id": id, "port": 8000}),
    )
    .await;
    let standin = sh(&client, &id, "echo $MARK $TOKEN").await;

    let kid = ids(&ok(&client, "sandbox_fork", json!({"sandbox_id": id})).await).remove(0);
    let (parent, child) = (
        ok(&client, "sandbox_info", json!({"sandbox_id": id})).await,
        ok(&client, "sandbox_info", json!({"sandbox_id": kid})).await,
    );
    assert_eq!(child["network"], parent["network"], "{child}");
    assert_eq!(
        child["secrets"],
        json!([{"env": "TOKEN", "secret": "tok"}]),
        "{child}"
    );
    let child_env = sh(&client, &kid, "echo $MARK $TOKEN").await;
    assert!(child_env.starts_with("kept "), "{child_env}");
    assert!(
        !child_env.contains("the-value"),
        "the value never enters a sandbox"
    );
    assert_ne!(child_env, standin, "a child gets its own stand-in");

    snapshot_and_restore(&client, &id).await;
    let after = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(after["network"], parent["network"]);
    assert_eq!(after["secrets"], parent["secrets"]);
    assert_eq!(sh(&client, &id, "echo $MARK $TOKEN").await, standin);
    let previews = ok(&client, "sandbox_preview_list", json!({"sandbox_id": id})).await;
    assert_eq!(previews["previews"][0]["url"], preview["url"], "{previews}");
}
