//! What a sandbox's description and metrics say it uses: cgroup figures, and disk use from a
//! walk of its files that a description may reuse while it is recent.

use serde_json::json;

use crate::common::{TestEngine, create, ok, sh};
use crate::{require_cgroups, require_sandboxes};

/// 20,000 empty files: a walk slow enough for a description to reuse it.
const MANY_FILES: &str = "mkdir /root/many && cd /root/many && seq 20000 | xargs touch";

/// A description may reuse a recent walk of a sandbox's many files, but never one of files a
/// restore has since replaced.
#[tokio::test]
async fn a_description_after_a_restore_shows_the_restored_files() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let blob = "head -c 3000000 /dev/urandom > /root/blob";
    sh(&client, &id, &format!("{MANY_FILES} && {blob}")).await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    sh(&client, &id, "rm /root/blob").await;
    let disk = |info: &serde_json::Value| info["usage"]["disk_bytes"].as_u64().unwrap();
    let before = disk(&ok(&client, "sandbox_info", json!({"sandbox_id": id})).await);
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
    let after = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert!(
        disk(&after) >= before + 3_000_000,
        "the restored file is counted at once: {before} then {after}"
    );
}

#[tokio::test]
async fn metrics_report_usage_and_limits() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    // Many files make a walk slow enough for a description to reuse it; metrics never do.
    sh(&client, &id, MANY_FILES).await;
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    let described = info["usage"]["disk_bytes"].as_u64().unwrap();
    sh(
        &client,
        &id,
        "head -c 3000000 /dev/urandom > /root/blob; python3 -c 'sum(range(3000000))'",
    )
    .await;
    let m = ok(&client, "sandbox_metrics", json!({"sandbox_id": id})).await;
    assert!(
        m["disk_bytes"].as_u64().unwrap() >= described + 3_000_000,
        "metrics count the file written after the description: {described} then {m}"
    );
    assert_eq!(m["limits_enforced"], true);
    assert_eq!(m["memory_limit_bytes"], 1024u64 * 1024 * 1024);
    assert_eq!(m["pids_limit"], 512);
    assert!(m["cpu_seconds"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["disk_bytes"].as_u64().unwrap() >= 3_000_000, "{m}");
    assert!(m["pids"].as_u64().unwrap() >= 1);
    let templates = ok(&client, "sandbox_template_list", json!({})).await;
    let base = &templates["templates"][0];
    assert_eq!(base["name"], "base");
    assert_eq!(base["default"], true);
    assert_eq!(base["shape"]["memory_mb"], 1024);
}

/// A description of a sandbox nobody touches may reuse a walk of its few files for a second, but
/// what a command did through the engine is counted by the very next description, and what a
/// background process writes on its own is counted soon after.
#[tokio::test]
async fn a_description_counts_what_the_last_call_wrote_at_once() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let disk = async || {
        ok(&client, "sandbox_info", json!({"sandbox_id": id})).await["usage"]["disk_bytes"]
            .as_u64()
            .unwrap()
    };
    // Quiet: described twice in a row (the second may reuse the first's walk).
    let before = disk().await;
    assert!(disk().await >= before.saturating_sub(64 * 1024));
    for n in 1..=3u64 {
        sh(
            &client,
            &id,
            &format!("head -c 2000000 /dev/urandom > /root/blob{n}"),
        )
        .await;
        let now = disk().await;
        assert!(
            now >= before + n * 2_000_000,
            "write {n} is counted by the next description: {before} then {now}"
        );
    }
    // Written by a process of the sandbox's own, with no call of the engine since.
    let counted = disk().await;
    sh(
        &client,
        &id,
        "(sleep 0.5; head -c 2000000 /dev/urandom > /root/late) >/dev/null 2>&1 &",
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if disk().await >= counted + 2_000_000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a background write is never counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
