//! Agent-grade execution: persistent interpreters, background jobs, live output, cancellation
//! and pageable output.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, ProgressNotificationParam, ProgressToken, RequestMetaObject,
};
use rmcp::service::NotificationContext;
use serde_json::{Value, json};

use crate::common::{McpClient, TestEngine, create, err, exec, ok, sh};
use crate::require_sandboxes;

async fn code(client: &McpClient, id: &str, args: Value) -> Value {
    let mut args = args;
    args["sandbox_id"] = json!(id);
    ok(client, "sandbox_run_code", args).await
}

#[tokio::test]
async fn python_state_persists_across_calls() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let r = code(
        &client,
        &id,
        json!({"code": "import math\nx = 20\nf = open('/tmp/log.txt', 'w')\nprint('set')\nx + 1"}),
    )
    .await;
    assert_eq!(r["stdout"], "set\n");
    assert_eq!(r["result"], "21");
    assert_eq!(r["context_id"], "python");
    let r = code(
        &client,
        &id,
        json!({"code": "f.write('kept'); f.flush(); math.sqrt(x * 5)"}),
    )
    .await;
    assert_eq!(r["result"], "10.0");
    assert_eq!(sh(&client, &id, "cat /tmp/log.txt").await, "kept");
    // Errors come back as the interpreter's, with a traceback of the cell only.
    let r = code(
        &client,
        &id,
        json!({"code": "def g():\n    return 1 / 0\ng()"}),
    )
    .await;
    assert_eq!(r["error"]["name"], "ZeroDivisionError");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(
        tb.contains("<cell 3>") && tb.contains("return 1 / 0") && !tb.contains("<string>"),
        "{tb}"
    );
    // Malformed code is a SyntaxError, not a server error; the context lives on.
    let r = code(&client, &id, json!({"code": "def broken(:"})).await;
    assert_eq!(r["error"]["name"], "SyntaxError");
    assert_eq!(
        code(&client, &id, json!({"code": "x"})).await["result"],
        "20"
    );
    // Top-level await works.
    let r = code(
        &client,
        &id,
        json!({"code": "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'"}),
    )
    .await;
    assert_eq!(r["result"], "'awaited'");
}

#[tokio::test]
async fn node_state_persists_and_contexts_are_separate() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let r = code(&client, &id, json!({"language": "node", "code": "let items = [1, 2, 3]; const obj = {a: {b: 1}}; console.log('hi'); items"})).await;
    assert_eq!(r["stdout"], "hi\n");
    assert_eq!(r["result"], "[ 1, 2, 3 ]");
    let r = code(
        &client,
        &id,
        json!({"language": "node", "code": "items.push(4); obj.a.b + items.length"}),
    )
    .await;
    assert_eq!(r["result"], "5");
    let r = code(
        &client,
        &id,
        json!({"language": "node", "code": "Promise.resolve(7)"}),
    )
    .await;
    assert_eq!(r["result"], "7", "a promise result is awaited");
    let r = code(
        &client,
        &id,
        json!({"language": "node", "code": "undefinedThing.x"}),
    )
    .await;
    assert_eq!(r["error"]["name"], "ReferenceError");

    // A second Python context has its own variables.
    let ctx = ok(
        &client,
        "sandbox_code_context_create",
        json!({"sandbox_id": id, "language": "python", "cwd": "/tmp"}),
    )
    .await;
    let ctx_id = ctx["context_id"].as_str().unwrap().to_string();
    assert!(ctx_id.starts_with("ctx_"));
    code(&client, &id, json!({"code": "v = 'default'"})).await;
    code(
        &client,
        &id,
        json!({"context_id": ctx_id, "code": "v = 'other'"}),
    )
    .await;
    assert_eq!(
        code(&client, &id, json!({"code": "v"})).await["result"],
        "'default'"
    );
    assert_eq!(
        code(
            &client,
            &id,
            json!({"context_id": ctx_id, "code": "import os; (v, os.getcwd())"})
        )
        .await["result"],
        "('other', '/tmp')"
    );
    let listed = ok(
        &client,
        "sandbox_code_context_list",
        json!({"sandbox_id": id}),
    )
    .await;
    let ids: Vec<&str> = listed["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["context_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![ctx_id.as_str(), "node", "python"]);
    ok(
        &client,
        "sandbox_code_context_delete",
        json!({"sandbox_id": id, "context_id": ctx_id}),
    )
    .await;
    let m = err(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "context_id": ctx_id, "code": "v"}),
    )
    .await;
    assert!(m.contains("sandbox_code_context_list"), "{m}");
}

#[tokio::test]
async fn timeouts_interrupt_and_keep_state_or_kill_and_report_it() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    code(&client, &id, json!({"code": "kept = 'yes'"})).await;
    let started = Instant::now();
    let r = code(
        &client,
        &id,
        json!({"code": "while True: pass", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["error"]["name"], "KeyboardInterrupt");
    assert_eq!(r["context_lost"], false);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        code(&client, &id, json!({"code": "kept"})).await["result"],
        "'yes'"
    );
    // Code that ignores the interrupt is killed; the call says the state is gone.
    let r = code(&client, &id, json!({"code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", "timeout_ms": 500})).await;
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["context_lost"], true);
    assert_eq!(r["error"]["name"], "InterpreterDied");
    let r = code(&client, &id, json!({"code": "'kept' in dir()"})).await;
    assert_eq!(r["context_restarted"], true);
    assert_eq!(r["result"], "False");
    // Node: an infinite loop is interrupted too.
    let r = code(
        &client,
        &id,
        json!({"language": "node", "code": "globalThis.z = 1; while (true) {}", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(r["timed_out"], true);
    assert_eq!(
        code(&client, &id, json!({"language": "node", "code": "z"})).await["result"],
        "1"
    );
}

#[tokio::test]
async fn interpreter_crash_is_reported_and_the_next_call_starts_fresh() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    code(&client, &id, json!({"code": "a = 1"})).await;
    let r = code(&client, &id, json!({"code": "import os\nos._exit(7)"})).await;
    assert_eq!(r["context_lost"], true);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited with status 7"),
        "{r}"
    );
    let r = code(&client, &id, json!({"code": "b = 2\nb"})).await;
    assert_eq!(r["context_restarted"], true);
    assert_eq!(r["result"], "2");
    let r = code(
        &client,
        &id,
        json!({"code": "import ctypes\nctypes.string_at(0)"}),
    )
    .await;
    assert_eq!(
        r["context_lost"], true,
        "a segfault kills only the interpreter: {r}"
    );
    assert_eq!(
        sh(&client, &id, "echo sandbox fine").await,
        "sandbox fine\n"
    );
}

#[tokio::test]
async fn huge_output_is_capped_exactly_and_kept_in_a_file() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let r = code(
        &client,
        &id,
        json!({"code": "import sys\nfor i in range(200000): sys.stdout.write(f'{i:09d}\\n')"}),
    )
    .await;
    assert_eq!(r["stdout_bytes"], 2_000_000);
    assert_eq!(r["truncated"], true);
    assert!(r["stdout"].as_str().unwrap().len() <= 32 * 1024);
    let file = r["stdout_file"].as_str().unwrap();
    assert_eq!(
        sh(
            &client,
            &id,
            &format!("wc -c < {file}; sed -n 123457p {file}")
        )
        .await,
        "2000000\n000123456\n"
    );
    // exec too: the whole stream is in the file, and the model can read a slice.
    let r = exec(&client, &id, "seq 1 100000").await;
    assert_eq!(r["truncated"], true);
    let file = r["stdout_file"].as_str().unwrap().to_string();
    assert!(file.starts_with("/tmp/sandbox-mcp/output/"));
    assert_eq!(
        sh(&client, &id, &format!("sed -n 50000p {file}")).await,
        "50000\n"
    );
    assert!(r["stderr_file"].is_null());
    // Old spill files are bounded in total: many overflowing runs do not grow without limit.
    let used: u64 = sh(&client, &id, "du -sb /tmp/sandbox-mcp/output | cut -f1")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(used <= 256 * 1024 * 1024);
}

#[tokio::test]
async fn background_jobs_page_and_die_on_request() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let started = Instant::now();
    let r = ok(&client, "sandbox_exec", json!({"sandbox_id": id, "command": "for i in $(seq 1 4000); do echo \"line $i\"; done; echo done >&2; sleep 1", "background": true})).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a background exec returns at once"
    );
    let job = r["job_id"].as_str().unwrap().to_string();
    // Page through until the job has exited and everything is read.
    let mut offset = 0u64;
    let mut all = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": id, "job_id": job, "since_offset": offset}),
        )
        .await;
        assert_eq!(s["offset"], offset);
        all.push_str(s["output"].as_str().unwrap());
        offset = s["next_offset"].as_u64().unwrap();
        assert!(s["output"].as_str().unwrap().len() <= 32 * 1024);
        if s["status"] == "exited"
            && s["has_more"] == false
            && offset == s["output_bytes"].as_u64().unwrap()
        {
            assert_eq!(s["exit_code"], 0);
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let expected: String = (1..=4000)
        .map(|i| format!("line {i}\n"))
        .collect::<String>()
        + "done\n";
    assert_eq!(all, expected);
    // Jobs are listed in sandbox_info and survive the call that started them.
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["jobs"][0]["job_id"], job.as_str());
    // Kill a running one.
    let r = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "sleep 600", "background": true}),
    )
    .await;
    let sleeper = r["job_id"].as_str().unwrap().to_string();
    ok(
        &client,
        "sandbox_job_kill",
        json!({"sandbox_id": id, "job_id": sleeper}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": id, "job_id": sleeper}),
        )
        .await;
        if s["status"] == "exited" {
            assert_eq!(s["signal"], 9);
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = err(
        &client,
        "sandbox_job_status",
        json!({"sandbox_id": id, "job_id": "job_999"}),
    )
    .await;
    assert!(m.contains("sandbox_info"), "{m}");
}

#[tokio::test]
async fn background_jobs_are_bounded_by_a_quota() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let mut refused = None;
    for i in 0..200 {
        let r = crate::common::call(
            &client,
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "sleep 600", "background": true}),
        )
        .await;
        if r.is_error == Some(true) {
            refused = Some((i, crate::common::text(&r)));
            break;
        }
    }
    let (n, message) = refused.expect("200 background jobs must hit the quota");
    assert_eq!(n, 64);
    assert!(
        message.contains("limit is 64") && message.contains("sandbox_job_kill"),
        "{message}"
    );
}

/// Records progress notifications as they arrive.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(Instant, String)>>>);

impl rmcp::ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), params.message.unwrap_or_default()));
    }
}

async fn call_with_progress(
    client: &rmcp::service::RunningService<RoleClient, Recorder>,
    name: &str,
    args: Value,
) -> (Instant, Value) {
    let Value::Object(args) = args else {
        unreachable!()
    };
    let mut meta = RequestMetaObject::new();
    meta.set_progress_token(ProgressToken(rmcp::model::NumberOrString::String(
        "p1".into(),
    )));
    let mut params = CallToolRequestParams::new(name.to_string()).with_arguments(args);
    params.meta = Some(meta);
    let result = client.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{:?}", result.content);
    (Instant::now(), result.structured_content.unwrap())
}

#[tokio::test]
async fn live_output_arrives_as_progress_before_the_result() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let recorder = Recorder::default();
    let client = engine.mcp_handled(recorder.clone()).await;
    let plain = engine.mcp().await;
    let id = create(&plain).await;
    let (done, r) = call_with_progress(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "for i in 1 2 3 4; do echo step $i; sleep 0.4; done"}),
    )
    .await;
    assert_eq!(r["stdout"], "step 1\nstep 2\nstep 3\nstep 4\n");
    let seen = recorder.0.lock().unwrap().clone();
    assert!(
        seen.len() >= 2,
        "expected several progress notifications, got {seen:?}"
    );
    assert!(seen[0].1.contains("step 1"));
    assert!(
        done.duration_since(seen[0].0) > Duration::from_millis(800),
        "the first progress came only at the end"
    );
    let text: String = seen.iter().map(|(_, m)| m.as_str()).collect();
    assert!(text.contains("step 4"), "{text}");

    recorder.0.lock().unwrap().clear();
    let (_, r) = call_with_progress(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": "import time\nfor i in range(3):\n    print('tick', i)\n    time.sleep(0.4)\n'ok'"}),
    )
    .await;
    assert_eq!(r["result"], "'ok'");
    let seen = recorder.0.lock().unwrap().clone();
    assert!(seen.len() >= 2 && seen[0].1.contains("tick 0"), "{seen:?}");
}

#[tokio::test]
async fn cancelling_run_code_interrupts_it_and_keeps_the_context() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    code(&client, &id, json!({"code": "counter = 0"})).await;
    let Value::Object(args) = json!({"sandbox_id": id, "code": "import time\nwhile True:\n    counter += 1\n    time.sleep(0.01)"})
    else {
        unreachable!()
    };
    let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        CallToolRequestParams::new("sandbox_run_code").with_arguments(args),
    ));
    let handle = client
        .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    handle.cancel(None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a: u64 = code(&client, &id, json!({"code": "counter"})).await["result"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b: u64 = code(&client, &id, json!({"code": "counter"})).await["result"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(a > 0, "the loop ran and its state was kept");
    assert_eq!(a, b, "the cancelled loop is no longer running");
}

/// A description of a sandbox with no jobs may skip asking its agent for a while, but a job
/// started through the engine is listed by the very next description, however soon.
#[tokio::test]
async fn a_job_is_listed_by_the_next_description_after_descriptions_of_none() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    for _ in 0..3 {
        let id = create(&client).await;
        let jobs =
            async || ok(&client, "sandbox_info", json!({"sandbox_id": id})).await["jobs"].clone();
        // Described in a loop with none: from here on the answer may be reused.
        for _ in 0..3 {
            let none = jobs().await;
            assert!(none.as_array().is_none_or(Vec::is_empty), "{none}");
        }
        let started = ok(
            &client,
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "sleep 600", "background": true}),
        )
        .await;
        let listed = jobs().await;
        assert_eq!(listed[0]["job_id"], started["job_id"], "{listed}");
    }
}
