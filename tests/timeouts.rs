//! What a sandbox's timeout does (`on_timeout`): kill it, pause it with its memory, or stop its
//! processes and keep its files; each through the engine's API, kept across an engine restart.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::TestEngine;
use crate::require_sandboxes;

/// The engine's API as the untenanted operator; asserts the status.
async fn call(engine: &TestEngine, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, out) = engine.as_tenant(None, method, path, body).await;
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {out}"
    );
    out
}

async fn sh(engine: &TestEngine, id: &str, command: &str) -> String {
    let out = call(
        engine,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": command})),
    )
    .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    out["stdout"].as_str().unwrap().to_string()
}

/// Waits for the timers to take the sandbox out of `running` and its timeout away (an instant
/// apart: the pause, then the timeout cleared); its record then.
async fn until_paused(engine: &TestEngine, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = call(engine, "GET", &format!("/v1/sandboxes/{id}"), None).await;
        if info["status"] == "paused" && info["expires_at"].is_null() {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "not paused at its timeout: {info}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Gives the sandbox a timeout of `seconds` from now.
async fn time_out(engine: &TestEngine, id: &str, seconds: u64) {
    let path = format!("/v1/sandboxes/{id}");
    call(
        engine,
        "PATCH",
        &path,
        Some(json!({"timeout_seconds": seconds})),
    )
    .await;
}

/// A sandbox with the action `on_timeout`, a file and a background process to look for
/// afterwards, and its disk full (what the engine writes to start it again must not need any of
/// it); its timeout, 1 s, is set once all that is done. Its id, boot id and the process's pid.
async fn timed(engine: &TestEngine, on_timeout: &str) -> (String, String, String) {
    let ask = json!({"timeout_seconds": 3600, "on_timeout": on_timeout, "shape": {"disk_mb": 64}});
    let made = call(engine, "POST", "/v1/sandboxes", Some(ask)).await;
    assert_eq!(made["on_timeout"], on_timeout, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let seen = sh(
        engine,
        &id,
        "echo kept > /root/notes; head -c 100M /dev/zero > /root/fill 2>/dev/null; \
         nohup sleep 600 >/dev/null 2>&1 & echo $!; cat /proc/sys/kernel/random/boot_id",
    )
    .await;
    let (pid, boot) = seen.split_once('\n').unwrap();
    time_out(engine, &id, 1).await;
    (id, boot.to_string(), pid.to_string())
}

#[tokio::test]
async fn a_timeout_pauses_with_memory_or_stops_keeping_files_as_asked() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let (paused, paused_boot, paused_pid) = timed(&engine, "pause").await;
    let (stopped, stopped_boot, stopped_pid) = timed(&engine, "stop").await;

    // Paused at its timeout, it has none left (or the next tick would pause it again), and
    // resuming carries on where it was: the same process, the same boot.
    let info = until_paused(&engine, &paused).await;
    assert_eq!(info["on_timeout"], "pause", "{info}");
    call(
        &engine,
        "POST",
        &format!("/v1/sandboxes/{paused}/resume"),
        None,
    )
    .await;
    let after = sh(
        &engine,
        &paused,
        &format!("cat /root/notes; [ \"$(cat /proc/{paused_pid}/comm 2>/dev/null)\" = sleep ] && echo alive; cat /proc/sys/kernel/random/boot_id"),
    )
    .await;
    assert_eq!(after, format!("kept\nalive\n{paused_boot}"));

    // Stopped at its timeout: its files are kept, its processes are not, and it comes back
    // as a new boot, its disk full as it was.
    until_paused(&engine, &stopped).await;
    let after = sh(
        &engine,
        &stopped,
        &format!("cat /root/notes; [ \"$(cat /proc/{stopped_pid}/comm 2>/dev/null)\" = sleep ] && echo alive; cat /proc/sys/kernel/random/boot_id"),
    )
    .await;
    let (notes, boot) = after.split_once('\n').unwrap();
    assert_eq!(notes, "kept", "{after}");
    assert!(boot != stopped_boot && boot.len() == 37, "{after}");

    // A timeout set again applies as before: both are paused again when it passes.
    for id in [&paused, &stopped] {
        time_out(&engine, id, 1).await;
    }
    for id in [&paused, &stopped] {
        until_paused(&engine, id).await;
    }
}

#[tokio::test]
async fn the_action_is_kept_across_an_engine_restart_and_a_bad_one_is_refused() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let made = call(
        &engine,
        "POST",
        "/v1/sandboxes",
        Some(json!({"timeout_seconds": 3600, "on_timeout": "stop"})),
    )
    .await;
    let id = made["id"].as_str().unwrap().to_string();
    let plain = call(&engine, "POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(plain["on_timeout"], "kill", "{plain}");

    let (status, out) = engine
        .as_tenant(
            None,
            "POST",
            "/v1/sandboxes",
            Some(json!({"timeout_seconds": 60, "on_timeout": "hibernate"})),
        )
        .await;
    assert_eq!(status, 400, "{out}");
    let said = out.to_string();
    assert!(
        said.contains("on_timeout") || said.contains("kill"),
        "{said}"
    );

    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let info = call(&engine, "GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(info["on_timeout"], "stop", "{info}");
}
