//! A server's life: stdin EOF exits cleanly (logs on stderr only), the session's sandbox dies with
//! stdin EOF and with SIGTERM, and the data dir can be deleted after the server exits.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{KEY, TestEngine, loop_devices_of, mounted};
use crate::require_sandboxes;

use super::Server;

#[test]
fn stdin_eof_exits_cleanly_and_logs_only_to_stderr() {
    let mut server = Server::offline();
    server.initialize("2025-11-25");
    let status = server.close_and_wait();
    assert!(status.success(), "{status:?}");
    // Anything left on stdout after EOF must still be JSON-RPC (nothing, in fact).
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut server.stdout, &mut rest);
    assert!(rest.trim().is_empty(), "stray stdout: {rest:?}");
}

/// `--session-sandbox` on stdio: the one session's sandbox is made on first use and killed
/// when stdin closes, or on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_sandbox_dies_with_stdin_eof_and_with_sigterm() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let url = engine.url.clone();
    let manager = engine.manager.clone();
    tokio::task::spawn_blocking(move || {
        let count = || manager.list(None, &[], None).len();
        let wait_for_none = |what: &str| {
            let deadline = Instant::now() + Duration::from_secs(15);
            while count() > 0 {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let envs = [
            ("SANDBOX_MCP_URL", url.as_str()),
            ("SANDBOX_MCP_API_KEY", KEY),
            ("SANDBOX_MCP_SESSION_SANDBOX", "true"),
        ];
        for ending in ["eof", "sigterm"] {
            let mut server = Server::spawn(&envs);
            server.initialize("2025-06-18");
            assert_eq!(count(), 0, "the sandbox is made on first use");
            server.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_exec", "arguments": {"command": "echo mine > f; cat f"}}}));
            let r = server.recv();
            assert_eq!(r["result"]["structuredContent"]["stdout"], "mine\n", "{r}");
            server.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "sandbox_files_read", "arguments": {"path": "f"}}}));
            let r = server.recv();
            assert_eq!(r["result"]["structuredContent"]["content"], "mine\n", "{r}");
            assert_eq!(count(), 1);
            if ending == "eof" {
                assert!(server.close_and_wait().success());
            } else {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
                assert!(server.close_and_wait().success());
            }
            wait_for_none(&format!("the session's sandbox should be killed on {ending}"));
        }
    })
    .await
    .unwrap();
}

/// When the server exits, the sandbox store is unmounted: the data dir can be deleted at once,
/// and the loop device goes as soon as nothing uses the filesystem (paused sandboxes may keep it
/// until they die).
#[test]
fn the_data_dir_can_be_deleted_after_the_server_exits() {
    crate::require_cgroups!();
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let data = dir.path().join("data");
    let image = data.join("sandboxes.img");
    let mut server = Server::spawn(&[("SANDBOX_MCP_DATA_DIR", data.to_str().unwrap())]);
    server.initialize("2025-06-18");
    let mut call = |id: u64, tool: &str, args: Value| {
        server.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}));
        let r = server.recv();
        assert_ne!(r["result"]["isError"], true, "{tool}: {r}");
        r["result"]["structuredContent"].clone()
    };
    let killed = call(2, "sandbox_create", json!({}))["id"].clone();
    call(
        3,
        "sandbox_exec",
        json!({"sandbox_id": killed, "command": "echo hi > /root/f"}),
    );
    call(4, "sandbox_kill", json!({"sandbox_id": killed}));
    let kept = call(5, "sandbox_create", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let enforced =
        call(6, "sandbox_metrics", json!({"sandbox_id": kept}))["disk_limit_enforced"] == true;
    assert!(server.close_and_wait().success());

    assert!(
        !mounted(&data.join("sandboxes")),
        "the store is still mounted"
    );
    if enforced {
        assert!(
            !loop_devices_of(&image).is_empty(),
            "the paused sandbox keeps its filesystem"
        );
    }
    std::fs::remove_dir_all(&data).expect("the data dir cannot be deleted");
    // The paused sandbox dies (as at the next reboot): the loop device goes with it.
    let cg = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&kept);
    cg.kill_all().unwrap();
    let _ = cg.remove();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !loop_devices_of(&image).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a loop device outlived its use: {:?}",
            loop_devices_of(&image)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
