//! Limits and bad input: the per-tenant rate limit, the body size limit, fifty concurrent clients
//! that do not cross-talk, and malformed bodies answered with JSON-RPC errors.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use rmcp::model::ProtocolVersion;
use serde_json::{Value, json};

use crate::require_sandboxes;

use super::{Fixture, INIT_2025, initialize, ok};

#[tokio::test]
async fn rate_limit_is_per_tenant_with_a_clear_429() {
    let f = Fixture::start_with(|o| o.rate_limit = 1.0).await;
    let raw = f.raw();
    let alpha = f.token("alpha");
    let beta = f.token("beta");
    // A burst of two, then 429.
    for _ in 0..2 {
        let r = raw.post(Some(&alpha), None, initialize(INIT_2025)).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let limited = raw.post(Some(&alpha), None, initialize(INIT_2025)).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.header("retry-after").is_some());
    let message = limited.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("rate limit") && message.contains("retry in"),
        "{message}"
    );
    // Another tenant has its own budget.
    let other = raw.post(Some(&beta), None, initialize(INIT_2025)).await;
    assert_eq!(other.status, StatusCode::OK);
    // Tokens refill.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = raw.post(Some(&alpha), None, initialize(INIT_2025)).await;
    assert_eq!(again.status, StatusCode::OK);
}

#[tokio::test]
async fn bodies_over_16_mib_are_refused() {
    let f = Fixture::start().await;
    let raw = f.raw();
    let token = f.token("alpha");
    let session = raw.open_session(Some(&token)).await;
    let huge = "x".repeat(17 * 1024 * 1024);
    let r = raw
        .post(
            Some(&token),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "sandbox_files_write", "arguments": {"sandbox_id": "sbx_00000000000000000000000000", "path": "f", "content": huge}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    // Answers given before the body was read to its end (over the limit, or refused for its
    // token) say `Connection: close`: a client never reuses a connection the server is closing.
    let addr = f.url.trim_start_matches("http://").trim_end_matches("/mcp");
    for (auth, len, status) in [(token.as_str(), 17 << 20, 413), ("wrong", 4096, 401)] {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {auth}\r\nMcp-Session-Id: {session}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        );
        let answer = crate::common::send_raw(addr, &head, len).await;
        assert_eq!(answer.status(), status, "{}", answer.head);
        assert!(answer.says_close() && answer.closed, "{}", answer.head);
    }
}

/// 50 clients in 5 tenants, 20 calls each, all at once: every answer is the caller's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_clients_do_not_cross_talk() {
    require_sandboxes!();
    let f = Arc::new(Fixture::start().await);
    let tokens: Vec<String> = (0..5).map(|t| f.token(&format!("tenant-{t}"))).collect();
    let mut tasks = Vec::new();
    for n in 0..50usize {
        let f = f.clone();
        let token = tokens[n % 5].clone();
        tasks.push(tokio::spawn(async move {
            let version = if n % 2 == 0 {
                ProtocolVersion::V_2025_11_25
            } else {
                ProtocolVersion::V_2026_07_28
            };
            let client = f.client(&token, version).await;
            let created = ok(
                &client,
                "sandbox_create",
                json!({"metadata": {"client": n.to_string()}}),
            )
            .await;
            let id = created["id"].as_str().unwrap().to_string();
            for i in 0..20 {
                let mark = format!("client-{n}-call-{i}");
                if i % 2 == 0 {
                    let r = ok(
                        &client,
                        "sandbox_exec",
                        json!({"sandbox_id": id, "command": format!("echo {mark}")}),
                    )
                    .await;
                    assert_eq!(r["stdout"], format!("{mark}\n"));
                } else {
                    ok(
                        &client,
                        "sandbox_files_write",
                        json!({"sandbox_id": id, "path": "mark", "content": mark}),
                    )
                    .await;
                    let r = ok(
                        &client,
                        "sandbox_files_read",
                        json!({"sandbox_id": id, "path": "mark"}),
                    )
                    .await;
                    assert_eq!(r["content"], mark);
                }
            }
            let listed = ok(&client, "sandbox_list", json!({})).await;
            (n, id, listed, client)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let ids: Vec<String> = results.iter().map(|r| r.1.clone()).collect();
    for (n, _, listed, _) in &results {
        // Each list holds exactly the sandboxes of the caller's tenant (listed after its own
        // calls finished, so at least its own is there and no other tenant's ever is).
        let seen = listed.to_string();
        for (m, other) in ids.iter().enumerate() {
            if m % 5 != n % 5 {
                assert!(
                    !seen.contains(other.as_str()),
                    "client {n} saw client {m}'s sandbox"
                );
            }
        }
        assert!(seen.contains(ids[*n].as_str()));
    }
    for (_, id, _, client) in results {
        ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    }
}

/// A POST body that is not a valid JSON-RPC message gets a JSON-RPC error (400, with the
/// request's id when one can be read, else `"id": null`) rather than a plain-text 415.
#[tokio::test]
async fn malformed_bodies_get_json_rpc_errors() {
    let f = Fixture::start().await;
    let raw = f.raw();
    let token = f.token("alpha");
    let session = raw.open_session(Some(&token)).await;
    for (body, code, id) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#,
            -32700,
            json!(1),
        ),
        ("garbage", -32700, Value::Null),
        (r#""\udcff""#, -32700, Value::Null),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sandbox_list","arguments":{"x":"\udcff"}}}"#,
            -32700,
            json!(3),
        ),
        ("1", -32600, Value::Null),
        ("[]", -32600, Value::Null),
        ("{}", -32600, Value::Null),
        (
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            -32600,
            Value::Null,
        ),
    ] {
        let request = raw
            .request(reqwest::Method::POST, Some(&token))
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", INIT_2025)
            .body(body);
        let reply = raw.send(request).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.body
        );
        assert_eq!(reply.body["error"]["code"], code, "{body}: {}", reply.body);
        assert!(
            reply.body.as_object().unwrap().contains_key("id"),
            "{body}: {}",
            reply.body
        );
        assert_eq!(reply.body["id"], id, "{body}: {}", reply.body);
    }
    // The session still works.
    let r = raw
        .post(
            Some(&token),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        )
        .await;
    assert_eq!(r.body["id"], 2, "{}", r.body);
}
