//! Builds from steps: each step runs and is cached, a failing step is reported, bad requests leave
//! nothing, and a step past the time limit or the disk fails the build with the reason.

use serde_json::json;

use crate::common::{TestEngine, api, err, ok, sh};
use crate::require_sandboxes;

use super::{layers, sandbox_from, wait_built, with_builtins};

#[tokio::test]
async fn a_build_runs_its_steps_caches_them_and_reports_a_failing_step() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let steps = json!([
        {"run": "mkdir -p /opt/tool && printf 'v1' > /opt/tool/version && python3 -c 'print(42)' > /usr/local/answer"},
        {"env": {"TOOL_MODE": "fast"}},
        {"workdir": "/opt/tool"},
        {"run": "rm /etc/hostname && echo second > /opt/tool/second"},
    ]);
    let t = ok(
        &client,
        "sandbox_template_create",
        json!({"name": "tool", "steps": steps}),
    )
    .await;
    assert_eq!(t["status"], "building", "{t}");
    let t = wait_built(&client, "tool").await;
    assert_eq!(t["status"], "ready", "{t}");
    assert_eq!(t["parent"], "base");
    assert!(t["size_bytes"].as_u64().unwrap() > 0, "{t}");
    let id = sandbox_from(&client, "tool").await;
    // Files of both run steps (/ and the host's /usr overlay), the env and workdir steps, and
    // a deletion carried as a whiteout.
    let out = sh(
        &client,
        &id,
        "pwd; cat version second /usr/local/answer; echo $TOOL_MODE; test -e /etc/hostname || echo no-hostname",
    )
    .await;
    assert_eq!(out, "/opt/tool\nv1second\n42\nfast\nno-hostname\n");
    // Writes stay in the sandbox: the template is unchanged for the next one.
    sh(&client, &id, "echo changed > /opt/tool/version").await;
    let other = sandbox_from(&client, "tool").await;
    assert_eq!(sh(&client, &other, "cat /opt/tool/version").await, "v1");

    // The same steps again: every step is a cache hit, no layer is added.
    let before = layers(&engine);
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "tool-again", "steps": steps}),
    )
    .await;
    assert_eq!(wait_built(&client, "tool-again").await["status"], "ready");
    assert_eq!(layers(&engine), before, "an unchanged rebuild added layers");
    // A changed last step rebuilds only that one.
    let mut changed = steps.clone();
    changed[3]["run"] = json!("echo third > /opt/tool/third");
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "tool-changed", "steps": changed}),
    )
    .await;
    assert_eq!(wait_built(&client, "tool-changed").await["status"], "ready");
    assert_eq!(layers(&engine), before + 1);

    // A failing step: which one, its exit code and the end of its output.
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "broken", "from": "tool", "steps": [
            {"run": "echo fine"},
            {"run": "echo working; echo 'E: no such package' >&2; exit 3"}
        ]}),
    )
    .await;
    let t = wait_built(&client, "broken").await;
    assert_eq!(t["status"], "failed", "{t}");
    let f = &t["failure"];
    assert_eq!(f["step"], 2, "{t}");
    assert_eq!(f["exit_code"], 3, "{t}");
    assert!(
        f["output_tail"]
            .as_str()
            .unwrap()
            .contains("E: no such package"),
        "{t}"
    );
    let e = err(&client, "sandbox_create", json!({"template": "broken"})).await;
    assert!(e.contains("failed to build"), "{e}");
    let e = err(
        &client,
        "sandbox_template_create",
        json!({"name": "child", "from": "broken", "steps": [{"run": "true"}]}),
    )
    .await;
    assert!(e.contains("failed to build"), "{e}");
    // A failed template's name can be reused at once; its finished step is reused too.
    let before = layers(&engine);
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "broken", "from": "tool", "steps": [
            {"run": "echo fine"}, {"run": "echo fixed > /fixed"}
        ]}),
    )
    .await;
    assert_eq!(wait_built(&client, "broken").await["status"], "ready");
    assert_eq!(layers(&engine), before + 1);
}

#[tokio::test]
async fn bad_template_requests_get_clear_errors_and_leave_nothing() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let step = json!([{"run": "true"}]);
    for (args, expected) in [
        (json!({"name": "base", "steps": step}), "built-in"),
        (json!({"name": "Bad Name", "steps": step}), "name"),
        (json!({"name": "x"}), "steps"),
        (
            json!({"name": "x", "steps": [{"run": "true", "workdir": "/a"}]}),
            "",
        ),
        (
            json!({"name": "x", "from": "nope", "steps": step}),
            "does not exist",
        ),
        (
            json!({"name": "x", "steps": vec![json!({"run": "true"}); 51]}),
            "50",
        ),
        (
            json!({"name": "x", "from_sandbox": "sbx_00000000000000000000000000", "steps": step}),
            "",
        ),
    ] {
        let e = err(&client, "sandbox_template_create", args.clone()).await;
        assert!(e.contains(expected), "{args}: {e}");
    }
    // A slow build: its name is taken, and nothing can be built from it yet.
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "slow", "steps": [{"run": "sleep 3"}]}),
    )
    .await;
    let e = err(
        &client,
        "sandbox_template_create",
        json!({"name": "slow", "steps": step}),
    )
    .await;
    assert!(e.contains("already exists"), "{e}");
    let e = err(
        &client,
        "sandbox_template_create",
        json!({"name": "on-slow", "from": "slow", "steps": step}),
    )
    .await;
    assert!(e.contains("still building"), "{e}");
    let e = err(&client, "sandbox_template_delete", json!({"name": "slow"})).await;
    assert!(e.contains("still building"), "{e}");
    // Build sandboxes are the engine's own: no listing shows them.
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 0, "{list}");
    assert_eq!(wait_built(&client, "slow").await["status"], "ready");
    let e = err(&client, "sandbox_template_delete", json!({"name": "base"})).await;
    assert!(e.contains("built in"), "{e}");
    let names: Vec<String> = ok(&client, "sandbox_template_list", json!({})).await["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, with_builtins(&["slow"]));
}

#[tokio::test]
async fn a_step_past_the_time_limit_or_the_disk_fails_the_build_with_the_reason() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let (status, _) = api(
        &engine.url,
        "POST",
        "/v1/templates",
        Some(json!({"name": "hangs", "timeout_seconds": 2, "steps": [{"run": "sleep 60"}]})),
    )
    .await;
    assert_eq!(status, 201);
    let client = engine.mcp().await;
    let t = wait_built(&client, "hangs").await;
    assert_eq!(t["status"], "failed", "{t}");
    assert!(
        t["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("time limit"),
        "{t}"
    );
    if !engine.manager.driver().capabilities().disk_limits_enforced {
        eprintln!("SKIPPED disk part: disk limits are not enforced here (needs root and btrfs)");
        return;
    }
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "fills", "shape": {"disk_mb": 64}, "steps": [
            {"run": "dd if=/dev/zero of=/big bs=1M count=200"}
        ]}),
    )
    .await;
    let t = wait_built(&client, "fills").await;
    assert_eq!(t["status"], "failed", "{t}");
    let tail = t["failure"]["output_tail"].as_str().unwrap();
    assert!(tail.contains("quota") || tail.contains("space"), "{t}");
    assert_ne!(t["failure"]["exit_code"], 0, "{t}");
}
