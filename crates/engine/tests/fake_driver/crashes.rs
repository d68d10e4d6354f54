//! An agent that dies: mid-command the caller is told so in words, and the sandbox is restarted
//! on its files at the next call; between calls, the caller never notices.

use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::state::Status;

use super::harness::{Engine, text, timed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_dies_mid_command_is_reported_and_restarted_on_its_files() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.run(&id, "echo kept > /root/k").await;

    let (result, _) = timed(engine.exec(&id, "echo started; agent-crash; echo never")).await;
    let err = result.unwrap_err();
    // A clear error (not a timeout, not an internal one), saying what happened.
    assert!(
        matches!(&err, EngineError::Sandbox(m) if m.contains("closed the connection")),
        "{err:?}"
    );
    // The dead agent is not trusted again: the sandbox is stopped, paused in the records.
    assert!(engine.fake.running().is_empty());
    assert_eq!(engine.status(&id).await, Status::Paused);
    assert_eq!(engine.stored_status(&id), Some(Status::Paused));

    // The next call starts a fresh agent on the same files.
    assert_eq!(engine.run(&id, "cat k").await, "kept\n");
    assert_eq!(engine.fake.starts(&id), 2);
    assert_eq!(engine.status(&id).await, Status::Running);
    engine.assert_only(&[&id], &[&id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_agent_read_is_never_sent_again() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    // The agent reads the command, runs its first part and dies, with no answer at all: the
    // engine cannot tell how far it went, so it does not run it again.
    let err = engine
        .exec(&id, "echo ran >> /root/runs; agent-crash")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Sandbox(m) if m.contains("closed the connection")),
        "{err:?}"
    );
    assert_eq!(engine.run(&id, "cat runs").await, "ran\n");
    assert_eq!(engine.fake.starts(&id), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_died_between_calls_is_restarted_before_the_next() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.write(&id, "/root/k", b"kept").await;
    engine.fake.crash(&id);
    // Nothing had been sent: the engine restarts it and the caller never sees the crash.
    assert_eq!(engine.run(&id, "cat k").await, "kept");
    assert_eq!(engine.fake.starts(&id), 2);
    assert_eq!(engine.status(&id).await, Status::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_paused_is_repaired_on_resume() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.manager.lifecycle.pause(&id, None).await.unwrap();
    engine.fake.crash(&id);
    // Thawed, the sandbox has no agent; the command finds out and starts one.
    assert_eq!(engine.run(&id, "echo ok").await, "ok\n");
    assert_eq!(engine.fake.starts(&id), 2);
    assert!(!engine.fake.is_frozen(&id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_whose_restart_fails_says_why_and_tries_again_next_time() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.fake.crash(&id);
    engine.fake.fail_starts(1);
    let err = engine.exec(&id, "true").await.unwrap_err();
    assert!(
        matches!(&err, EngineError::Sandbox(m) if m.contains("told to fail")),
        "{}",
        text(&err)
    );
    // Still the caller's sandbox, stopped; the next call starts it.
    assert_eq!(engine.listed().len(), 1);
    assert_eq!(engine.run(&id, "echo back").await, "back\n");
    assert_eq!(engine.fake.starts(&id), 2);
}
