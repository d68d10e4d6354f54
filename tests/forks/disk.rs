//! Disk and cap: snapshots and forks are held to the sandbox's disk and the engine's sandbox cap,
//! and copied snapshots count their size against the disk.

use serde_json::json;

use crate::common::{TestEngine, api, err, ok, sh};
use crate::require_sandboxes;
use sandbox_mcp_model::config::DiskLimits;

use super::{engine_on, ids};

/// Snapshots count against the sandbox's disk, are capped per sandbox, and a full sandbox does
/// not fork. On btrfs the kernel counts blocks a snapshot shares with its sandbox once (simple
/// quotas), so a snapshot costs disk as the sandbox's files change after it.
#[tokio::test]
async fn snapshots_and_forks_are_held_to_the_disk_and_the_cap() {
    require_sandboxes!();
    let Some(engine) = engine_on(DiskLimits::Auto).await else {
        return;
    };
    let client = engine.mcp().await;
    let small = || async {
        let (status, made) = api(
            &engine.url,
            "POST",
            "/v1/sandboxes",
            Some(json!({"shape": {"disk_mb": 64}})),
        )
        .await;
        assert_eq!(status, 201, "{made}");
        made["id"].as_str().unwrap().to_string()
    };
    let id = small().await;
    // Filled to its limit, the sandbox does not fork, and nothing is made.
    let before = engine.manager.list(None, &[], None).len();
    let r = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "head -c 80M /dev/zero > /root/fill"}),
    )
    .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let e = err(&client, "sandbox_fork", json!({"sandbox_id": id})).await;
    assert!(
        e.contains("disk limit") && e.contains("forks would start full"),
        "{e}"
    );
    assert_eq!(engine.manager.list(None, &[], None).len(), before);
    sh(&client, &id, "rm /root/fill && sync").await;

    sh(&client, &id, "head -c 40M /dev/urandom > /root/a && sync").await;
    let s1 = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    assert!(s1["size_bytes"].as_u64().unwrap() >= 40 << 20, "{s1}");
    // A second snapshot of the same files shares their blocks: it costs nothing yet.
    ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    // The snapshots keep the old 40 MiB: 40 MiB more do not fit in 64.
    let r = ok(&client, "sandbox_exec", json!({"sandbox_id": id, "command": "rm /root/a && sync && head -c 40M /dev/urandom > /root/b"})).await;
    assert!(r["stderr"].as_str().unwrap().contains("quota"), "{r}");
    let e = err(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    assert!(
        e.contains("disk limit") && e.contains("sandbox_snapshot_delete"),
        "{e}"
    );

    // The cap, on a sandbox with room.
    let id = small().await;
    for i in 0..16 {
        ok(
            &client,
            "sandbox_snapshot_create",
            json!({"sandbox_id": id, "name": format!("s{i}")}),
        )
        .await;
    }
    let e = err(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    assert!(e.contains("16 snapshots"), "{e}");
    // A fork's own writes are held to its own limit.
    let kid = ids(&ok(&client, "sandbox_fork", json!({"sandbox_id": id})).await).remove(0);
    let r = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": kid, "command": "head -c 80M /dev/zero > /root/fill"}),
    )
    .await;
    assert!(r["stderr"].as_str().unwrap().contains("quota"), "{r}");
}

/// On the plain store each snapshot counts at its size when taken, stacked or copied.
#[tokio::test]
async fn copied_snapshots_count_their_size_against_the_disk() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| c.disk_limits = DiskLimits::Off).await;
    let client = engine.mcp().await;
    let (status, made) = api(
        &engine.url,
        "POST",
        "/v1/sandboxes",
        Some(json!({"shape": {"disk_mb": 64}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    sh(&client, &id, "head -c 40M /dev/urandom > /root/a").await;
    let s1 = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    assert_eq!(s1["method"], "layers");
    assert!(s1["size_bytes"].as_u64().unwrap() >= 40 << 20, "{s1}");
    // 40 MiB of files and 40 MiB held by the first snapshot: past 64 MiB.
    let e = err(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    assert!(
        e.contains("80 of its 64 MiB") && e.contains("sandbox_snapshot_delete"),
        "{e}"
    );
    ok(
        &client,
        "sandbox_snapshot_delete",
        json!({"sandbox_id": id, "snapshot_id": s1["id"]}),
    )
    .await;
    ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
}
