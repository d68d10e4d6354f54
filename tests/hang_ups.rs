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
