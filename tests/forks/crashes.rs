//! Crashes: an engine killed during a fork, restore, snapshot or merge leaves nothing half made,
//! a restore cut short between its two steps loses nothing, and a call cut short by a restore or
//! a kill says why.

use std::time::Duration;

use serde_json::json;

use crate::common::{TestEngine, api, create, ok, sh, spawn_engine_process_env};
use crate::require_sandboxes;

/// `kill -9` of the engine in the middle of a fork, a restore, a snapshot or a merge: after a
/// restart nothing half-made is listed or left on disk, the parent's files are whole, and a
/// restored or merged sandbox has one tree or the other, never a mix.
#[tokio::test]
async fn a_crash_during_a_fork_restore_snapshot_or_merge_leaves_nothing_half_made() {
    require_sandboxes!();
    let data = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let data = data.path().join("data");
    // The plain store: its copy path takes long enough to be caught in the middle.
    let off = [("SANDBOX_MCP_DISK_LIMITS", "off")];
    let (mut engine, mut url) = spawn_engine_process_env(&data, &off).await;
    let (_, made) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let id = made["id"].as_str().unwrap().to_string();
    let run = |cmd: &str| {
        let (url, id, cmd) = (url.clone(), id.clone(), cmd.to_string());
        async move {
            let (status, r) = api(
                &url,
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": cmd, "timeout_ms": 120000})),
            )
            .await;
            assert_eq!(status, 200, "{r}");
            r
        }
    };
    // 4,000 files of 4 KiB: each copy takes long enough for the kill to land in the middle.
    run("mkdir -p /root/w && cd /root/w && python3 -c 'import os\nfor i in range(1, 4001): open(\"f%d\" % i, \"wb\").write(os.urandom(4096))' && echo before > marker").await;
    // A job holding a TCP connection open keeps the sandbox on the copy path (stacking layers
    // would restart it, which cuts the connection; and would leave the files in a shared layer
    // that copies never touch): every copy below holds the 4,000 files, long enough to be caught
    // in the middle. tests/forks/layers.rs crashes stacking.
    let busy = |url: String| {
        let id = id.clone();
        async move {
            let held = "exec python3 -c 'import socket, time\ns = socket.socket()\ns.bind((\"127.0.0.1\", 0))\ns.listen()\nc = socket.create_connection(s.getsockname())\na, _ = s.accept()\ntime.sleep(600)'";
            let (status, job) = api(
                &url,
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": held, "background": true})),
            )
            .await;
            assert_eq!(status, 200, "{job}");
            let wait = "until awk '$4 == \"01\"' /proc/net/tcp | grep -q .; do sleep 0.05; done";
            let (status, r) = api(
                &url,
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": wait, "timeout_ms": 60000})),
            )
            .await;
            assert_eq!(status, 200, "{r}");
        }
    };
    busy(url.clone()).await;
    let (status, snap) = api(
        &url,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    assert_eq!(snap["method"], "copy", "{snap}");
    run("echo after > /root/w/marker").await;

    for what in ["fork", "restore", "snapshot", "merge"] {
        busy(url.clone()).await;
        let (path, body) = match what {
            "fork" => (format!("/v1/sandboxes/{id}/fork"), json!({"count": 8})),
            "restore" => (
                format!("/v1/sandboxes/{id}/snapshots/{snap_id}/restore"),
                json!({}),
            ),
            "snapshot" => (format!("/v1/sandboxes/{id}/snapshots"), json!({})),
            _ => {
                // A child to merge back, made before the engine is killed.
                let (status, forked) = api(
                    &url,
                    "POST",
                    &format!("/v1/sandboxes/{id}/fork"),
                    Some(json!({})),
                )
                .await;
                assert_eq!(status, 201, "{forked}");
                let child = forked["ids"][0].as_str().unwrap();
                (
                    format!("/v1/sandboxes/{id}/merge"),
                    json!({"source_id": child}),
                )
            }
        };
        let started = std::time::Instant::now();
        let call = tokio::spawn({
            let url = url.clone();
            async move { api(&url, "POST", &path, Some(body)).await }
        });
        // Long enough for the request to reach the engine, not for the copy to finish.
        tokio::time::sleep(Duration::from_millis(60)).await;
        engine.kill().unwrap();
        engine.wait().unwrap();
        let answered = call.await.map(|(s, _)| s).unwrap_or(0);
        eprintln!(
            "{what}: engine killed after {:?} (answer: {answered})",
            started.elapsed()
        );
        let (again, url2) = spawn_engine_process_env(&data, &off).await;
        engine = again;
        let (_, list) = api(&url2, "GET", "/v1/sandboxes", None).await;
        let listed: Vec<&str> = list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        // Each listed sandbox works and holds a whole tree.
        for sbx in &listed {
            let (status, r) = api(&url2, "POST", &format!("/v1/sandboxes/{sbx}/exec"), Some(json!({"command": "ls /root/w | wc -l; cat /root/w/marker", "timeout_ms": 60000}))).await;
            assert_eq!(status, 200, "{what}: {sbx}: {r}");
            let out = r["stdout"].as_str().unwrap();
            assert!(
                out == "4001\nafter\n" || out == "4001\nbefore\n",
                "{what}: {sbx}: {out:?}"
            );
        }
        if what == "fork" {
            assert!(
                answered == 201 || listed.len() == 1,
                "unacknowledged children are not listed: {listed:?}"
            );
            // And no directory is left of a child that is not listed.
            let dirs: Vec<String> = std::fs::read_dir(data.join("sandboxes"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx_"))
                .collect();
            for dir in &dirs {
                assert!(
                    listed.contains(&dir.as_str()),
                    "{dir} left behind: {dirs:?} vs {listed:?}"
                );
            }
        }
        // The first snapshot is intact whatever happened; a snapshot cut short is not listed,
        // and no snapshot's files are left that are not listed.
        let (_, snaps) = api(&url2, "GET", &format!("/v1/sandboxes/{id}/snapshots"), None).await;
        let snap_ids: Vec<&str> = snaps["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert!(snap_ids.contains(&snap_id.as_str()), "{snaps}");
        let made = usize::from(what == "snapshot" && answered == 201);
        assert_eq!(snap_ids.len(), 1 + made, "{what}: {snaps}");
        for entry in std::fs::read_dir(data.join("sandboxes")).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with("snap_") || snap_ids.contains(&name.as_str()),
                "{what}: {name} left behind: {snap_ids:?}"
            );
        }
        // Rounds after this one restore the first snapshot only.
        for extra in snap_ids.iter().filter(|s| **s != snap_id) {
            api(
                &url2,
                "DELETE",
                &format!("/v1/sandboxes/{id}/snapshots/{extra}"),
                None,
            )
            .await;
        }
        // Leave one sandbox for the restore round.
        for sbx in listed.iter().filter(|s| **s != id) {
            api(&url2, "DELETE", &format!("/v1/sandboxes/{sbx}"), None).await;
        }
        url = url2;
        let (status, _) = api(
            &url,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": "echo after > /root/w/marker"})),
        )
        .await;
        assert_eq!(status, 200);
    }
    engine.kill().unwrap();
    engine.wait().unwrap();
    crate::common::kill_left_behind(&data);
}

/// On the btrfs store a restore renames the sandbox's tree aside, then snapshots the restored one
/// under its name. An engine killed between the two leaves the old tree aside and none under
/// the sandbox's name; the next start puts it back, with every file.
#[tokio::test]
async fn a_restore_cut_short_between_its_two_steps_loses_nothing() {
    require_sandboxes!();
    let data = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let data = data.path().join("data");
    let (mut engine, url) = spawn_engine_process_env(&data, &[]).await;
    let (_, made) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let id = made["id"].as_str().unwrap().to_string();
    let exec = |url: String, cmd: &'static str| {
        let path = format!("/v1/sandboxes/{id}/exec");
        async move {
            let (status, r) = api(&url, "POST", &path, Some(json!({"command": cmd}))).await;
            assert_eq!(status, 200, "{r}");
            r["stdout"].as_str().unwrap().to_string()
        }
    };
    exec(url.clone(), "echo kept > /root/marker").await;
    let (status, snap) = api(
        &url,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{snap}");
    if snap["method"] != "btrfs" {
        engine.kill().unwrap();
        engine.wait().unwrap();
        crate::common::kill_left_behind(&data);
        assert!(
            std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
            "a btrfs sandbox store is required (root, btrfs in the kernel, mkfs.btrfs)"
        );
        eprintln!("SKIPPED: needs the btrfs sandbox store (root, btrfs, mkfs.btrfs)");
        return;
    }
    engine.kill().unwrap();
    engine.wait().unwrap();
    // What the kill leaves in that moment.
    let store = data.join("sandboxes");
    std::fs::rename(store.join(&id), store.join(format!("{id}.new"))).unwrap();
    let (again, url) = spawn_engine_process_env(&data, &[]).await;
    engine = again;
    assert!(store.join(&id).is_dir());
    assert!(!store.join(format!("{id}.new")).exists());
    assert_eq!(exec(url.clone(), "cat /root/marker").await, "kept\n");
    // And a restore after it works as any other.
    let (status, r) = api(
        &url,
        "POST",
        &format!(
            "/v1/sandboxes/{id}/snapshots/{}/restore",
            snap["id"].as_str().unwrap()
        ),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["method"], "btrfs", "{r}");
    assert_eq!(exec(url.clone(), "cat /root/marker").await, "kept\n");
    engine.kill().unwrap();
    engine.wait().unwrap();
    crate::common::kill_left_behind(&data);
}

/// A call whose processes a restore or a kill stops says why, instead of reporting a crash.
#[tokio::test]
async fn a_call_cut_short_by_a_restore_or_a_kill_says_why() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    for (what, expected) in [
        ("restore", "files were replaced"),
        ("kill", "was killed while this call ran"),
    ] {
        let (url, sid) = (engine.url.clone(), id.clone());
        let running = tokio::spawn(async move {
            api(
                &url,
                "POST",
                &format!("/v1/sandboxes/{sid}/exec"),
                Some(json!({"command": "sleep 30", "timeout_ms": 60000})),
            )
            .await
        });
        // Until the command runs.
        while sh(&client, &id, "pgrep -c sleep || true").await != "1\n" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if what == "restore" {
            ok(
                &client,
                "sandbox_snapshot_restore",
                json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
            )
            .await;
        } else {
            ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
        }
        let (status, body) = running.await.unwrap();
        assert!(status == 409 || status == 404, "{what}: {status} {body}");
        assert!(
            body["message"].as_str().unwrap().contains(expected),
            "{what}: {body}"
        );
    }
}
