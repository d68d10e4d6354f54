//! Sessions: initialize, use and delete; stateless 2026-07-28 requests that need none; session
//! sandboxes, one per session, that die with it and are replaced when they die first.

use std::time::Duration;

use reqwest::StatusCode;
use rmcp::model::ProtocolVersion;
use serde_json::json;

use sandbox_mcp_server::tooldefs::registry;

use crate::common::text;
use crate::require_sandboxes;

use super::{Fixture, call, meta_2026, ok};

#[tokio::test]
async fn session_lifecycle_initialize_use_delete() {
    let f = Fixture::start().await;
    let raw = f.raw();
    let token = f.token("alpha");
    let session = raw.open_session(Some(&token)).await;
    let list = raw
        .post(
            Some(&token),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(
        list.body["result"]["tools"].as_array().map(Vec::len),
        Some(registry().tools.len())
    );

    // Another tenant cannot use (or end) this session: it answers like an unknown one.
    let other = f.token("beta");
    let foreign = raw
        .post(
            Some(&other),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        )
        .await;
    let unknown = raw
        .post(
            Some(&other),
            Some("no-such-session"),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        )
        .await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(raw.delete(&other, &session).await, StatusCode::NOT_FOUND);

    assert!(raw.delete(&token, &session).await.is_success());
    let after = raw
        .post(
            Some(&token),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
        )
        .await;
    assert_eq!(after.status, StatusCode::NOT_FOUND, "{}", after.body);
}

#[tokio::test]
async fn stateless_2026_requests_need_no_session() {
    let f = Fixture::start().await;
    let raw = f.raw();
    let token = f.token("alpha");
    let reply = raw
        .send(
            raw.request(reqwest::Method::POST, Some(&token))
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/list")
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta_2026()}})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.header("mcp-session-id").is_none());
    assert_eq!(
        reply.body["result"]["tools"].as_array().map(Vec::len),
        Some(registry().tools.len()),
        "{}",
        reply.body
    );
    // And through a real 2026 client.
    let client = f.client(&token, ProtocolVersion::V_2026_07_28).await;
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), registry().tools.len());
    let templates = ok(&client, "sandbox_template_list", json!({})).await;
    assert!(templates.to_string().contains("base"), "{templates}");
}

#[tokio::test]
async fn session_sandboxes_are_per_session_and_die_with_delete_and_idle() {
    require_sandboxes!();
    let f = Fixture::start_with(|o| {
        o.session_sandbox = true;
        o.session_idle = Duration::from_secs(3);
    })
    .await;
    let raw = f.raw();
    let token = f.token("alpha");
    let a = raw.open_session(Some(&token)).await;
    let b = raw.open_session(Some(&token)).await;

    // The profile's tools take no sandbox_id and cannot create or kill sandboxes.
    let list = raw
        .post(
            Some(&token),
            Some(&a),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
    let tools = list.body["result"]["tools"].as_array().cloned().unwrap();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(
        names.contains(&"sandbox_exec") && !names.contains(&"sandbox_create"),
        "{names:?}"
    );
    for t in &tools {
        assert!(
            t["inputSchema"]["properties"].get("sandbox_id").is_none(),
            "{} still asks for sandbox_id",
            t["name"]
        );
    }
    assert!(f.sandboxes().is_empty(), "created before first use");

    // Created on first use, one per session, kept across calls.
    let r = raw
        .call(
            &token,
            &a,
            3,
            "sandbox_files_write",
            json!({"path": "who", "content": "session a"}),
        )
        .await;
    assert_ne!(r["isError"], true, "{r}");
    let r = raw
        .call(
            &token,
            &b,
            3,
            "sandbox_exec",
            json!({"command": "cat who || echo none"}),
        )
        .await;
    assert_eq!(r["structuredContent"]["stdout"], "none\n", "{r}");
    let r = raw
        .call(&token, &a, 4, "sandbox_exec", json!({"command": "cat who"}))
        .await;
    assert_eq!(r["structuredContent"]["stdout"], "session a", "{r}");
    let both = f.sandboxes();
    assert_eq!(both.len(), 2, "{both:?}");
    let info = raw.call(&token, &a, 5, "sandbox_info", json!({})).await;
    let sandbox_a = info["structuredContent"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        info["structuredContent"]["metadata"]["mcp-session"], "true",
        "{info}"
    );

    // DELETE ends session a and kills its sandbox; b's stays.
    assert!(raw.delete(&token, &a).await.is_success());
    f.wait_for_sandboxes(
        |ids| !ids.contains(&sandbox_a) && ids.len() == 1,
        "session a's sandbox should be killed on DELETE",
    )
    .await;

    // b goes idle past the timeout: the session closes and its sandbox is killed.
    f.wait_for_sandboxes(
        |ids| ids.is_empty(),
        "session b's sandbox should be killed once idle",
    )
    .await;
    let gone = raw
        .post(
            Some(&token),
            Some(&b),
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}),
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);

    // A stateless request has no session to own a sandbox: a clear error, nothing created.
    let stateless = raw
        .send(
            raw.request(reqwest::Method::POST, Some(&token))
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "sandbox_exec")
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "_meta": meta_2026(), "name": "sandbox_exec", "arguments": {"command": "true"}}})),
        )
        .await;
    assert_eq!(
        stateless.body["result"]["isError"], true,
        "{}",
        stateless.body
    );
    let message = stateless.body["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("session"), "{message}");
    assert!(f.sandboxes().is_empty());
}

#[tokio::test]
async fn a_dead_session_sandbox_is_reported_once_then_replaced() {
    require_sandboxes!();
    let f = Fixture::start_with(|o| o.session_sandbox = true).await;
    let client = f
        .client(&f.token("alpha"), ProtocolVersion::V_2025_11_25)
        .await;
    let first = ok(&client, "sandbox_info", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A missing file is an ordinary not-found: the sandbox is kept.
    let missing = call(&client, "sandbox_files_read", json!({"path": "nope.txt"})).await;
    assert_eq!(missing.is_error, Some(true));
    assert!(
        !text(&missing).contains("no longer exists"),
        "{}",
        text(&missing)
    );
    assert_eq!(ok(&client, "sandbox_info", json!({})).await["id"], first);

    // Killed behind the session's back (an operator, or its own time limit).
    f.engine
        .client()
        .kill_sandbox()
        .sandbox_id(first.clone())
        .send()
        .await
        .unwrap();
    let r = call(&client, "sandbox_exec", json!({"command": "true"})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(
        text(&r).contains("no longer exists") && text(&r).contains("fresh sandbox"),
        "{}",
        text(&r)
    );
    let r = ok(&client, "sandbox_exec", json!({"command": "echo again"})).await;
    assert_eq!(r["stdout"], "again\n");
    let second = ok(&client, "sandbox_info", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(first, second);
    drop(client);
    f.wait_for_sandboxes(
        |ids| ids.is_empty(),
        "the replacement dies with the session too",
    )
    .await;
}
