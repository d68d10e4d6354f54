//! Refusals: bad forks, restores and diffs are refused with the fix, and make nothing.

use serde_json::{Value, json};

use crate::common::{TestEngine, api, create, err, ok, sh};
use crate::require_sandboxes;

use super::ids;

/// Bad forks make nothing; snapshots of one sandbox or tenant are not another's.
#[tokio::test]
async fn bad_forks_restores_and_diffs_are_refused_and_make_nothing() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| c.max_sandboxes = 4).await;
    let client = engine.mcp().await;
    let a = create(&client).await;
    let b = create(&client).await;
    let count = |engine: &TestEngine| engine.manager.list(None, &[], None).len();

    // 33 children: refused by the schema the model sees, and by the engine itself.
    let e = err(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": a, "count": 33}),
    )
    .await;
    assert!(e.contains("count"), "{e}");
    let (status, body) = api(
        &engine.url,
        "POST",
        &format!("/v1/sandboxes/{a}/fork"),
        Some(json!({"count": 33})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Past the engine's quota: none made.
    let e = err(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": a, "count": 3}),
    )
    .await;
    assert!(e.contains("at most 4 sandboxes"), "{e}");
    assert_eq!(count(&engine), 2);
    // A paused sandbox forks: the children run, the parent stays paused.
    sh(&client, &a, "echo paused-state > /root/f").await;
    ok(&client, "sandbox_pause", json!({"sandbox_id": a})).await;
    let forked = ok(&client, "sandbox_fork", json!({"sandbox_id": a})).await;
    let kid = ids(&forked).remove(0);
    assert_eq!(sh(&client, &kid, "cat /root/f").await, "paused-state\n");
    let got = ok(&client, "sandbox_info", json!({"sandbox_id": a})).await;
    assert_eq!(got["status"], "paused", "{got}");
    ok(&client, "sandbox_kill", json!({"sandbox_id": kid})).await;

    // Another sandbox's snapshot, another tenant's sandbox, a made-up snapshot.
    let snap = ok(&client, "sandbox_snapshot_create", json!({"sandbox_id": b})).await;
    let snap_id = snap["id"].as_str().unwrap();
    let e = err(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": a, "snapshot_id": snap_id}),
    )
    .await;
    assert!(e.contains(&format!("not a snapshot of sandbox {a}")), "{e}");
    let tenant = |method: &str, path: String, body: Value| {
        engine
            .http()
            .request(method.parse().unwrap(), format!("{}{path}", engine.url))
            .bearer_auth(crate::common::KEY)
            .header("x-sandbox-tenant", "t2")
            .json(&body)
    };
    let r = tenant(
        "POST",
        format!("/v1/sandboxes/{b}/snapshots/{snap_id}/restore"),
        json!({}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    let r = tenant("POST", format!("/v1/sandboxes/{b}/fork"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(count(&engine), 2);
    // The other tenant's own sandbox, naming ours as the second sandbox or snapshot of a diff, a
    // merge or a template: unknown to it, and nothing is made or read.
    let r = tenant("POST", "/v1/sandboxes".into(), json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let theirs = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (path, body) in [
        (
            format!("/v1/sandboxes/{theirs}/diff"),
            json!({"against": b}),
        ),
        (
            format!("/v1/sandboxes/{theirs}/diff"),
            json!({"against": snap_id}),
        ),
        (
            format!("/v1/sandboxes/{theirs}/merge"),
            json!({"source_id": b}),
        ),
        (
            "/v1/templates".to_string(),
            json!({"name": "taken", "from_sandbox": b}),
        ),
    ] {
        let r = tenant("POST", path.clone(), body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            404,
            "{path} {body}: {}",
            r.text().await.unwrap()
        );
    }
    let r = tenant("GET", "/v1/templates/taken".into(), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = tenant("DELETE", format!("/v1/sandboxes/{theirs}"), json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(count(&engine), 2);
    // A made-up snapshot, a malformed `against`, `..`, a self-merge: each refused with the fix.
    let nothing = "snap_00000000000000000000000000";
    for (tool, args, expected) in [
        (
            "sandbox_snapshot_restore",
            json!({"sandbox_id": b, "snapshot_id": nothing}),
            "not a snapshot",
        ),
        (
            "sandbox_diff",
            json!({"sandbox_id": a, "against": nothing}),
            "not found",
        ),
        (
            "sandbox_diff",
            json!({"sandbox_id": a, "against": "nonsense"}),
            "against",
        ),
        (
            "sandbox_diff",
            json!({"sandbox_id": a, "against": b, "path": "/root/../etc"}),
            "..",
        ),
        (
            "sandbox_merge_into",
            json!({"sandbox_id": a, "source_id": a}),
            "same sandbox",
        ),
    ] {
        let e = err(&client, tool, args).await;
        assert!(e.contains(expected), "{tool}: {e}");
    }
    // Names are unique per sandbox.
    ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": a, "name": "x"}),
    )
    .await;
    let e = err(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": a, "name": "x"}),
    )
    .await;
    assert!(e.contains("already has a snapshot named"), "{e}");
}
