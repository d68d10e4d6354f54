//! An engine reopened on the same data dir: what it finds of each sandbox decides what it does —
//! a live agent is frozen and kept, a dead one is restarted on first use, a vanished sandbox's
//! record goes, and a create cut short is undone.

use sandbox_mcp_engine::services::CreateRequest;
use sandbox_mcp_engine::state::Status;

use super::harness::{Engine, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_of_the_engine_each_sandbox_is_taken_back_as_the_driver_finds_it() {
    let engine = Engine::open().await;
    let alive = engine.create().await;
    let died = engine.create().await;
    let vanished = engine.create().await;
    engine.run(&alive, "echo a > /root/f").await;
    engine.run(&died, "echo d > /root/f").await;

    // A create cut short by the crash: its record is `creating`, its directory made, its
    // start never finished.
    engine.fake.stall_starts(1);
    let manager = engine.manager.clone();
    let before = engine.fake.sandbox_dirs();
    let create = tokio::spawn(async move { manager.pools.create(CreateRequest::default()).await });
    until("the stalled start made its directory", || {
        engine.fake.sandbox_dirs().len() > before.len()
    })
    .await;
    let cut_short = engine
        .fake
        .sandbox_dirs()
        .into_iter()
        .find(|d| !before.contains(d))
        .unwrap();
    assert_eq!(engine.stored_status(&cut_short), Some(Status::Creating));
    create.abort();
    let _ = create.await;

    // While no engine runs, one agent dies and one sandbox is deleted behind its back.
    engine.fake.crash(&died);
    engine.fake.gone(&vanished, "deleted by an operator");
    let engine = engine.reopen().await;

    // Both that exist come back paused; what went and what was half-made is gone for good.
    assert_eq!(engine.status(&alive).await, Status::Paused);
    assert_eq!(engine.status(&died).await, Status::Paused);
    assert_eq!(engine.stored_status(&alive), Some(Status::Paused));
    assert!(engine.fake.is_frozen(&alive));
    assert_eq!(engine.stored_status(&vanished), None);
    assert_eq!(engine.stored_status(&cut_short), None);
    assert!(!engine.fake.sandbox_dirs().contains(&cut_short));
    engine.assert_only(&[&alive, &died], &[&alive]);

    // First use: the live one is thawed with its processes, the dead one started anew.
    assert_eq!(engine.run(&alive, "cat f").await, "a\n");
    assert_eq!(engine.fake.starts(&alive), 1);
    assert_eq!(engine.run(&died, "cat f").await, "d\n");
    assert_eq!(engine.fake.starts(&died), 2);
    engine.assert_only(&[&alive, &died], &[&alive, &died]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_pauses_and_the_next_engine_resumes_on_first_use() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.run(&id, "echo kept > /root/k").await;
    engine.manager.shutdown().await;
    // Frozen with its processes, recorded paused.
    assert!(engine.fake.is_frozen(&id));
    assert_eq!(engine.stored_status(&id), Some(Status::Paused));

    let engine = engine.reopen().await;
    assert_eq!(engine.status(&id).await, Status::Paused);
    assert_eq!(engine.run(&id, "cat k").await, "kept\n");
    assert_eq!(engine.fake.starts(&id), 1);
    assert_eq!(engine.status(&id).await, Status::Running);
    engine.assert_only(&[&id], &[&id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_cut_short_is_finished_by_the_next_engine() {
    let engine = Engine::open().await;
    let kept = engine.create().await;
    let killed = engine.create().await;
    // The engine crashed after marking the sandbox `killing`, before deleting anything.
    sandbox_mcp_engine::state::Store::open(&super::harness::config(engine.dir.path()).state_db())
        .unwrap()
        .set_status(&killed, Status::Killing)
        .unwrap();
    let engine = engine.reopen().await;
    assert_eq!(engine.stored_status(&killed), None);
    assert!(!engine.fake.sandbox_dirs().contains(&killed));
    // Its slot is released with the rest.
    engine.assert_only(&[&kept], &[&kept]);
}
