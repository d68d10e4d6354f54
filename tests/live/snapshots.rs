//! Memory snapshots: a sandbox's processes kept with its files, brought back by each restore;
//! on the engine's store, and on the plain one, where a busy sandbox's files are stacked and its
//! processes carried over its restart.

use serde_json::json;

use super::{COUNTER, background, code, count, counts_on, live, live_engine};
use crate::common::{McpClient, TestEngine, create, ok};
use crate::require_sandboxes;
use sandbox_mcp_model::config::DiskLimits;

/// On the engine's store (btrfs where it has one).
#[tokio::test]
async fn a_memory_snapshot_brings_the_processes_back_each_time_it_is_restored() {
    require_sandboxes!();
    let Some((engine, client)) = live_engine().await else {
        return;
    };
    round_trips(&engine, &client, None).await;
}

/// On the plain store: the busy sandbox's files are stacked, its processes carried over its
/// restart (kept as the snapshot's memory on the way).
#[tokio::test]
async fn a_memory_snapshot_of_a_busy_sandbox_on_stacked_layers_comes_back_too() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| c.disk_limits = DiskLimits::Off).await;
    if !live(&engine) {
        return;
    }
    let client = engine.mcp().await;
    round_trips(&engine, &client, Some("layers")).await;
}

/// On the plain store a busy sandbox's snapshot answers before the sandbox is started again,
/// and nothing in between sees it stopped: it is listed running, and a memory snapshot asked for
/// at once waits for the restart and keeps the job (one that saw it stopped would keep no
/// process), which a restore brings back.
#[tokio::test]
async fn a_snapshot_answers_before_the_restart_and_nothing_sees_the_sandbox_stopped() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| c.disk_limits = DiskLimits::Off).await;
    if !live(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let id = create(&client).await;
    background(&client, &id, COUNTER).await;
    let mut kept = json!(null);
    for _ in 0..3 {
        let files = ok(
            &client,
            "sandbox_snapshot_create",
            json!({"sandbox_id": id}),
        )
        .await;
        assert_eq!(files["method"], "layers", "{files}");
        let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
        assert_eq!(info["status"], "running", "{info}");
        kept = ok(
            &client,
            "sandbox_snapshot_create",
            json!({"sandbox_id": id, "memory": true}),
        )
        .await;
        assert!(
            kept["memory_bytes"].as_u64().is_some_and(|b| b > 0),
            "{kept}"
        );
    }
    let restored = ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": kept["id"]}),
    )
    .await;
    let carried = restored["memory"]["carried"].as_array().unwrap();
    assert!(carried.contains(&json!("job job_1")), "{restored}");
    counts_on(&client, &id, 2, "the counter stopped").await;
}

/// Snapshots of a sandbox with a REPL context and a counter job, with memory and without, made
/// by `method` when given; restores bring the processes back (or reset them), each time.
async fn round_trips(engine: &TestEngine, client: &McpClient, method: Option<&str>) {
    let id = create(client).await;
    code(client, &id, "x = 41").await;
    background(client, &id, COUNTER).await;
    let files_only = ok(client, "sandbox_snapshot_create", json!({"sandbox_id": id})).await;
    assert!(files_only["memory_bytes"].is_null(), "{files_only}");
    if let Some(method) = method {
        assert_eq!(files_only["method"], method, "{files_only}");
    }
    // Read before the snapshot: the counter goes on after it, and a restore goes back to it.
    let at_snapshot = count(client, &id).await;
    let snap = ok(
        client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id, "memory": true}),
    )
    .await;
    assert!(snap["memory_bytes"].as_u64().unwrap() > 0, "{snap}");
    if let Some(method) = method {
        assert_eq!(snap["method"], method, "{snap}");
    }
    // The counter went on in the sandbox after each snapshot.
    counts_on(client, &id, 2, "the counter stopped").await;
    // Its images are the engine's alone: root's, in a directory no other user can enter.
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let live = std::fs::metadata(engine.data_dir().join("live")).unwrap();
        assert_eq!((live.uid(), live.permissions().mode() & 0o777), (0, 0o700));
    }
    let listed = ok(client, "sandbox_snapshot_list", json!({"sandbox_id": id})).await;
    let kinds: Vec<bool> = listed["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["memory_bytes"].is_u64())
        .collect();
    assert_eq!(kinds, vec![false, true], "{listed}");

    for _ in 0..2 {
        code(client, &id, "x = 100").await;
        let restored = ok(
            client,
            "sandbox_snapshot_restore",
            json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
        )
        .await;
        let carried = restored["memory"]["carried"].as_array().unwrap();
        assert!(
            carried.contains(&json!("code context python")),
            "{restored}"
        );
        assert!(carried.contains(&json!("job job_1")), "{restored}");
        assert_eq!(code(client, &id, "x").await["result"], "41");
        let now = count(client, &id).await;
        assert!(
            now >= at_snapshot && now < at_snapshot + 100,
            "{at_snapshot} {now}"
        );
    }
    // Restoring the files-only one resets the processes, as before.
    let plain = ok(
        client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": files_only["id"]}),
    )
    .await;
    assert!(plain["memory"].is_null(), "{plain}");
    let fresh = code(client, &id, "'x' in globals()").await;
    assert_eq!(fresh["result"], "False", "{fresh}");
    // Deleting the snapshot deletes its processes' images.
    ok(
        client,
        "sandbox_snapshot_delete",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
    let left = std::fs::read_dir(engine.data_dir().join("live"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "the snapshot's checkpoint is gone with it");
}

/// A hibernation checkpoint left beside live processes (a crash after a wake's restore, or
/// between a dump and its stop) is stale: the next engine start drops it, so it is never
/// restored on top of the processes it was taken from.
#[tokio::test]
async fn a_stale_hibernation_checkpoint_of_a_live_sandbox_is_dropped_at_start() {
    require_sandboxes!();
    let Some((engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    background(&client, &id, COUNTER).await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id, "memory": true}),
    )
    .await;
    // The snapshot's images, put where a hibernation's would be.
    let live = engine.data_dir().join("live");
    let kept = live.join(format!("snapshot-{}", snap["id"].as_str().unwrap()));
    let stale = live.join(format!("hibernated-{id}"));
    assert!(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&kept)
            .arg(&stale)
            .status()
            .unwrap()
            .success()
    );
    drop(client);
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    assert!(!stale.exists(), "the stale checkpoint is dropped");
    assert!(kept.exists(), "the snapshot's memory stays");
    let client = engine.mcp().await;
    let jobs = crate::common::sh(&client, &id, "pgrep -c -f 'i=0; [w]hile'; true").await;
    assert_eq!(jobs.trim(), "1", "one counter, not a restored second one");
    counts_on(&client, &id, 0, "the counter stopped").await;
}
