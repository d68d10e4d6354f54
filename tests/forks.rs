//! Snapshots, forks, diffs and merges through MCP against the real engine: on the btrfs store
//! (copy-on-write snapshots) and on the copy path (a plain store), file by file.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{
    TestEngine, api, create, err, ok, sh, snapshot_and_restore, spawn_engine_process_env,
};
use crate::require_sandboxes;
use sandbox_mcp_model::config::DiskLimits;

/// The store each test runs on, and the method its copies must report.
fn method_of(disk: DiskLimits) -> &'static str {
    match disk {
        DiskLimits::Off => "copy",
        _ => "btrfs",
    }
}

/// An engine on the store `disk`, or `None` (with the reason printed) when the btrfs store
/// cannot be had here.
async fn engine_on(disk: DiskLimits) -> Option<TestEngine> {
    let engine = TestEngine::start_with(|c| c.disk_limits = disk).await;
    if disk != DiskLimits::Off && !engine.manager.driver().capabilities().disk_limits_enforced {
        assert!(
            std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
            "a btrfs sandbox store is required (root, btrfs in the kernel, mkfs.btrfs)"
        );
        eprintln!(
            "skipping the btrfs half: no btrfs sandbox store (root, btrfs in the kernel, mkfs.btrfs)"
        );
        return None;
    }
    Some(engine)
}

fn ids(v: &Value) -> Vec<String> {
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_string())
        .collect()
}

/// path → change of a diff's entries.
fn changes(diff: &Value) -> Vec<(String, String, Value)> {
    diff["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["change"].as_str().unwrap().to_string(),
                e["what"].clone(),
            )
        })
        .collect()
}

async fn fork_family(disk: DiskLimits) {
    let Some(engine) = engine_on(disk).await else {
        return;
    };
    let client = engine.mcp().await;
    let parent = create(&client).await;
    sh(
        &client,
        &parent,
        "mkdir -p /root/app && cd /root/app && printf 'def f():\\n    return 1\\n' > lib.py \
         && echo 'print(1)' > main.py && echo keep > README && seq 1 1000 > data.txt \
         && chown 1234:2345 data.txt && chmod 640 data.txt",
    )
    .await;
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": parent, "count": 3}),
    )
    .await;
    assert_eq!(forked["method"], method_of(disk), "{forked}");
    let kids = ids(&forked);
    assert_eq!(kids.len(), 3);
    for kid in &kids {
        let got = ok(&client, "sandbox_info", json!({"sandbox_id": kid})).await;
        assert_eq!(got["metadata"]["forked_from"], parent.as_str(), "{got}");
        assert_eq!(got["status"], "running", "{got}");
        // Every file, with its owner and mode as the parent had them (a fork's files keep the
        // parent's host ids and are mapped, never rewritten).
        assert_eq!(
            sh(&client, kid, "cd /root/app && stat -c '%u:%g %a' data.txt && md5sum data.txt main.py lib.py README | cut -c1-8").await,
            sh(&client, &parent, "cd /root/app && stat -c '%u:%g %a' data.txt && md5sum data.txt main.py lib.py README | cut -c1-8").await,
        );
    }
    // Three different fixes.
    sh(&client, &kids[0], "echo 'print(2)' > /root/app/main.py").await;
    sh(&client, &kids[1], "printf 'def f():\\n    return 2\\n' > /root/app/lib.py && echo new > /root/app/NEW && chown 77:88 /root/app/NEW").await;
    sh(
        &client,
        &kids[2],
        "rm /root/app/README && chmod 600 /root/app/data.txt",
    )
    .await;
    // Nothing leaks between family members.
    assert_eq!(
        sh(&client, &parent, "cat /root/app/main.py; ls /root/app").await,
        "print(1)\nREADME\ndata.txt\nlib.py\nmain.py\n"
    );
    assert_eq!(
        sh(&client, &kids[1], "cat /root/app/main.py").await,
        "print(1)\n"
    );
    // Owners survive a restart of the child's agent too (its directory is mapped anew).
    ok(&client, "sandbox_pause", json!({"sandbox_id": kids[1]})).await;
    assert_eq!(
        sh(
            &client,
            &kids[1],
            "stat -c '%u:%g' /root/app/NEW /root/app/data.txt"
        )
        .await,
        "77:88\n1234:2345\n"
    );

    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": kids[1], "against": kids[0]}),
    )
    .await;
    assert_eq!(
        (
            d["added"].as_u64(),
            d["removed"].as_u64(),
            d["modified"].as_u64()
        ),
        (Some(1), Some(0), Some(2)),
        "{d}"
    );
    let c = changes(&d);
    assert_eq!(c[0].0, "/root/app/NEW");
    assert_eq!(c[0].1, "added");
    assert_eq!(
        c[1],
        (
            "/root/app/lib.py".into(),
            "modified".into(),
            json!(["content"])
        )
    );
    assert_eq!(
        c[2],
        (
            "/root/app/main.py".into(),
            "modified".into(),
            json!(["content"])
        )
    );
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": kids[2], "against": parent}),
    )
    .await;
    assert_eq!(
        changes(&d),
        vec![
            ("/root/app/README".into(), "removed".into(), json!([])),
            (
                "/root/app/data.txt".into(),
                "modified".into(),
                json!(["mode"])
            ),
        ],
        "{d}"
    );
    // The diff of a subtree only, and the full list saved for the file tools.
    let d = ok(&client, "sandbox_diff", json!({"sandbox_id": kids[1], "against": parent, "path": "/root/app/NEW", "save_to": "/tmp/changes.txt"})).await;
    assert_eq!(d["added"], 1, "{d}");
    assert_eq!(d["saved_to"], "/tmp/changes.txt");
    assert_eq!(
        sh(&client, &kids[1], "cat /tmp/changes.txt").await,
        "A file 4 /root/app/NEW\n"
    );

    // The winner's files become the parent's; the winner is gone; the parent keeps its id.
    let m = ok(
        &client,
        "sandbox_merge_into",
        json!({"sandbox_id": parent, "source_id": kids[1]}),
    )
    .await;
    assert_eq!(m["source_killed"], true, "{m}");
    assert_eq!(m["method"], method_of(disk));
    assert_eq!(
        sh(
            &client,
            &parent,
            "cd /root/app && cat lib.py main.py NEW && stat -c '%u:%g' NEW data.txt && ls"
        )
        .await,
        "def f():\n    return 2\nprint(1)\nnew\n77:88\n1234:2345\nNEW\nREADME\ndata.txt\nlib.py\nmain.py\n"
    );
    let gone = err(&client, "sandbox_info", json!({"sandbox_id": kids[1]})).await;
    assert!(gone.contains("not found"), "{gone}");
    // Against the other sibling, the parent now differs by the winner's fix (and the list the
    // winner saved).
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": parent, "against": kids[0]}),
    )
    .await;
    let paths: Vec<String> = changes(&d).into_iter().map(|c| c.0).collect();
    assert_eq!(
        paths,
        [
            "/root/app/NEW",
            "/root/app/lib.py",
            "/root/app/main.py",
            "/tmp/changes.txt"
        ],
        "{d}"
    );
    // A merge of unrelated sandboxes is refused unless forced.
    let stranger = create(&client).await;
    sh(&client, &stranger, "echo mine > /root/own").await;
    let e = err(
        &client,
        "sandbox_merge_into",
        json!({"sandbox_id": parent, "source_id": stranger}),
    )
    .await;
    assert!(e.contains("unrelated") && e.contains("force"), "{e}");
    ok(
        &client,
        "sandbox_merge_into",
        json!({"sandbox_id": kids[2], "source_id": stranger, "force": true}),
    )
    .await;
    assert_eq!(
        sh(&client, &kids[2], "ls /root/app 2>&1 | head -1").await,
        "ls: cannot access '/root/app': No such file or directory\n"
    );
    // The stranger's files keep their owner in the target, whose host ids are not theirs.
    assert_eq!(
        sh(
            &client,
            &kids[2],
            "stat -c '%u:%g' /root/own && cat /root/own"
        )
        .await,
        "0:0\nmine\n"
    );
}

#[tokio::test]
async fn a_fork_family_diverges_diffs_and_merges_on_btrfs() {
    require_sandboxes!();
    fork_family(DiskLimits::Auto).await;
}

#[tokio::test]
async fn a_fork_family_diverges_diffs_and_merges_on_the_copy_path() {
    require_sandboxes!();
    fork_family(DiskLimits::Off).await;
}

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
    assert_eq!(snap["method"], method_of(disk), "{snap}");
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

/// On the copy path each snapshot counts at its size when taken.
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
    assert_eq!(s1["method"], "copy");
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

/// Special files, loops, unprintable names and permission-only changes in a diff.
#[tokio::test]
async fn diffs_of_special_files_loops_odd_names_and_modes() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let a = create(&client).await;
    sh(&client, &a, "mkdir /root/t && cd /root/t && ln -s l2 l1 && ln -s l1 l2 && mkfifo p && echo x > same && chmod 600 same && touch \"$(printf 'new\\nline')\" \"$(printf 'bad\\377byte')\" 'back\\slash'").await;
    let b = ids(&ok(&client, "sandbox_fork", json!({"sandbox_id": a})).await).remove(0);
    sh(&client, &b, "cd /root/t && chmod 644 same && rm p && mkfifo q && ln -sfn elsewhere l1 && mkdir -p deep && cd deep && for i in $(seq 1 50); do mkdir d && cd d; done").await;
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": b, "against": a, "path": "/root/t"}),
    )
    .await;
    let c = changes(&d);
    let find = |p: &str| c.iter().find(|e| e.0 == p).cloned();
    assert_eq!(find("/root/t/same").unwrap().2, json!(["mode"]), "{d}");
    assert_eq!(find("/root/t/l1").unwrap().2, json!(["target"]), "{d}");
    assert_eq!(find("/root/t/p").unwrap().1, "removed");
    assert_eq!(find("/root/t/q").unwrap().1, "added");
    assert_eq!(d["added"], 52, "q, deep and 50 nested directories: {d}");
    // The odd names are untouched: present on both sides, so not listed.
    assert!(
        c.iter()
            .all(|e| !e.0.contains("line") && !e.0.contains("byte")),
        "{d}"
    );
    // And are written so that each is one printable, distinct line.
    sh(
        &client,
        &b,
        "cd /root/t && rm \"$(printf 'new\\nline')\" \"$(printf 'bad\\377byte')\" 'back\\slash'",
    )
    .await;
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": b, "against": a, "path": "/root/t"}),
    )
    .await;
    let removed: Vec<String> = changes(&d)
        .into_iter()
        .filter(|e| e.1 == "removed")
        .map(|e| e.0)
        .collect();
    assert!(
        removed.contains(&"/root/t/new\\x0aline".to_string()),
        "{removed:?}"
    );
    assert!(
        removed.contains(&"/root/t/bad\\xffbyte".to_string()),
        "{removed:?}"
    );
    assert!(
        removed.contains(&"/root/t/back\\\\slash".to_string()),
        "{removed:?}"
    );
    // A capped listing keeps the counts exact.
    let (status, capped) = api(
        &engine.url,
        "POST",
        &format!("/v1/sandboxes/{b}/diff"),
        Some(json!({"against": a, "limit": 3})),
    )
    .await;
    assert_eq!(status, 200, "{capped}");
    assert_eq!(capped["entries"].as_array().unwrap().len(), 3);
    assert_eq!(capped["truncated"], true);
    assert!(capped["added"].as_u64().unwrap() >= 52, "{capped}");
}

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
    // The copy path takes long enough to be caught in the middle.
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
    let (status, snap) = api(
        &url,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    run("echo after > /root/w/marker").await;

    for what in ["fork", "restore", "snapshot", "merge"] {
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

/// Unprivileged (every file the engine user's, a plain store), the same tools work by copying.
#[tokio::test]
async fn an_unprivileged_engine_forks_snapshots_and_merges_by_copying() {
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the suite already runs unprivileged (the other fork tests cover it)");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let (mut engine, client) = crate::common::unprivileged_engine(dir.path(), &[]).await;
    let id = create(&client).await;
    sh(
        &client,
        &id,
        "mkdir /root/p && echo one > /root/p/f && chmod 4755 /root/p/f",
    )
    .await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id}),
    )
    .await;
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "count": 2}),
    )
    .await;
    let kids = ids(&forked);
    sh(&client, &kids[0], "echo two > /root/p/f").await;
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": kids[0], "against": kids[1]}),
    )
    .await;
    let merged = ok(
        &client,
        "sandbox_merge_into",
        json!({"sandbox_id": id, "source_id": kids[0]}),
    )
    .await;
    let after_merge = sh(&client, &id, "cat /root/p/f").await;
    let restored = ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
    let after_restore = sh(&client, &id, "cat /root/p/f; stat -c %a /root/p/f").await;
    let _ = engine.kill();
    let _ = engine.wait();
    for v in [&snap, &forked, &merged, &restored] {
        assert_eq!(v["method"], "copy", "{v}");
    }
    // Writing to a setuid file clears the bit: the mode differs too.
    assert_eq!(
        changes(&d),
        vec![(
            "/root/p/f".to_string(),
            "modified".to_string(),
            json!(["content", "mode"])
        )],
        "{d}"
    );
    assert_eq!(after_merge, "two\n");
    assert_eq!(after_restore, "one\n4755\n");
}

/// What the tools say a fork carries over and a restore keeps: egress rules, secret bindings
/// (a child gets its own stand-in), environment and preview URLs.
#[tokio::test]
async fn forks_and_restores_keep_rules_secrets_environment_and_previews() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (status, made) = api(
        &engine.url,
        "POST",
        "/v1/sandboxes",
        Some(json!({"env_vars": {"MARK": "kept"}, "network": {"allow_out": ["example.test"]}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let (status, secret) = api(
        &engine.url,
        "PUT",
        "/v1/secrets/tok",
        Some(json!({"hosts": ["api.example.test"], "value": "the-value"})),
    )
    .await;
    assert!((200..300).contains(&status), "{secret}");
    ok(
        &client,
        "sandbox_attach_secret",
        json!({"sandbox_id": id, "env": "TOKEN", "secret": "tok"}),
    )
    .await;
    let preview = ok(
        &client,
        "sandbox_preview_create",
        json!({"sandbox_id": id, "port": 8000}),
    )
    .await;
    let standin = sh(&client, &id, "echo $MARK $TOKEN").await;

    let kid = ids(&ok(&client, "sandbox_fork", json!({"sandbox_id": id})).await).remove(0);
    let (parent, child) = (
        ok(&client, "sandbox_info", json!({"sandbox_id": id})).await,
        ok(&client, "sandbox_info", json!({"sandbox_id": kid})).await,
    );
    assert_eq!(child["network"], parent["network"], "{child}");
    assert_eq!(
        child["secrets"],
        json!([{"env": "TOKEN", "secret": "tok"}]),
        "{child}"
    );
    let child_env = sh(&client, &kid, "echo $MARK $TOKEN").await;
    assert!(child_env.starts_with("kept "), "{child_env}");
    assert!(
        !child_env.contains("the-value"),
        "the value never enters a sandbox"
    );
    assert_ne!(child_env, standin, "a child gets its own stand-in");

    snapshot_and_restore(&client, &id).await;
    let after = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(after["network"], parent["network"]);
    assert_eq!(after["secrets"], parent["secrets"]);
    assert_eq!(sh(&client, &id, "echo $MARK $TOKEN").await, standin);
    let previews = ok(&client, "sandbox_preview_list", json!({"sandbox_id": id})).await;
    assert_eq!(previews["previews"][0]["url"], preview["url"], "{previews}");
}
