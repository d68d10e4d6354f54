//! Callers that go away: a client hanging up (or an MCP call cancelled) in the middle of a
//! lifecycle transition, which must still run to its end.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{KEY, TestEngine, sh};
use crate::require_cgroups;

/// Lifecycle transitions are not undone halfway by their callers leaving: a client that hangs up
/// (or an MCP call cancelled) after a create's or a fork's launch began gets sandboxes that are
/// finished, listed and usable, a parent that is not left frozen, and at shutdown they are paused
/// like any other: never processes running under no entry.
#[tokio::test]
async fn transitions_whose_caller_hangs_up_are_finished_and_paused_at_shutdown() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let sandboxes = engine.data_dir().join("sandboxes");
    let on_disk = move || {
        let mut ids: Vec<String> = std::fs::read_dir(&sandboxes)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.starts_with("sbx_") && !n.contains('.'))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    };
    // POSTs `body` to `path` and hangs up once a new sandbox's directory exists: its launch
    // has begun, nothing is committed. The new sandboxes' ids.
    let hang_up = async |path: &str, body: serde_json::Value| {
        let before = on_disk();
        let (http, url) = (engine.http(), format!("{}{path}", engine.url));
        let call =
            tokio::spawn(async move { http.post(url).bearer_auth(KEY).json(&body).send().await });
        let deadline = Instant::now() + Duration::from_secs(30);
        while on_disk().len() == before.len() {
            assert!(Instant::now() < deadline, "{path} started no sandbox");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        call.abort();
        let made: Vec<String> = on_disk()
            .into_iter()
            .filter(|i| !before.contains(i))
            .collect();
        made
    };
    let running = async |ids: &[String]| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, list) = engine.as_tenant(None, "GET", "/v1/sandboxes", None).await;
            let up = list["sandboxes"].as_array().is_some_and(|l| {
                ids.iter().all(|id| {
                    l.iter()
                        .any(|s| s["id"] == id.as_str() && s["status"] == "running")
                })
            });
            if up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "a transition its caller left was not finished: {ids:?} in {list}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let client = engine.mcp().await;
    let made = hang_up("/v1/sandboxes", json!({})).await;
    running(&made).await;
    let id = made[0].clone();
    assert_eq!(sh(&client, &id, "echo made").await, "made\n");
    // A process besides the agent: the fork copies the parent's files while it is frozen.
    sh(&client, &id, "nohup sleep 600 >/dev/null 2>&1 &").await;
    let children = hang_up(
        &format!("/v1/sandboxes/{id}/fork"),
        json!({"count": 2, "memory": false}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut children = children;
    // Both children's directories, once the fork has made them.
    while children.len() < 2 {
        assert!(Instant::now() < deadline, "the fork made {children:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        children = on_disk().into_iter().filter(|i| *i != id).collect();
    }
    running(&children).await;
    for child in &children {
        assert_eq!(sh(&client, child, "echo child").await, "child\n");
    }
    // The parent was thawed after the copy, not left frozen with its entry saying running.
    assert_eq!(sh(&client, &id, "echo parent").await, "parent\n");
    drop(client);
    let dir = engine.stop().await;
    let layout = sandbox_mcp_linux::cgroups::Layout::detect();
    for sbx in children.iter().chain([&id]) {
        let cgroup = layout.sandbox(sbx);
        assert!(
            cgroup.is_frozen() && !cgroup.pids().is_empty(),
            "{sbx} paused at shutdown, its processes kept"
        );
    }
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    assert_eq!(sh(&client, &id, "echo again").await, "again\n");
}

/// Sends a whole request to the engine at `url` and hangs up at once, before any answer: the
/// engine reads the request, starts it, and then finds its caller gone.
async fn send_and_hang_up(url: &str, method: &str, path: &str, body: serde_json::Value) {
    use tokio::io::AsyncWriteExt;
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    drop(s);
}

/// Polls `done` (every 50 ms, up to 30 s) until it holds; `what` names the end awaited.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "never reached: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The other transitions, each asked for by a caller that hangs up as soon as it has sent the
/// request: a snapshot is kept, a restore puts the files back, a pause and a resume land, a merge
/// replaces the target's files and a kill removes the sandbox; the sandbox stays usable between.
#[tokio::test]
async fn every_transition_runs_to_its_end_when_its_caller_hangs_up() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let a = crate::common::create(&client).await;
    let b = crate::common::create(&client).await;
    sh(&client, &a, "echo one > /root/f").await;
    let url = engine.url.clone();
    let status = async |id: &str| {
        let (_, got) = engine
            .as_tenant(None, "GET", &format!("/v1/sandboxes/{id}"), None)
            .await;
        got["status"].as_str().unwrap_or("gone").to_string()
    };

    send_and_hang_up(
        &url,
        "POST",
        &format!("/v1/sandboxes/{a}/snapshots"),
        json!({"name": "kept"}),
    )
    .await;
    let mut snap = String::new();
    until("the snapshot kept", async || {
        let (_, list) = engine
            .as_tenant(None, "GET", &format!("/v1/sandboxes/{a}/snapshots"), None)
            .await;
        let found = list["snapshots"].as_array().and_then(|l| {
            l.iter()
                .find(|s| s["name"] == "kept" && s["ready"] != false)
                .map(|s| s["id"].as_str().unwrap().to_string())
        });
        snap = found.clone().unwrap_or_default();
        found.is_some()
    })
    .await;
    assert_eq!(
        sh(&client, &a, "cat /root/f; echo two > /root/f").await,
        "one\n"
    );

    send_and_hang_up(
        &url,
        "POST",
        &format!("/v1/sandboxes/{a}/snapshots/{snap}/restore"),
        json!({}),
    )
    .await;
    // A call that meets the restore under way is refused with "run it again": so is this poll.
    let read = async |id: &str, path: &str| {
        let r = crate::common::call(
            &client,
            "sandbox_exec",
            json!({"sandbox_id": id, "command": format!("cat {path}")}),
        )
        .await;
        r.structured_content
            .and_then(|v| v["stdout"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    until("the files restored", async || {
        read(&a, "/root/f").await == "one\n"
    })
    .await;

    send_and_hang_up(&url, "POST", &format!("/v1/sandboxes/{a}/pause"), json!({})).await;
    until("paused", async || status(&a).await == "paused").await;
    send_and_hang_up(
        &url,
        "POST",
        &format!("/v1/sandboxes/{a}/resume"),
        json!({}),
    )
    .await;
    until("running again", async || status(&a).await == "running").await;

    sh(&client, &b, "echo from-b > /root/g").await;
    send_and_hang_up(
        &url,
        "POST",
        &format!("/v1/sandboxes/{a}/merge"),
        json!({"source_id": b, "force": true}),
    )
    .await;
    until("the merge applied", async || {
        read(&a, "/root/g").await == "from-b\n"
    })
    .await;
    assert_eq!(status(&a).await, "running");

    send_and_hang_up(&url, "DELETE", &format!("/v1/sandboxes/{b}"), json!({})).await;
    until("killed", async || status(&b).await == "gone").await;
}

/// The same over MCP: a fork whose `tools/call` the client cancels (`notifications/cancelled`)
/// once its children's launch has begun still makes every child, running.
#[tokio::test]
async fn a_lifecycle_call_cancelled_over_mcp_runs_to_its_end() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = crate::common::create(&client).await;
    let sandboxes = engine.data_dir().join("sandboxes");
    let count = || {
        std::fs::read_dir(&sandboxes)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        let n = e.file_name().to_string_lossy().to_string();
                        n.starts_with("sbx_") && !n.contains('.')
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let before = count();
    let serde_json::Value::Object(args) = json!({"sandbox_id": id, "count": 4, "memory": false})
    else {
        unreachable!()
    };
    let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        rmcp::model::CallToolRequestParams::new("sandbox_fork").with_arguments(args),
    ));
    let handle = client
        .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
        .await
        .unwrap();
    until("the fork's launch began", async || count() > before).await;
    handle.cancel(Some("changed my mind".into())).await.unwrap();
    until("four children, running", async || {
        let (_, list) = engine.as_tenant(None, "GET", "/v1/sandboxes", None).await;
        list["sandboxes"].as_array().is_some_and(|l| {
            l.iter()
                .filter(|s| s["metadata"]["forked_from"] == id.as_str() && s["status"] == "running")
                .count()
                == 4
        })
    })
    .await;
    assert_eq!(
        sh(&client, &id, "echo parent").await,
        "parent\n",
        "the parent runs"
    );
}
