//! Fork families: forks of a sandbox (and of forks) diverge, their diffs say exactly what changed,
//! and merges bring changes back; on both stores, and by copying on an unprivileged engine.

use serde_json::json;

use crate::common::{create, err, ok, sh};
use crate::require_sandboxes;
use sandbox_mcp_model::config::DiskLimits;

use super::{changes, engine_on, ids, method_of, stacked_method_of};

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
    assert_eq!(forked["method"], stacked_method_of(disk), "{forked}");
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

/// Unprivileged (every file the engine user's, a plain store, no cgroups to count processes
/// by), the same tools work: a snapshot, a fork and a restore stack layers, a merge copies.
#[tokio::test]
async fn an_unprivileged_engine_forks_snapshots_and_merges_by_stacking_and_copying() {
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the suite already runs unprivileged (the other fork tests cover it)");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let (engine, client) = crate::common::unprivileged_engine(dir.path(), &[]).await;
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
    drop(engine);
    // A restore of a stacked snapshot copies nothing either.
    for v in [&snap, &forked, &restored] {
        assert_eq!(v["method"], "layers", "{v}");
    }
    assert_eq!(merged["method"], "copy", "{merged}");
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
