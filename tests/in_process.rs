//! A client in the engine's own process (the MCP server's embedded engine) calls the API without
//! a socket: the same router, so the same checks, and the same behaviour when it goes away.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{KEY, TestEngine, exec_streamed};
use crate::require_cgroups;
use sandbox_mcp_api::{ApiKey, Client, connect_to, types};

/// A client of `engine` in this process, with `key` and `tenant`, whose URL has no listener:
/// every call that worked went in process.
fn in_process(engine: &TestEngine, key: &str, tenant: Option<&str>) -> Client {
    in_process_at("http://127.0.0.1:9", engine, key, tenant)
}

fn in_process_at(url: &str, engine: &TestEngine, key: &str, tenant: Option<&str>) -> Client {
    let client = connect_to(
        url,
        Some(&ApiKey::new(key)),
        tenant,
        Some(engine.in_process()),
    )
    .unwrap();
    assert!(client.is_in_process());
    client
}

fn exec(command: &str) -> types::ExecRequest {
    serde_json::from_value(json!({"command": command})).unwrap()
}

async fn run(client: &Client, id: &str, command: &str) -> String {
    let result = client
        .exec_command()
        .sandbox_id(id)
        .body(exec(command))
        .send()
        .await
        .unwrap()
        .into_inner();
    result.stdout.to_string()
}

fn status<T: std::fmt::Debug>(result: Result<T, sandbox_mcp_api::Error<types::Error>>) -> u16 {
    result.unwrap_err().status().map_or(0, |s| s.as_u16())
}

/// Keys and tenants hold in process as over HTTP; answers stream; a call
/// dropped midway kills its command, as a hung-up connection does; a WebSocket (which needs a
/// connection) still goes over HTTP; a stopping engine answers 503 to new calls and finishes
/// the one under way before it is gone.
#[tokio::test]
async fn in_process_calls_meet_every_check_stream_and_are_cancelled_by_dropping() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let acme = in_process(&engine, KEY, Some("acme"));
    assert_eq!(
        acme.health().send().await.unwrap().into_inner().status,
        "ok"
    );
    // Keys: a wrong one is refused in process too.
    let stranger = in_process(&engine, "sk-not-a-key", None);
    assert_eq!(status(stranger.health().send().await), 401);
    assert_eq!(status(stranger.list_sandboxes().send().await), 401);

    let id = acme
        .create_sandbox()
        .body(types::CreateSandboxRequest::default())
        .send()
        .await
        .unwrap()
        .into_inner()
        .id
        .to_string();
    assert_eq!(run(&acme, &id, "echo hi").await, "hi\n");

    // Tenants: another tenant's client, in process, does not see the sandbox.
    let other = in_process(&engine, KEY, Some("other"));
    assert_eq!(
        status(other.get_sandbox().sandbox_id(id.as_str()).send().await),
        404
    );
    let listed = other.list_sandboxes().send().await.unwrap().into_inner();
    assert!(listed.sandboxes.is_empty(), "{listed:?}");

    // A streamed answer arrives in process as NDJSON lines ending in the result.
    let lines = exec_streamed(&acme, &id, "for i in 1 2 3; do echo line$i; done").await;
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "result", "{lines:?}");
    assert_eq!(
        last["result"]["stdout"], "line1\nline2\nline3\n",
        "{lines:?}"
    );

    // A call dropped midway: its command is killed, as when a client hangs up.
    let call = {
        let acme = acme.clone();
        let id = id.clone();
        tokio::spawn(async move { run(&acme, &id, "echo $$ > /tmp/held; exec sleep 120").await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        let pid = run(&acme, &id, "cat /tmp/held 2>/dev/null").await;
        if !pid.trim().is_empty() {
            break pid.trim().to_string();
        }
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let probe = format!("test -d /proc/{pid} && echo alive");
    assert_eq!(run(&acme, &id, &probe).await, "alive\n");
    call.abort();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alive = run(&acme, &id, &probe).await;
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped call's command still runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A WebSocket needs a connection of its own: it goes over HTTP, in-process client or not.
    let upgrading = in_process_at(&engine.url, &engine, KEY, Some("acme"));
    let socket = upgrading
        .attach_process()
        .sandbox_id(id.as_str())
        .send()
        .await
        .unwrap();
    drop(socket);
    assert!(
        in_process(&engine, KEY, Some("acme"))
            .attach_process()
            .sandbox_id(id.as_str())
            .send()
            .await
            .is_err(),
        "an upgrade cannot have gone in process"
    );

    // A call under way when the engine stops is finished before the engine is gone (its
    // shutdown waits for it), and calls after the stop are told the engine is going.
    let under_way = tokio::spawn({
        let (acme, id) = (acme.clone(), id.clone());
        async move {
            let answer = run(&acme, &id, "touch /tmp/began; sleep 4; echo finished").await;
            (answer, Instant::now())
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while run(&acme, &id, "test -e /tmp/began && echo yes")
        .await
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the call's command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stop_began = Instant::now();
    let stopping = tokio::spawn(async move {
        let dir = engine.stop().await;
        (dir, Instant::now())
    });
    let refused = loop {
        match acme.health().send().await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "the engine never stopped taking calls"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    assert_eq!(refused.status().map(|s| s.as_u16()), Some(503), "{refused}");
    assert!(refused.to_string().contains("shutting down"), "{refused}");
    let (answer, answered) = under_way.await.unwrap();
    assert_eq!(answer, "finished\n");
    let (dir, stopped) = stopping.await.unwrap();
    assert!(
        stop_began < answered,
        "the call ended before the stop began: nothing was tested"
    );
    assert!(
        answered <= stopped,
        "the engine stopped before its call was answered"
    );

    // Dropped, the stopped engine's directory takes its sandbox with it.
    drop(dir);
}
