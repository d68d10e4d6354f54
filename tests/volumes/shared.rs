//! Named volumes: shared at once, persistent past every sandbox, read-only where asked, limited
//! by their quota, deletable only when unused, kept out of snapshots, shared by forks.

use serde_json::json;

use super::{create_with, keep_volumes_once};
use crate::common::{TestEngine, err, exec, ok, sh};
use crate::require_sandboxes;

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_is_shared_at_once_and_outlives_its_sandboxes() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let v = ok(&client, "volume_create", json!({"name": "data"})).await;
    assert_eq!(v["kind"], "volume");
    // The default quota where the store keeps one; none where it cannot.
    let quotas = engine.manager.driver().capabilities().volume_quotas;
    assert_eq!(
        v["quota_bytes"],
        if quotas {
            json!(1024 << 20)
        } else {
            json!(null)
        }
    );
    let mount = json!([{"name": "data", "path": "/data"}]);
    let (a, b) = (
        create_with(&client, mount.clone()).await,
        create_with(&client, mount.clone()).await,
    );
    sh(
        &client,
        &a,
        "echo from-a > /data/note && mkdir -p /data/dir && echo deep > /data/dir/f",
    )
    .await;
    // The other sandbox reads it at once, and its own write is seen by the first.
    assert_eq!(sh(&client, &b, "cat /data/note").await, "from-a\n");
    sh(&client, &b, "echo from-b >> /data/note").await;
    assert_eq!(sh(&client, &a, "cat /data/note").await, "from-a\nfrom-b\n");
    // Listed with its size and users; each sandbox says what it mounts.
    let list = ok(&client, "volume_list", json!({})).await;
    let data = &list["volumes"][0];
    assert_eq!(data["name"], "data");
    assert!(data["size_bytes"].as_u64().unwrap() > 0, "{data}");
    let mut users: Vec<_> = data["used_by"].as_array().unwrap().clone();
    users.sort_by_key(|u| u.as_str().unwrap().to_string());
    let mut both = vec![json!(a), json!(b)];
    both.sort_by_key(|u| u.as_str().unwrap().to_string());
    assert_eq!(users, both);
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": a})).await;
    assert_eq!(
        info["volumes"],
        json!([{"name": "data", "path": "/data", "read_only": false}])
    );
    // In use: not deleted, and the refusal names who uses it.
    let refused = err(&client, "volume_delete", json!({"name": "data"})).await;
    assert!(
        refused.contains("is mounted by") && refused.contains(&a),
        "{refused}"
    );
    for id in [&a, &b] {
        ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    }
    // Both gone; the files are not.
    let c = create_with(&client, mount).await;
    assert_eq!(
        sh(&client, &c, "cat /data/note /data/dir/f").await,
        "from-a\nfrom-b\ndeep\n"
    );
    ok(&client, "sandbox_kill", json!({"sandbox_id": c})).await;
    let deleted = ok(&client, "volume_delete", json!({"name": "data"})).await;
    assert_eq!(deleted["deleted"], true);
    let list = ok(&client, "volume_list", json!({})).await;
    assert_eq!(list["volumes"], json!([]));
    let gone = err(
        &client,
        "sandbox_create",
        json!({"volumes": [{"name": "data", "path": "/data"}]}),
    )
    .await;
    assert!(gone.contains("volume data not found"), "{gone}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_mount_refuses_writes_and_says_so() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(&client, "volume_create", json!({"name": "ro"})).await;
    let writer = create_with(&client, json!([{"name": "ro", "path": "/v"}])).await;
    sh(&client, &writer, "echo kept > /v/file").await;
    let reader = create_with(
        &client,
        json!([{"name": "ro", "path": "/v", "read_only": true}]),
    )
    .await;
    assert_eq!(sh(&client, &reader, "cat /v/file").await, "kept\n");
    let r = exec(&client, &reader, "echo x > /v/file; echo y > /v/new").await;
    let stderr = r["stderr"].as_str().unwrap();
    assert!(stderr.contains("Read-only file system"), "{r}");
    let refused = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": reader, "path": "/v/new", "content": "x"}),
    )
    .await;
    assert!(refused.to_lowercase().contains("read-only"), "{refused}");
    // Nor can it be mounted writable again from inside.
    let r = exec(&client, &reader, "mount -o remount,rw /v").await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert_eq!(
        sh(&client, &writer, "cat /v/file; ls /v").await,
        "kept\nfile\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quota_is_enforced_or_refused_with_the_reason() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    if !engine.manager.driver().capabilities().disk_limits_enforced {
        // Without the btrfs store a quota cannot be kept: asking for one says so.
        let refused = err(
            &client,
            "volume_create",
            json!({"name": "small", "size_mb": 8}),
        )
        .await;
        assert!(
            refused.contains("cannot enforce volume quotas"),
            "{refused}"
        );
        let v = ok(&client, "volume_create", json!({"name": "small"})).await;
        assert!(v["quota_bytes"].is_null(), "{v}");
        return;
    }
    let v = ok(
        &client,
        "volume_create",
        json!({"name": "small", "size_mb": 8}),
    )
    .await;
    assert_eq!(v["quota_bytes"], 8 << 20);
    let id = create_with(&client, json!([{"name": "small", "path": "/small"}])).await;
    let r = exec(
        &client,
        &id,
        "dd if=/dev/zero of=/small/big bs=1M count=32 2>&1; sync",
    )
    .await;
    let out = format!("{}{}", r["stdout"], r["stderr"]);
    assert!(out.contains("Disk quota exceeded"), "{r}");
    // The sandbox's own disk is not the volume's: it still writes there.
    sh(
        &client,
        &id,
        "dd if=/dev/zero of=/root/own bs=1M count=16 2>/dev/null",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_share_volumes_and_snapshots_leave_them_alone() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(&client, "volume_create", json!({"name": "shared"})).await;
    let parent = create_with(&client, json!([{"name": "shared", "path": "/s"}])).await;
    sh(&client, &parent, "echo 1 > /s/v; echo 1 > /root/own").await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": parent}),
    )
    .await;
    sh(&client, &parent, "echo 2 > /s/v; echo 2 > /root/own").await;
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": parent, "snapshot_id": snap["id"]}),
    )
    .await;
    // The sandbox's own files went back; the volume did not (documented: not in snapshots).
    assert_eq!(sh(&client, &parent, "cat /root/own /s/v").await, "1\n2\n");
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": parent, "memory": false}),
    )
    .await;
    let child = forked["ids"][0].as_str().unwrap().to_string();
    sh(&client, &child, "echo from-child > /s/child").await;
    assert_eq!(sh(&client, &parent, "cat /s/child").await, "from-child\n");
    // Paused and resumed, still mounted.
    ok(&client, "sandbox_pause", json!({"sandbox_id": child})).await;
    assert_eq!(sh(&client, &child, "cat /s/v").await, "2\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hibernated_sandbox_keeps_its_volume_and_its_writer() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let live = engine.manager.driver().capabilities().live_state.clone();
    if !live.available {
        assert!(
            std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
            "CRIU 4.0 or later is required here (.ci/run builds it): {}",
            live.detail
        );
        eprintln!("SKIPPED: hibernation needs CRIU: {}", live.detail);
        return;
    }
    let client = engine.mcp().await;
    ok(&client, "volume_create", json!({"name": "log"})).await;
    let mount = json!([{"name": "log", "path": "/log"}]);
    let id = create_with(&client, mount.clone()).await;
    // Written whole (renamed into place): a reader never sees the file truncated and empty.
    let counter = "i=0; while :; do i=$((i+1)); echo $i > /log/next; mv /log/next /log/count; sleep 0.1; done";
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": counter, "background": true}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    ok(
        &client,
        "sandbox_pause",
        json!({"sandbox_id": id, "hibernate": true}),
    )
    .await;
    // Hibernated, it still holds the volume: not deleted from under it.
    let refused = err(&client, "volume_delete", json!({"name": "log"})).await;
    assert!(
        refused.contains("is mounted by") && refused.contains(&id),
        "{refused}"
    );
    // Another sandbox watches the volume: nothing writes while the writer is hibernated.
    let watcher = create_with(&client, mount).await;
    let read = |s: String| s.trim().parse::<u64>().unwrap();
    let before = read(sh(&client, &watcher, "cat /log/count").await);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(read(sh(&client, &watcher, "cat /log/count").await), before);
    // Woken by a call: the volume is mounted again and the restored job goes on from where it
    // was (it may already have counted on once or twice before `cat` runs: never from 0).
    let woke = read(sh(&client, &id, "cat /log/count").await);
    assert!((before..=before + 10).contains(&woke), "{before} → {woke}");
    // It writes on: a few more counts seen from the other sandbox. Waited for rather than
    // timed (a restored job on a busy machine may take a while to be scheduled again).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let after = read(sh(&client, &watcher, "cat /log/count").await);
        if after > woke + 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restored job stopped writing: {before} → {woke} → {after}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_asked_to_copy_gets_volumes_of_its_own() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(&client, "volume_create", json!({"name": "state"})).await;
    let parent = create_with(&client, json!([{"name": "state", "path": "/s"}])).await;
    sh(&client, &parent, "echo parent > /s/v").await;
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": parent, "count": 2, "memory": false, "volumes": "copy"}),
    )
    .await;
    let kids: Vec<String> = forked["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    for kid in &kids {
        let info = ok(&client, "sandbox_info", json!({"sandbox_id": kid})).await;
        let copy = format!("state-{}", &kid[kid.len() - 8..]);
        assert_eq!(
            info["volumes"],
            json!([{"name": copy, "path": "/s", "read_only": false}])
        );
        // The parent's files at the fork, then its own.
        assert_eq!(sh(&client, kid, "cat /s/v").await, "parent\n");
        sh(&client, kid, &format!("echo {kid} > /s/v")).await;
    }
    assert_eq!(sh(&client, &parent, "cat /s/v").await, "parent\n");
    assert_eq!(
        sh(&client, &kids[0], "cat /s/v").await,
        format!("{}\n", kids[0])
    );
    let list = ok(&client, "volume_list", json!({})).await;
    assert_eq!(list["volumes"].as_array().unwrap().len(), 3, "{list}");
    // A copy is a volume like any other: it outlives its child and is deleted by name.
    ok(&client, "sandbox_kill", json!({"sandbox_id": kids[0]})).await;
    let copy = format!("state-{}", &kids[0][kids[0].len() - 8..]);
    let deleted = ok(&client, "volume_delete", json!({"name": copy})).await;
    assert_eq!(deleted["deleted"], true);
}

/// Without root: volumes are plain directories (no quota, said so), bind-mounted as they are;
/// workspaces are overlays of the folder, which still never changes.
#[tokio::test(flavor = "multi_thread")]
async fn an_unprivileged_engine_mounts_volumes_and_workspaces() {
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the suite already runs unprivileged");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    std::fs::write(repo.join("a.txt"), "host\n").unwrap();
    std::os::unix::fs::chown(&repo, Some(65534), Some(65534)).unwrap();
    std::os::unix::fs::chown(repo.join("a.txt"), Some(65534), Some(65534)).unwrap();
    let workspace = format!("repo={}", repo.display());
    let (engine, client) =
        crate::common::unprivileged_engine(dir.path(), &["--workspace", &workspace]).await;
    let quota = err(&client, "volume_create", json!({"name": "v", "size_mb": 8})).await;
    assert!(quota.contains("cannot enforce volume quotas"), "{quota}");
    ok(&client, "volume_create", json!({"name": "v"})).await;
    let mounts = json!([
        {"name": "v", "path": "/v"},
        {"name": "repo", "path": "/root/repo"}
    ]);
    let a = create_with(&client, mounts.clone()).await;
    let b = create_with(&client, mounts).await;
    sh(
        &client,
        &a,
        "echo shared > /v/f && echo sandbox >> /root/repo/a.txt",
    )
    .await;
    assert_eq!(
        sh(&client, &b, "cat /v/f /root/repo/a.txt").await,
        "shared\nhost\n"
    );
    let changes = ok(
        &client,
        "sandbox_workspace_changes",
        json!({"sandbox_id": a, "name": "repo"}),
    )
    .await;
    assert!(
        changes["patch"].as_str().unwrap().contains("+sandbox"),
        "{changes}"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("a.txt")).unwrap(),
        "host\n"
    );
    for id in [&a, &b] {
        ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    }
    drop(engine);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_asked_to_keep_volumes_puts_them_back() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(&client, "volume_create", json!({"name": "kept"})).await;
    let mount = json!([{"name": "kept", "path": "/k"}]);
    let id = create_with(&client, mount.clone()).await;
    let other = create_with(&client, mount).await;
    sh(
        &client,
        &id,
        "mkdir -p /k/d && echo 1 > /k/d/v && echo 1 > /k/gone",
    )
    .await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id, "volumes": true}),
    )
    .await;
    sh(
        &client,
        &id,
        "echo 2 > /k/d/v && rm /k/gone && echo new > /k/new",
    )
    .await;
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
    // Back as they were, for every sandbox that mounts the volume.
    assert_eq!(
        sh(&client, &id, "cat /k/d/v /k/gone; ls /k").await,
        "1\n1\nd\ngone\n"
    );
    assert_eq!(
        sh(&client, &other, "cat /k/d/v; ls /k").await,
        "1\nd\ngone\n"
    );
    // The kept copy goes with the snapshot.
    let volumes = engine.data_dir().join("sandboxes/.volumes");
    let kept = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("snap_")
            })
            .count()
    };
    assert_eq!(kept(&volumes), 1);
    ok(
        &client,
        "sandbox_snapshot_delete",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
    assert_eq!(kept(&volumes), 0);
}

/// A snapshot that keeps a volume copies it while the other sandboxes that mount it go on
/// writing: files, directories and hard links made and deleted meanwhile never make it fail,
/// and it keeps what stood still.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_is_kept_while_another_sandbox_writes_to_it() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(&client, "volume_create", json!({"name": "busy"})).await;
    let mount = json!([{"name": "busy", "path": "/k"}]);
    let (a, b) = (
        create_with(&client, mount.clone()).await,
        create_with(&client, mount).await,
    );
    sh(&client, &a, "echo still > /k/still").await;
    let writer = "import os, shutil\n\
                  while True:\n    \
                  os.makedirs('/k/d/s', exist_ok=True)\n    \
                  for i in range(200):\n        \
                  open(f'/k/d/s/f{i}', 'w').write('x')\n        \
                  os.link(f'/k/d/s/f{i}', f'/k/d/h{i}')\n    \
                  shutil.rmtree('/k/d')\n";
    sh(
        &client,
        &b,
        &format!("cat > /tmp/w.py <<'EOF'\n{writer}EOF"),
    )
    .await;
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": b, "command": "exec python3 /tmp/w.py", "background": true}),
    )
    .await;
    // Once the writer has begun.
    let snaps = keep_volumes_once(&client, &a, "[ -d /k/d ]", 5).await;
    ok(&client, "sandbox_kill", json!({"sandbox_id": b})).await;
    sh(&client, &a, "rm -rf /k/still /k/d").await;
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": a, "snapshot_id": snaps[4]}),
    )
    .await;
    assert_eq!(sh(&client, &a, "cat /k/still").await, "still\n");
}
