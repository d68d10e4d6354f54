//! What else the host can do to a sandbox: run a command out of memory (reported on the
//! command's result and counted), or make the sandbox vanish (forgotten, with the reason kept
//! for the caller).

use sandbox_mcp_engine::error::EngineError;

use super::harness::Engine;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_killed_for_memory_is_reported_and_counted() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.fake.oom_next_exec(&id);
    let result = engine.exec(&id, "echo hi").await.unwrap();
    assert!(result.oom_killed, "{result:?}");
    assert_eq!(result.outcome.signal, Some(9));
    assert_eq!(result.outcome.exit_code, None);
    // The command that ran out of memory by itself is reported alike.
    let result = engine
        .exec(&id, "echo some; oom-kill; echo never")
        .await
        .unwrap();
    assert!(result.oom_killed);
    assert_eq!(result.outcome.stdout, "some\n");
    let metrics = engine.manager.lifecycle.metrics(&id, None).await.unwrap();
    assert_eq!(metrics.usage.oom_kills, 2);
    assert_eq!(engine.fake.oom_kills_of(&id), 2);
    // The sandbox lives on; the next command is not blamed for the last one.
    let result = engine.exec(&id, "echo fine").await.unwrap();
    assert!(!result.oom_killed);
    assert_eq!(result.outcome.exit_code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_vanished_is_forgotten_with_its_reason() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    let other = engine.create().await;
    let slot = engine.slot_of(&id);
    engine.fake.gone(&id, "its node was drained");
    let err = engine.exec(&id, "true").await.unwrap_err();
    assert!(
        matches!(&err, EngineError::Gone(m) if m.contains("its node was drained")),
        "{err:?}"
    );
    // Not listed nor stored, its slot released; later calls are told why, as `gone`.
    assert!(!engine.listed().contains(&id));
    assert_eq!(engine.stored_status(&id), None);
    assert!(!engine.fake.slots().contains(&slot));
    assert_eq!(engine.fake.slots(), [engine.slot_of(&other)]);
    assert_eq!(engine.fake.sandbox_dirs(), [other.as_str()]);
    let again = engine
        .manager
        .lifecycle
        .get(&id, None, false)
        .await
        .unwrap_err();
    assert!(
        matches!(&again, EngineError::Gone(m) if m.contains("its node was drained")),
        "{again:?}"
    );
    // The other sandbox is untouched.
    assert_eq!(engine.run(&other, "echo ok").await, "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_vanishes_mid_command_is_reported_gone() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    let fake = engine.fake.clone();
    let target = id.clone();
    // Whether it goes before the command reaches the agent or while it runs, the caller is
    // told the sandbox is gone.
    let vanish = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        fake.gone(&target, "sandbox gone: its pod was evicted");
    });
    let err = engine.exec(&id, "sleep 30").await.unwrap_err();
    vanish.await.unwrap();
    assert!(
        matches!(&err, EngineError::Gone(m) if m.contains("gone")),
        "{err:?}"
    );
    assert!(!engine.listed().contains(&id));
}
