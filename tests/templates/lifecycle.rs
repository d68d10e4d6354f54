//! A template's life: a captured sandbox becomes one (and caps the shapes made from it), templates
//! survive a restart and one can be the default, and a warm pool hands out fresh sandboxes.

use serde_json::{Value, json};

use crate::common::{TestEngine, api, create, err, ok, sh};
use crate::require_sandboxes;

use super::{layers, sandbox_dirs, sandbox_from, wait_built, wait_dirs};

#[tokio::test]
async fn a_captured_sandbox_becomes_a_template_and_shapes_are_capped_by_it() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let src = create(&client).await;
    sh(
        &client,
        &src,
        "mkdir -p /srv/app && echo state > /srv/app/data && rm /etc/hostname",
    )
    .await;
    let t = ok(
        &client,
        "sandbox_template_create",
        json!({"name": "snap", "from_sandbox": src, "shape": {"memory_mb": 256, "max_pids": 64}}),
    )
    .await;
    assert_eq!(t["status"], "ready", "{t}");
    // The source keeps running, unchanged.
    assert_eq!(sh(&client, &src, "cat /srv/app/data").await, "state\n");
    let id = sandbox_from(&client, "snap").await;
    assert_eq!(
        sh(
            &client,
            &id,
            "cat /srv/app/data; test -e /etc/hostname || echo gone"
        )
        .await,
        "state\ngone\n"
    );
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["shape"]["memory_mb"], 256, "{info}");
    assert_eq!(info["shape"]["max_pids"], 64, "{info}");
    // Less than the template's shape is fine; more is refused, naming the limit.
    let create = |shape: Value| {
        api(
            &engine.url,
            "POST",
            "/v1/sandboxes",
            Some(json!({"template": "snap", "shape": shape})),
        )
    };
    let (status, body) = create(json!({"memory_mb": 128})).await;
    assert_eq!(status, 201);
    assert_eq!(body["shape"]["memory_mb"], 128, "{body}");
    assert_eq!(body["shape"]["max_pids"], 64, "{body}");
    let (status, body) = create(json!({"memory_mb": 512})).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("at most that"),
        "{body}"
    );
    // Outside the spec's bounds: refused before the template is even looked at.
    let (status, body) = create(json!({"vcpus": 0.01})).await;
    assert_eq!(status, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("shape.vcpus must be between"),
        "{body}"
    );
    // Delete: refused while used (naming the sandboxes), then its layers go.
    let before = layers(&engine);
    let e = err(&client, "sandbox_template_delete", json!({"name": "snap"})).await;
    assert!(e.contains(&id), "{e}");
    for s in ok(&client, "sandbox_list", json!({})).await["sandboxes"]
        .as_array()
        .unwrap()
    {
        ok(&client, "sandbox_kill", json!({"sandbox_id": s["id"]})).await;
    }
    ok(&client, "sandbox_template_delete", json!({"name": "snap"})).await;
    assert_eq!(layers(&engine), before - 1);
    let e = err(&client, "sandbox_create", json!({"template": "snap"})).await;
    assert!(e.contains("does not exist"), "{e}");
}

#[tokio::test]
async fn templates_survive_a_restart_and_one_can_be_the_default() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "keep", "warm": 1, "steps": [{"run": "echo kept > /kept"}, {"env": {"KEPT": "yes"}}]}),
    )
    .await;
    assert_eq!(wait_built(&client, "keep").await["status"], "ready");
    wait_dirs(&engine, "the pool was not filled", |d| d.len() == 1).await;
    let pooled = sandbox_dirs(&engine);
    // A build the engine stops in the middle of.
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "interrupted", "steps": [{"run": "sleep 60"}]}),
    )
    .await;
    wait_dirs(&engine, "no build sandbox started", |d| d.len() == 2).await;
    let building = sandbox_dirs(&engine);
    drop(client);
    let dir = engine.stop().await;
    // The build sandbox was killed at shutdown, not paused: nothing of it runs while no engine
    // does. The pooled one was paused, as callers' sandboxes are.
    let layout = sandbox_mcp_linux::cgroups::Layout::detect();
    for id in building.iter().filter(|id| !pooled.contains(id)) {
        assert!(
            layout.sandbox(id).pids().is_empty(),
            "{id} left processes behind"
        );
    }
    let mut config = TestEngine::config_for(dir.path());
    config.default_template = Some("keep".into());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let list = ok(&client, "sandbox_template_list", json!({})).await;
    let keep = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "keep")
        .unwrap();
    assert_eq!(keep["default"], true, "{list}");
    assert_eq!(list["templates"][0]["default"], false, "{list}");
    let interrupted = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "interrupted")
        .unwrap();
    assert_eq!(interrupted["status"], "failed", "{list}");
    assert!(
        interrupted["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("engine stopped"),
        "{list}"
    );
    // The build sandbox is gone; the pooled one is the pool's again (no new one started).
    wait_dirs(&engine, "the build sandbox was not killed", |d| {
        d == pooled.as_slice()
    })
    .await;
    // No template named: the default.
    let id = ok(&client, "sandbox_create", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        sh(&client, &id, "cat /kept; echo $KEPT").await,
        "kept\nyes\n"
    );
    let e = err(&client, "sandbox_template_delete", json!({"name": "keep"})).await;
    assert!(e.contains("default"), "{e}");
    drop(client);
    // A default that does not exist stops the engine from starting, saying why.
    let dir = engine.stop().await;
    let mut config = TestEngine::config_for(dir.path());
    config.default_template = Some("nope".into());
    let e = sandbox_mcp::wiring::open_manager(&config)
        .await
        .err()
        .expect("an engine with a missing default template started");
    assert!(e.to_string().contains("nope"), "{e}");
}

#[tokio::test]
async fn a_warm_pool_hands_out_fresh_sandboxes_and_refills() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (status, _) = api(
        &engine.url,
        "POST",
        "/v1/templates",
        Some(json!({"name": "pooled", "warm": 2, "steps": [{"run": "echo pooled > /mark"}]})),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(wait_built(&client, "pooled").await["status"], "ready");
    wait_dirs(&engine, "the pool was not filled", |d| d.len() >= 2).await;
    // Pooled sandboxes are not listed.
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 0, "{list}");
    // Taken from the pool: the request's labels and environment apply, nothing else ran.
    let (status, a) = api(
        &engine.url,
        "POST",
        "/v1/sandboxes",
        Some(
            json!({"template": "pooled", "metadata": {"who": "a"}, "env_vars": {"GREETING": "hi"},
                   "network": {"deny_out": ["0.0.0.0/0"]}}),
        ),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(a["network"]["deny_out"][0], "0.0.0.0/0", "{a}");
    let id = a["id"].as_str().unwrap();
    assert_eq!(a["metadata"]["who"], "a", "{a}");
    assert_eq!(
        sh(&client, id, "cat /mark; echo $GREETING; ls -A /tmp | wc -l").await,
        "pooled\nhi\n0\n"
    );
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"][0]["id"], id, "{list}");
    // A second and a third: distinct ids; the pool refills behind them.
    let b = sandbox_from(&client, "pooled").await;
    let c = sandbox_from(&client, "pooled").await;
    assert!(id != b && b != c && id != c);
    wait_dirs(&engine, "the pool was not refilled", |d| d.len() >= 5).await;
    // Deleting the template (once its sandboxes are gone) drains the pool.
    for s in [id.to_string(), b, c] {
        ok(&client, "sandbox_kill", json!({"sandbox_id": s})).await;
    }
    ok(
        &client,
        "sandbox_template_delete",
        json!({"name": "pooled"}),
    )
    .await;
    assert_eq!(sandbox_dirs(&engine), Vec::<String>::new());
}
