//! Refusals: bad secrets and other tenants' secrets are refused with the reason.

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;

use super::set_secret;

/// Bad secrets and bad bindings get errors that say what to give; another tenant's secret
/// cannot be bound (it answers like one that does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_secrets_and_other_tenants_secrets_are_refused() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let big = "x".repeat(1 << 20);
    for (body, says) in [
        (json!({"hosts": [], "value": "v"}), "hosts"),
        // The spec's patterns, checked as the body is read: the message names the field.
        (
            json!({"hosts": ["not a host"], "value": "v"}),
            "hosts[0]: doesn't match pattern",
        ),
        (json!({"hosts": ["a.test"], "value": ""}), "value"),
        (json!({"hosts": ["a.test"], "value": big}), "value"),
        (
            json!({"hosts": ["a.test"], "value": "a\nb"}),
            "value: doesn't match pattern",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "format": "Bearer"}),
            "format: doesn't match pattern",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "headers": ["Origin"]}),
            "cannot carry a secret",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "headers": ["Authorization", "Referer"]}),
            "cannot carry a secret",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "headers": []}),
            "headers",
        ),
    ] {
        let r = set_secret(&engine, "s1", body.clone()).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
    }
    let r = set_secret(
        &engine,
        "bad name",
        json!({"hosts": ["a.test"], "value": "v"}),
    )
    .await;
    assert_eq!(r.status(), 400);
    // A secret of tenant t2.
    let r = engine
        .http()
        .put(format!("{}/v1/secrets/theirs", engine.url))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "t2")
        .json(&json!({"hosts": ["a.test"], "value": "t2-value"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let r = set_secret(&engine, "mine", json!({"hosts": ["a.test"], "value": "v"})).await;
    assert!(r.status().is_success());
    let client = engine.mcp().await;
    // The untenanted caller sees only its own, and cannot bind t2's.
    let listed = ok(&client, "secret_list", json!({})).await;
    assert_eq!(listed["secrets"].as_array().unwrap().len(), 1, "{listed}");
    let e = err(
        &client,
        "sandbox_create",
        json!({"secrets": {"K": "theirs"}}),
    )
    .await;
    assert!(e.contains("theirs does not exist"), "{e}");
    let id = create(&client).await;
    for (args, says) in [
        (
            json!({"sandbox_id": id, "env": "K", "secret": "theirs"}),
            "does not exist",
        ),
        (
            json!({"sandbox_id": id, "env": "1BAD", "secret": "mine"}),
            "env",
        ),
    ] {
        let e = err(&client, "sandbox_attach_secret", args.clone()).await;
        assert!(e.contains(says), "{args}: {e}");
    }
    let e = err(
        &client,
        "sandbox_detach_secret",
        json!({"sandbox_id": id, "env": "NOT_BOUND"}),
    )
    .await;
    assert!(e.contains("no secret is bound to NOT_BOUND"), "{e}");
    // At most 32 bindings per sandbox; the 33rd says to detach one.
    for i in 0..32 {
        ok(
            &client,
            "sandbox_attach_secret",
            json!({"sandbox_id": id, "env": format!("K{i}"), "secret": "mine"}),
        )
        .await;
    }
    let e = err(
        &client,
        "sandbox_attach_secret",
        json!({"sandbox_id": id, "env": "K32", "secret": "mine"}),
    )
    .await;
    assert!(e.contains("32 secrets") && e.contains("detach one"), "{e}");
    // The listing of t2 does not show the untenanted secret, nor any value.
    let r: Value = engine
        .http()
        .get(format!("{}/v1/secrets", engine.url))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "t2")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["secrets"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["secrets"][0]["name"], "theirs");
    assert!(!r.to_string().contains("t2-value"));
    // A secret deleted while bound: a fork cannot bind it to the children. That is the
    // sandbox's state, not a bad request (409, with the fix), and the fork makes nothing.
    let r = set_secret(&engine, "gone", json!({"hosts": ["a.test"], "value": "v"})).await;
    assert!(r.status().is_success());
    let bound = create(&client).await;
    ok(
        &client,
        "sandbox_attach_secret",
        json!({"sandbox_id": bound, "env": "GONE", "secret": "gone"}),
    )
    .await;
    let (status, _) = api(&engine.url, "DELETE", "/v1/secrets/gone", None).await;
    assert!((200..300).contains(&status), "{status}");
    let before = engine.manager.list(None, &[], None).len();
    let fork = format!("/v1/sandboxes/{bound}/fork");
    let (status, body) = api(&engine.url, "POST", &fork, Some(json!({"count": 2}))).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("sandbox_detach_secret"),
        "{body}"
    );
    assert_eq!(engine.manager.list(None, &[], None).len(), before);
    ok(
        &client,
        "sandbox_detach_secret",
        json!({"sandbox_id": bound, "env": "GONE"}),
    )
    .await;
    let (status, body) = api(&engine.url, "POST", &fork, Some(json!({"count": 1}))).await;
    assert!((200..300).contains(&status), "{status}: {body}");
}
