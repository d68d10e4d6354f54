//! Forks and snapshots on the fake's storage: children start from their parent's files, and a
//! fork that fails part-way — a copy, or a child's start — leaves no child behind: no record,
//! no slot, no files, no agent.

use std::collections::BTreeMap;

use sandbox_mcp_engine::error::EngineError;

use super::harness::{Engine, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_s_children_start_from_their_parent_s_files() {
    let engine = Engine::open().await;
    let parent = engine.create().await;
    engine
        .run(&parent, "mkdir -p /root/src && echo v1 > /root/src/main")
        .await;
    let labels = BTreeMap::from([("job".to_string(), "try".to_string())]);
    let forked = engine
        .manager
        .snapshots
        .fork(&parent, None, 2, labels, None, false)
        .await
        .unwrap();
    assert_eq!(forked.ids.len(), 2);
    for child in &forked.ids {
        assert_eq!(engine.run(child, "cat src/main").await, "v1\n");
        let record = engine
            .manager
            .lifecycle
            .get(child, None, false)
            .await
            .unwrap()
            .record;
        assert_eq!(record.metadata["forked_from"], parent);
        assert_eq!(record.metadata["job"], "try");
    }
    // Each child's files are its own from then on.
    engine.run(&forked.ids[0], "echo v2 > src/main").await;
    assert_eq!(engine.run(&parent, "cat src/main").await, "v1\n");
    assert_eq!(engine.run(&forked.ids[1], "cat src/main").await, "v1\n");
    let all = [parent.as_str(), &forked.ids[0], &forked.ids[1]];
    engine.assert_only(&all, &all);
    // The parent was thawed after the copy.
    assert!(!engine.fake.is_frozen(&parent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_failing_on_the_kth_child_leaves_no_child_behind() {
    let engine = Engine::open().await;
    let parent = engine.create().await;
    engine.run(&parent, "echo mine > /root/f").await;
    // The first two copies are made, the third fails.
    engine.fake.fail_clone_after(2);
    let err = engine
        .manager
        .snapshots
        .fork(&parent, None, 4, BTreeMap::new(), None, false)
        .await
        .err()
        .expect("the fork failed");
    assert!(matches!(err, EngineError::Host(_)), "{err:?}");
    // No record, slot, directory or agent of any child; the parent as it was, thawed.
    engine.assert_only(&[&parent], &[&parent]);
    assert!(!engine.fake.is_frozen(&parent));
    assert_eq!(engine.run(&parent, "cat f").await, "mine\n");
    // The next fork works.
    let forked = engine
        .manager
        .snapshots
        .fork(&parent, None, 1, BTreeMap::new(), None, false)
        .await
        .unwrap();
    assert_eq!(engine.run(&forked.ids[0], "cat f").await, "mine\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_fails_to_start_takes_its_siblings_with_it() {
    let engine = Engine::open().await;
    let parent = engine.create().await;
    engine.fake.fail_starts(1);
    let err = engine
        .manager
        .snapshots
        .fork(&parent, None, 3, BTreeMap::new(), None, false)
        .await
        .err()
        .expect("the fork failed");
    assert!(
        matches!(&err, EngineError::Sandbox(m) if m.contains("told to fail")),
        "{}",
        text(&err)
    );
    // The siblings that did start are stopped and deleted too.
    engine.assert_only(&[&parent], &[&parent]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_brings_back_a_snapshot_s_files_and_a_failed_snapshot_leaves_none() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.run(&id, "echo v1 > /root/f").await;
    let snap = engine
        .manager
        .snapshots
        .snapshot_create(&id, None, Some("first".into()), false, false)
        .await
        .unwrap();
    assert_eq!(engine.fake.snapshot_dirs(), [snap.id.as_str()]);
    engine
        .run(&id, "echo v2 > /root/f && touch /root/new")
        .await;

    let restored = engine
        .manager
        .snapshots
        .snapshot_restore(&id, None, &snap.id)
        .await
        .unwrap();
    assert_eq!(restored.snapshot.id, snap.id);
    // The old files, under a fresh agent.
    assert_eq!(engine.run(&id, "cat f; ls /root").await, "v1\nf\n");
    assert_eq!(engine.fake.starts(&id), 2);

    // A snapshot whose copy fails is not listed, and leaves no files.
    engine.fake.fail_clone_after(0);
    let err = engine
        .manager
        .snapshots
        .snapshot_create(&id, None, None, false, false)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Host(_)), "{err:?}");
    let listed = engine
        .manager
        .snapshots
        .snapshot_list(&id, None)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(engine.fake.snapshot_dirs(), [snap.id.as_str()]);
    // Killing the sandbox takes its snapshots' files with it.
    engine.manager.lifecycle.kill(&id, None).await.unwrap();
    assert!(engine.fake.snapshot_dirs().is_empty());
    engine.assert_only(&[], &[]);
}
