//! A sandbox's life: created, used, paused, resumed, killed — and what each step leaves in the
//! records and on the driver.

use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::CreateRequest;
use sandbox_mcp_engine::state::Status;

use super::harness::{Engine, host_path, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_is_created_used_paused_resumed_and_killed() {
    let engine = Engine::open().await;
    let req = CreateRequest {
        env: vec![("GREETING".into(), "hello".into())],
        ..CreateRequest::default()
    };
    let id = engine.create_with(req).await;
    // Committed as running, with an agent and a slot.
    assert_eq!(engine.stored_status(&id), Some(Status::Running));
    engine.assert_only(&[&id], &[&id]);
    assert_eq!(engine.fake.starts(&id), 1);

    // Commands run with the sandbox's environment, in its working directory, and end as they say.
    assert_eq!(
        engine.run(&id, "printenv GREETING; pwd").await,
        "hello\n/root\n"
    );
    let result = engine
        .exec(&id, "echo kept > notes.txt && cat /root/notes.txt; exit 3")
        .await
        .unwrap();
    assert_eq!(result.outcome.exit_code, Some(3));
    assert_eq!(result.outcome.stdout, "kept\n");
    assert!(!result.oom_killed);
    let result = engine.exec(&id, "cat missing || echo no").await.unwrap();
    assert_eq!(result.outcome.stdout, "no\n");
    assert!(result.outcome.stderr.contains("missing"), "{result:?}");

    // Files written through the agent are the sandbox's, on the driver's storage.
    engine.write(&id, "/root/data.bin", b"\x00\x01bytes").await;
    assert_eq!(
        engine.read(&id, "data.bin").await.unwrap(),
        b"\x00\x01bytes"
    );
    assert_eq!(
        std::fs::read(host_path(&engine.fake, &id, "/root/notes.txt")).unwrap(),
        b"kept\n"
    );
    let missing = engine.read(&id, "/nowhere").await.unwrap_err();
    assert!(matches!(missing, EngineError::NotFound(_)), "{missing:?}");

    // Paused: frozen on the driver and in the records.
    let view = engine.manager.lifecycle.pause(&id, None).await.unwrap();
    assert_eq!(view.record.status, Status::Paused);
    assert!(engine.fake.is_frozen(&id));
    assert_eq!(engine.stored_status(&id), Some(Status::Paused));
    // A command resumes it: thawed, not restarted.
    assert_eq!(engine.run(&id, "cat notes.txt").await, "kept\n");
    assert!(!engine.fake.is_frozen(&id));
    assert_eq!(engine.status(&id).await, Status::Running);
    assert_eq!(engine.stored_status(&id), Some(Status::Running));
    assert_eq!(engine.fake.starts(&id), 1);

    // Killed: nothing of it is left anywhere, and it answers as unknown.
    engine.manager.lifecycle.kill(&id, None).await.unwrap();
    engine.assert_only(&[], &[]);
    let after = engine.exec(&id, "true").await.unwrap_err();
    assert!(matches!(after, EngineError::NotFound(_)), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_keep_their_own_files_and_slots() {
    let engine = Engine::open().await;
    let a = engine.create().await;
    let b = engine.create().await;
    assert_ne!(engine.slot_of(&a), engine.slot_of(&b));
    engine.run(&a, "echo a > /root/who").await;
    engine.run(&b, "echo b > /root/who").await;
    assert_eq!(engine.run(&a, "cat who").await, "a\n");
    assert_eq!(engine.run(&b, "cat who").await, "b\n");
    engine.manager.lifecycle.kill(&a, None).await.unwrap();
    engine.assert_only(&[&b], &[&b]);
    assert_eq!(engine.run(&b, "cat who").await, "b\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_leaves_no_record_slot_or_files() {
    let engine = Engine::open().await;
    engine.fake.fail_starts(1);
    let err = engine
        .manager
        .pools
        .create(CreateRequest::default())
        .await
        .unwrap_err();
    // The launcher's report reaches the caller.
    assert!(
        matches!(&err, EngineError::Sandbox(m) if m.contains("told to fail")),
        "{}",
        text(&err)
    );
    engine.assert_only(&[], &[]);
    // The next one starts.
    let id = engine.create().await;
    engine.assert_only(&[&id], &[&id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_streams_as_it_comes_and_a_dropped_stream_cancels_the_command() {
    use futures::StreamExt as _;
    use sandbox_mcp_engine::services::Event;

    let engine = Engine::open().await;
    let id = engine.create().await;
    let spec = |command: &str| sandbox_mcp_protocol::ExecSpec {
        command: command.into(),
        cwd: None,
        env: Vec::new(),
        timeout_ms: 10_000,
        max_output_bytes: 1024,
        stream: true,
    };
    let deadline = std::time::Duration::from_secs(20);
    let events: Vec<_> = engine
        .manager
        .agent
        .stream(&id, None, spec("echo one; echo two"), deadline)
        .await
        .unwrap()
        .collect()
        .await;
    let texts: Vec<String> = events
        .iter()
        .map(|e| match e {
            Ok(Event::Output(o)) => o.data.clone(),
            Ok(Event::Reply(r)) => format!("reply {:?}", r.exit_code),
            Err(e) => format!("error {e}"),
        })
        .collect();
    assert_eq!(texts, ["one\n", "two\n", "reply Some(0)"]);

    // The caller goes away after the first line: the command ends there.
    let mut stream = Box::pin(
        engine
            .manager
            .agent
            .stream(
                &id,
                None,
                spec("echo one; sleep 0.5; echo late > /root/late"),
                deadline,
            )
            .await
            .unwrap(),
    );
    assert!(matches!(stream.next().await, Some(Ok(Event::Output(_)))));
    drop(stream);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(!host_path(&engine.fake, &id, "/root/late").exists());
    // The agent itself is fine.
    assert_eq!(engine.run(&id, "echo ok").await, "ok\n");
    assert_eq!(engine.fake.starts(&id), 1);
}
