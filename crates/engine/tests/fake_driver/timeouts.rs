//! Deadlines: an agent that stops answering makes a call fail with the engine's actionable error
//! within its deadline (never a hang), and is replaced at the next call; a command that
//! outlives its own timeout is the agent's to end, and the agent stays.

use std::time::Duration;

use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::state::Status;
use sandbox_mcp_protocol::Ping;

use super::harness::{Engine, GRACE, PATIENCE, timed};

/// The engine's message for a wedged agent, and what it tells the caller to expect.
fn wedged(e: &EngineError) -> bool {
    matches!(e, EngineError::Sandbox(m)
        if m.contains("stopped answering") && m.contains("next call restarts it"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_fails_a_command_within_its_deadline_and_is_replaced() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.run(&id, "echo kept > /root/k").await;
    engine.fake.hang(&id);

    let (result, took) = timed(engine.exec_for(&id, "echo hi", 1_000)).await;
    let err = result.unwrap_err();
    assert!(wedged(&err), "{err:?}");
    // No sooner than the command's timeout and the grace (the engine waited as it should)…
    assert!(took >= Duration::from_millis(1_000) + GRACE, "{took:?}");
    // …and well within the test's patience (checked by `timed`).
    assert!(took < PATIENCE);
    // Its processes were stopped: paused, no agent.
    assert!(engine.fake.running().is_empty());
    assert_eq!(engine.status(&id).await, Status::Paused);

    // The next call restarts it on its files.
    assert_eq!(engine.run(&id, "cat k").await, "kept\n");
    assert_eq!(engine.fake.starts(&id), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_hangs_mid_command_is_given_up_on_likewise() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    let (result, _) = timed(engine.exec_for(&id, "echo hi; agent-hang", 1_000)).await;
    assert!(wedged(result.as_ref().unwrap_err()), "{result:?}");
    assert_eq!(engine.run(&id, "echo back").await, "back\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_fails_any_call_within_the_deadline_given() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    engine.fake.hang(&id);
    let deadline = Duration::from_millis(300);
    let (result, took) = timed(engine.manager.agent.call(&id, None, Ping {}, deadline)).await;
    assert!(wedged(result.as_ref().unwrap_err()), "{result:?}");
    assert!(took >= deadline, "{took:?}");
    assert!(engine.fake.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_agent_that_still_answers_a_ping_is_a_timeout_and_is_kept() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    // The command outlives the call's deadline, but the agent answers pings meanwhile.
    let spec = sandbox_mcp_protocol::ExecSpec {
        command: "sleep 20".into(),
        cwd: None,
        env: Vec::new(),
        timeout_ms: 30_000,
        max_output_bytes: 1024,
        stream: false,
    };
    let deadline = Duration::from_millis(300);
    let (result, _) = timed(engine.manager.agent.call(&id, None, spec, deadline)).await;
    let err = result.unwrap_err();
    assert!(matches!(err, EngineError::Timeout(_)), "{err:?}");
    // Not wedged: kept running, not restarted.
    assert_eq!(engine.fake.running(), [id.as_str()]);
    assert_eq!(engine.run(&id, "echo still").await, "still\n");
    assert_eq!(engine.fake.starts(&id), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_own_timeout_is_ended_by_the_agent() {
    let engine = Engine::open().await;
    let id = engine.create().await;
    let (result, took) = timed(engine.exec_for(&id, "echo partial; sleep 60", 300)).await;
    let outcome = result.unwrap().outcome;
    assert!(outcome.timed_out, "{outcome:?}");
    assert_eq!(outcome.exit_code, None);
    assert_eq!(outcome.signal, Some(9));
    assert_eq!(outcome.stdout, "partial\n");
    assert!(took < Duration::from_secs(30), "{took:?}");
    // The agent is fine: same one, still answering.
    assert_eq!(engine.run(&id, "echo ok").await, "ok\n");
    assert_eq!(engine.fake.starts(&id), 1);
}
