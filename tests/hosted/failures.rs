//! Servers that fail: each failure reaches the client as a JSON-RPC error naming the server, how
//! it ended and the end of its stderr, and the session recovers (a new one starts a fresh
//! sandbox) or says to open a new one; nothing of a failed instance is left behind.

use super::*;

/// A server that answers `initialize`, then dies on `tools/list`.
const CRASHY: &str = r#"
import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}}, "serverInfo": {"name": "crashy", "version": "0"}}}), flush=True)
    elif m.get("method") == "tools/list":
        sys.stderr.write("boom: out of cheese\n")
        sys.exit(7)
"#;

async fn initialize(hosted: &Hosted, name: &str, token: &str) -> (Option<String>, Value) {
    let r = hosted
        .http()
        .post(format!("{}/servers/{name}/mcp", hosted.base))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "f", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    let session = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    (session, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_that_exit_hang_print_garbage_or_flood_get_errors_that_say_so() {
    crate::require_sandboxes!();
    let hosted = Hosted::start(None).await;
    hosted
        .server
        .hosted
        .set_initialize_wait(Duration::from_secs(5));
    let token = hosted.token("alice");
    let cases = [
        (
            "exits",
            json!(["/bin/sh", "-c", "echo 'cannot find my config' >&2; exit 3"]),
            vec!["server exits exited with status 3", "cannot find my config"],
        ),
        (
            "chatty",
            json!([
                "/bin/sh",
                "-c",
                "echo 'Server v1 starting on stdio...'; exec cat >/dev/null"
            ]),
            vec![
                "never answered initialize",
                "[stdout, not JSON-RPC] Server v1 starting",
            ],
        ),
        (
            "floods",
            json!([
                "/bin/sh",
                "-c",
                "head -c 20000000 /dev/zero | tr '\\0' x; sleep 100"
            ]),
            vec!["wrote a line of over 16 MiB"],
        ),
        (
            "missing",
            json!(["no-such-mcp-server"]),
            vec!["cannot start server missing", "not installed"],
        ),
    ];
    for (name, command, expected) in cases {
        hosted
            .register_ok(None, name, json!({"command": command}))
            .await;
        let (session, answer) = initialize(&hosted, name, &token).await;
        assert!(
            session.is_none(),
            "{name}: a session for a server that failed"
        );
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for want in expected {
            assert!(message.contains(want), "{name}: {answer}");
        }
        hosted
            .wait_until(&format!("{name}'s sandbox is gone"), || {
                hosted.sandboxes_of(name).is_empty()
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_crashes_mid_session_fails_the_call_and_a_new_session_recovers() {
    crate::require_sandboxes!();
    let hosted = Hosted::start(None).await;
    hosted
        .register_ok(
            None,
            "crashy",
            json!({"command": ["/usr/bin/python3", "-c", CRASHY]}),
        )
        .await;
    let token = hosted.token("alice");
    let (session, answer) = initialize(&hosted, "crashy", &token).await;
    let session = session.unwrap_or_else(|| panic!("{answer}"));
    let post = |id: u64, session: String| {
        hosted
            .http()
            .post(format!("{}/servers/crashy/mcp", hosted.base))
            .bearer_auth(&token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", session)
            .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}))
            .send()
    };
    let r: Value = post(2, session.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("server crashy exited with status 7"),
        "{r}"
    );
    assert!(message.contains("boom: out of cheese"), "{r}");
    // The session is over, and says so; its sandbox goes with it.
    hosted
        .wait_until("the crashed instance's sandbox is gone", || {
            hosted.sandboxes_of("crashy").is_empty()
        })
        .await;
    let r = post(3, session).await.unwrap();
    assert_eq!(r.status(), 404);
    // A new session starts a fresh instance.
    let (fresh, answer) = initialize(&hosted, "crashy", &token).await;
    assert!(fresh.is_some(), "{answer}");
    assert_eq!(hosted.sandboxes_of("crashy").len(), 1);
}
