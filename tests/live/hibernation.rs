//! Hibernation: a sandbox's processes written to the data dir and its memory freed, and brought
//! back by the next call — after an engine restart, after what a reboot takes away, and when the
//! idle policy hibernated it.

use std::time::Duration;

use serde_json::json;

use crate::common::{TestEngine, api, create, ok, sh};
use crate::require_sandboxes;

use super::{COUNTER, background, code, count, live, live_engine};

async fn memory_bytes(client: &crate::common::McpClient, id: &str) -> u64 {
    ok(client, "sandbox_metrics", json!({"sandbox_id": id})).await["memory_bytes"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_hibernated_sandbox_frees_its_memory_and_comes_back_after_an_engine_restart() {
    require_sandboxes!();
    let Some((engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    code(&client, &id, "x = 41\nbig = b'x' * (64 << 20)").await;
    background(&client, &id, COUNTER).await;
    assert!(memory_bytes(&client, &id).await > 64 << 20);
    let before = count(&client, &id).await;
    let boot = sh(&client, &id, "cat /proc/sys/kernel/random/boot_id").await;
    ok(
        &client,
        "sandbox_pause",
        json!({"sandbox_id": id, "hibernate": true}),
    )
    .await;
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "paused", "{info}");
    let freed = memory_bytes(&client, &id).await;
    assert!(
        freed < 16 << 20,
        "{freed} bytes still charged after hibernating"
    );

    // An engine restart (its checkpoints are in its data dir), then the next call wakes it.
    drop(client);
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let got = code(&client, &id, "x += 1\n(x, len(big))").await;
    assert_eq!(got["result"], "(42, 67108864)", "{got}");
    let first = count(&client, &id).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = count(&client, &id).await;
    assert!(
        first >= before && second > first,
        "{before} {first} {second}"
    );
    // Its processes came back into the boot they left: the boot id is theirs again.
    let after = sh(&client, &id, "cat /proc/sys/kernel/random/boot_id").await;
    assert_eq!(after, boot, "a hibernated sandbox's boot id is kept");
    let left = std::fs::read_dir(engine.data_dir().join("live"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "the checkpoint is deleted once restored");
}

/// What a reboot takes away between two engines — the store's mount and loop device, the
/// sandbox's cgroup — does not take a hibernated sandbox: its checkpoint is in the data dir, and
/// the next call restores it.
#[tokio::test]
async fn a_hibernated_sandbox_comes_back_after_a_reboot() {
    require_sandboxes!();
    let Some((engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    code(&client, &id, "x = 41").await;
    ok(
        &client,
        "sandbox_pause",
        json!({"sandbox_id": id, "hibernate": true}),
    )
    .await;
    drop(client);
    let dir = engine.stop().await;
    let data = dir.path().join("data");
    // As a reboot: the store unmounted and its loop device gone, the sandbox's cgroup gone.
    let store = data.join("sandboxes");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while crate::common::mounted(&store)
        || !crate::common::loop_devices_of(&data.join("sandboxes.img")).is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the stopped engine's store stays mounted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cgroup = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&id);
    cgroup.kill_all().unwrap();
    let _ = cgroup.remove();
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let got = code(&client, &id, "x += 1\nx").await;
    assert_eq!(got["result"], "42", "{got}");
}

#[tokio::test]
async fn an_idle_sandbox_is_hibernated_by_the_idle_policy() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| {
        c.idle_pause = None;
        c.idle_hibernate = Some(Duration::from_secs(1));
    })
    .await;
    if !live(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let id = create(&client).await;
    code(&client, &id, "x = 41\nbig = b'x' * (64 << 20)").await;
    // Beside it, one with a daemon outside every job: it cannot be written down, so the idle
    // policy leaves it running, daemon and all.
    let kept = create(&client).await;
    background(&client, &kept, "sleep 600 > /dev/null 2>&1 &").await;
    sh(&client, &kept, "until pgrep -x sleep; do sleep 0.05; done").await;
    let mut hibernated = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (_, view) = api(
            &engine.url,
            "GET",
            &format!("/v1/sandboxes/{id}/metrics"),
            None,
        )
        .await;
        if view["status"] == "paused"
            && view["memory_bytes"].as_u64().unwrap_or(u64::MAX) < 16 << 20
        {
            hibernated = true;
            break;
        }
    }
    assert!(hibernated, "the idle sandbox was not hibernated");
    assert_eq!(code(&client, &id, "x").await["result"], "41");
    let (_, view) = api(&engine.url, "GET", &format!("/v1/sandboxes/{kept}"), None).await;
    assert_eq!(view["status"], "running", "{view}");
    assert_eq!(sh(&client, &kept, "pgrep -cx sleep").await, "1\n");
}
