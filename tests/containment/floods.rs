//! Floods: nothing from inside a sandbox is buffered without a bound, neither a command's gigabyte
//! of output nor a hijacked agent's stream of frames; the engine's memory stays flat.

use serde_json::json;

use sandbox_mcp_testkit::procfs::status_kib;

use crate::common::{TestEngine, call, create, ok, sh, text};
use crate::require_sandboxes;

/// Resident memory of this process (the engine's), in KiB.
fn rss_kib() -> u64 {
    status_kib(std::process::id(), "VmRSS:").unwrap()
}

#[tokio::test]
async fn a_gigabyte_of_output_is_capped_with_exact_counts_and_bounded_memory() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let before = rss_kib();
    let r = ok(&client, "sandbox_exec", json!({"sandbox_id": id, "command": "yes | head -c 1073741824; echo tail >&2", "timeout_ms": 120000})).await;
    assert_eq!(r["stdout_bytes"], 1_073_741_824u64);
    assert_eq!(r["stderr_bytes"], 5);
    assert_eq!(r["truncated"], true);
    let stdout = r["stdout"].as_str().unwrap();
    assert!(
        stdout.len() <= 32 * 1024
            && stdout.starts_with("y\ny\n")
            && stdout.contains("bytes omitted"),
        "{} bytes: {:?} … {:?}",
        stdout.len(),
        &stdout[..40.min(stdout.len())],
        &stdout[stdout.len().saturating_sub(80)..]
    );
    let grew = rss_kib().saturating_sub(before);
    assert!(
        grew < 64 * 1024,
        "the engine grew by {grew} KiB while draining 1 GiB"
    );
}

/// Peak resident memory of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:").unwrap()
}

#[tokio::test]
async fn a_hijacked_agent_cannot_flood_the_engine() {
    require_sandboxes!();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = crate::common::TempData::new();
    let (mut engine, url) = crate::common::spawn_engine_process(&dir.data()).await;
    let backend = sandbox_mcp_server::backend::Backend::remote(
        &url,
        Some(sandbox_mcp_api::ApiKey::new(crate::common::KEY)),
    )
    .unwrap();
    let client = crate::common::mcp_for(backend, Default::default(), "all").await;
    let id = create(&client).await;
    sh(&client, &id, "echo warm").await;
    let before = peak_rss_kib(engine.id());

    // Whatever answers on the agent's socket is hostile: a frame that claims 20 MiB and delivers
    // it, or an error message of 8 MiB. The engine stops an agent that breaks the protocol and
    // starts a fresh one on the next call (which binds a new socket), so the hostile listener is
    // planted again before each call.
    let socket = dir.data().join("agents").join(format!("{id}.sock"));
    let plant = |flood: bool| {
        let _ = std::fs::rename(&socket, socket.with_extension(format!("real.{flood}")));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut len = [0u8; 4];
                let _ = conn.read_exact(&mut len).await;
                let mut req = vec![0u8; u32::from_be_bytes(len) as usize];
                let _ = conn.read_exact(&mut req).await;
                let body = if flood {
                    vec![b'x'; 20 << 20]
                } else {
                    let message = "e".repeat(8 << 20);
                    serde_json::to_vec(&json!({"type": "error", "kind": "io", "message": message}))
                        .unwrap()
                };
                let _ = conn.write_all(&(body.len() as u32).to_be_bytes()).await;
                let _ = conn.write_all(&body).await;
            }
        })
    };
    for flood in [true, false, true, false] {
        // A genuine agent first (the engine restarts one after each hostile round), then the
        // hostile listener in its place.
        assert_eq!(sh(&client, &id, "echo genuine").await, "genuine\n");
        let hostile = plant(flood);
        let r = call(
            &client,
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "true"}),
        )
        .await;
        hostile.abort();
        assert_eq!(r.is_error, Some(true));
        assert!(
            text(&r).len() < 8192,
            "an error of {} bytes reached the client",
            text(&r).len()
        );
    }
    // The hostile answers were not trusted: the next call runs under a genuine agent again.
    assert_eq!(sh(&client, &id, "echo genuine").await, "genuine\n");
    let grown = peak_rss_kib(engine.id()).saturating_sub(before);
    let _ = engine.kill();
    let _ = engine.wait();
    crate::common::kill_left_behind(&dir.data());
    assert!(
        grown < 16 * 1024,
        "the engine's peak memory grew by {grown} KiB reading a hostile agent"
    );
}
