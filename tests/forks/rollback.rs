//! Rolling back: a snapshot taken before a mistake restores the sandbox's files as they were, on
//! both stores.

use serde_json::json;

use crate::common::{TestEngine, create, err, ok, sh};
use crate::require_sandboxes;
use sandbox_mcp_model::config::DiskLimits;

use super::{changes, engine_on, stacked_method_of};

async fn roll_back(disk: DiskLimits) {
    let Some(engine) = engine_on(disk).await else {
        return;
    };
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "mkdir -p /root/work && seq 1 100000 > /root/work/big && echo v1 > /root/work/state && ln -s big /root/work/link && mkfifo /root/work/pipe").await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id, "name": "good"}),
    )
    .await;
    assert_eq!(snap["method"], stacked_method_of(disk), "{snap}");
    assert!(snap["size_bytes"].as_u64().unwrap() >= 588_895, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    // A mistake, with processes running on top of it.
    sh(
        &client,
        &id,
        "rm -rf /root/* && echo junk > /root/junk && echo v2 > /etc/motd",
    )
    .await;
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "sleep 600", "background": true}),
    )
    .await;
    ok(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": "x = 41", "context_id": null}),
    )
    .await;
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": id, "against": snap_id}),
    )
    .await;
    let c = changes(&d);
    for (path, change) in [
        ("/etc/motd", "added"),
        ("/root/junk", "added"),
        ("/root/work", "removed"),
        ("/root/work/big", "removed"),
        ("/root/work/pipe", "removed"),
    ] {
        assert!(
            c.iter().any(|e| e.0 == path && e.1 == change),
            "{path} {change}: {d}"
        );
    }
    assert_eq!(d["removed"], 5, "{d}");

    let r = ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap_id}),
    )
    .await;
    assert_eq!(r["ended_jobs"], 1, "{r}");
    assert!(r["stopped_processes"].as_u64().unwrap() >= 2, "{r}");
    assert!(r["note"].as_str().unwrap().contains("stopped"), "{r}");
    assert_eq!(
        sh(&client, &id, "ls /root; ls /root/work; cat /root/work/state; wc -l < /root/work/big; readlink /root/work/link; test -p /root/work/pipe && echo fifo; test -e /etc/motd && cat /etc/motd; pgrep -c sleep || true").await,
        "work\nbig\nlink\npipe\nstate\nv1\n100000\nbig\nfifo\n0\n"
    );
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": id, "against": snap_id}),
    )
    .await;
    assert_eq!(
        d["added"].as_u64().unwrap()
            + d["removed"].as_u64().unwrap()
            + d["modified"].as_u64().unwrap(),
        0,
        "{d}"
    );
    // Restoring twice is the same; the snapshot is kept until deleted.
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap_id}),
    )
    .await;
    let list = ok(&client, "sandbox_snapshot_list", json!({"sandbox_id": id})).await;
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["snapshots"][0]["name"], "good");
    ok(
        &client,
        "sandbox_snapshot_delete",
        json!({"sandbox_id": id, "snapshot_id": snap_id}),
    )
    .await;
    let e = err(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap_id}),
    )
    .await;
    assert!(e.contains("sandbox_snapshot_list"), "{e}");
    assert!(
        !engine.data_dir().join("sandboxes").join(&snap_id).exists(),
        "the snapshot's files are gone"
    );

    // Snapshots survive a restart; a sandbox's snapshots go with it.
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    let snap_id = snap["id"].as_str().unwrap().to_string();
    let data = engine.stop().await;
    let mut config = TestEngine::config_for(data.path());
    config.disk_limits = disk;
    let engine = TestEngine::start_on(data, config).await;
    let client = engine.mcp().await;
    sh(&client, &id, "rm /root/work/state").await;
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap_id}),
    )
    .await;
    assert_eq!(sh(&client, &id, "cat /root/work/state").await, "v1\n");
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(
        !engine.data_dir().join("sandboxes").join(&snap_id).exists(),
        "killed with its sandbox"
    );
}

#[tokio::test]
async fn a_snapshot_rolls_back_a_mistake_on_btrfs() {
    require_sandboxes!();
    roll_back(DiskLimits::Auto).await;
}

#[tokio::test]
async fn a_snapshot_rolls_back_a_mistake_on_the_copy_path() {
    require_sandboxes!();
    roll_back(DiskLimits::Off).await;
}
