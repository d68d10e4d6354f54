//! SuperBox's session rules: one instance (sandbox and process) per MCP session, `DELETE` ends
//! it, idle sessions are evicted, warm pools start sessions initialized; a tenant sees only its
//! own sessions and servers; `/mcp?name=NAME` and stateless 2026-07-28 requests.

use super::*;

/// Plain requests to a hosted server's endpoint, for what a client library hides.
struct Raw<'a> {
    hosted: &'a Hosted,
    path: String,
    token: String,
}

impl Raw<'_> {
    async fn post(&self, session: Option<&str>, body: Value) -> reqwest::Response {
        let mut r = self
            .hosted
            .http()
            .post(format!("{}{}", self.hosted.base, self.path))
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.send().await.unwrap()
    }

    /// `initialize`; the session id and the result.
    async fn open(&self, version: &str) -> (String, Value) {
        let r = self
            .post(None, json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
            .await;
        assert_eq!(r.status(), 200);
        let session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .expect("a session id");
        let body: Value = r.json().await.unwrap();
        let _ = self
            .post(
                Some(&session),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .await;
        (session, body)
    }

    /// A request's JSON-RPC response (from a JSON body or the end of an SSE stream).
    async fn call(
        &self,
        session: Option<&str>,
        id: u64,
        method: &str,
        params: Value,
    ) -> (u16, Value) {
        let r = self
            .post(
                session,
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
            )
            .await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let body = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .map(|d| serde_json::from_str(d).unwrap())
            .unwrap_or_else(|| serde_json::from_str(&text).unwrap_or(Value::Null));
        (status, body)
    }

    async fn delete(&self, session: &str) -> u16 {
        self.hosted
            .http()
            .delete(format!("{}{}", self.hosted.base, self.path))
            .bearer_auth(&self.token)
            .header("mcp-session-id", session)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}

fn raw<'a>(hosted: &'a Hosted, path: &str, token: &str) -> Raw<'a> {
    Raw {
        hosted,
        path: path.to_string(),
        token: token.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_session_has_its_own_sandbox_and_delete_ends_it() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    hosted
        .register_ok(None, "memory", reference_registration("memory"))
        .await;
    let token = hosted.token("alice");
    let a = hosted.connect("memory", &token).await;
    let b = hosted.connect("memory", &token).await;
    let r = tool(
        a.peer(),
        "create_entities",
        json!({"entities": [{"name": "only-in-a", "entityType": "note", "observations": ["a's secret"]}]}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", said(&r));
    // Two sessions, two sandboxes: b's server never saw a's graph.
    assert_eq!(hosted.sandboxes_of("memory").len(), 2);
    let r = tool(b.peer(), "read_graph", json!({})).await;
    assert!(!said(&r).contains("a's secret"), "{}", said(&r));
    // DELETE (what the client sends when it closes) ends the session and its sandbox.
    a.cancel().await.unwrap();
    hosted
        .wait_until("a's sandbox is gone", || {
            hosted.sandboxes_of("memory").len() == 1
        })
        .await;
    let r = tool(b.peer(), "read_graph", json!({})).await;
    assert_ne!(r.is_error, Some(true), "b lives on: {}", said(&r));
    b.cancel().await.unwrap();
    hosted
        .wait_until("b's sandbox is gone", || {
            hosted.sandboxes_of("memory").is_empty()
        })
        .await;
    assert_eq!(hosted.server.hosted.count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_are_evicted_and_deleted_ones_are_gone() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let mut body = reference_registration("time");
    body["idle_timeout_seconds"] = json!(10);
    hosted.register_ok(None, "time", body).await;
    let token = hosted.token("alice");
    let raw = raw(&hosted, "/servers/time/mcp", &token);
    let (idle, _) = raw.open("2025-06-18").await;
    let (deleted, _) = raw.open("2025-06-18").await;
    assert_eq!(hosted.sandboxes_of("time").len(), 2);
    assert_eq!(raw.delete(&deleted).await, 200);
    let (status, _) = raw.call(Some(&deleted), 2, "tools/list", json!({})).await;
    assert_eq!(status, 404, "a deleted session is gone");
    // The idle one goes after its server's timeout, with its sandbox.
    hosted
        .wait_until("the idle session's sandbox is gone", || {
            hosted.sandboxes_of("time").is_empty()
        })
        .await;
    let (status, body) = raw.call(Some(&idle), 3, "tools/list", json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.to_string().contains("send initialize"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_pools_start_sessions_already_initialized() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let mut body = reference_registration("time");
    body["warm"] = json!(2);
    hosted.register_ok(None, "time", body).await;
    let token = hosted.token("alice");
    // The operator's pools fill when the HTTP server starts; this one was registered after,
    // so it is warmed by hand here (or by its first session).
    let server =
        sandbox_mcp_server::hosted::http::lookup(&hosted.server.hosted, Some("alice"), "time")
            .await
            .unwrap();
    hosted.server.hosted.refill(&server);
    hosted
        .wait_until("two warm instances", || {
            hosted.server.hosted.warm_count(None, "time") == 2
        })
        .await;
    let raw = raw(&hosted, "/servers/time/mcp", &token);
    let started = Instant::now();
    let (session, init) = raw.open("2025-06-18").await;
    let warm_start = started.elapsed();
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-time", "{init}");
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    let (_, r) = raw
        .call(
            Some(&session),
            2,
            "tools/call",
            json!({"name": "get_current_time", "arguments": {"timezone": "UTC"}}),
        )
        .await;
    assert!(r.to_string().contains("UTC"), "{r}");
    // Taken from the pool, which refills.
    hosted
        .wait_until("the pool refilled", || {
            hosted.server.hosted.warm_count(None, "time") == 2
        })
        .await;
    eprintln!("warm session start: {warm_start:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_only_their_own_servers_and_sessions() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let (alice, bob) = (hosted.token("alice"), hosted.token("bob"));
    hosted
        .register_ok(Some("alice"), "alices-time", reference_registration("time"))
        .await;
    hosted
        .register_ok(None, "shared-time", reference_registration("time"))
        .await;
    // Bob cannot start alice's server: it answers as if it did not exist.
    let (status, body) = raw(&hosted, "/servers/alices-time/mcp", &bob)
        .call(None, 1, "initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.to_string()
            .contains("no hosted server named alices-time"),
        "{body}"
    );
    // Alice's session id is unknown to bob.
    let (session, _) = raw(&hosted, "/servers/alices-time/mcp", &alice)
        .open("2025-11-25")
        .await;
    let (status, _) = raw(&hosted, "/servers/alices-time/mcp", &bob)
        .call(Some(&session), 2, "tools/list", json!({}))
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        raw(&hosted, "/servers/alices-time/mcp", &bob)
            .delete(&session)
            .await,
        404
    );
    // Both use the operator's shared server, each in a sandbox of its own; those sandboxes are
    // the operator's, so neither tenant can exec into one (and read its environment).
    let (alices_shared, _) = raw(&hosted, "/servers/shared-time/mcp", &alice)
        .open("2025-11-25")
        .await;
    let (_, _) = raw(&hosted, "/servers/shared-time/mcp", &bob)
        .open("2025-11-25")
        .await;
    // A server both may use: alice's session on it is still unknown to bob, who can neither
    // call through it nor end it; alice's goes on.
    let (status, _) = raw(&hosted, "/servers/shared-time/mcp", &bob)
        .call(Some(&alices_shared), 3, "tools/list", json!({}))
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        raw(&hosted, "/servers/shared-time/mcp", &bob)
            .delete(&alices_shared)
            .await,
        404
    );
    let (status, listed) = raw(&hosted, "/servers/shared-time/mcp", &alice)
        .call(Some(&alices_shared), 4, "tools/list", json!({}))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert!(listed.to_string().contains("get_current_time"), "{listed}");
    let owners = |name: &str| -> Vec<Option<String>> {
        let label = [(
            sandbox_mcp_server::hosted::SERVER_LABEL.to_string(),
            name.to_string(),
        )];
        hosted
            .engine
            .manager
            .list(None, &label, None)
            .into_iter()
            .map(|r| r.tenant)
            .collect()
    };
    assert_eq!(owners("shared-time"), [None, None]);
    for tenant in ["alice", "bob"] {
        let listed: Value = hosted
            .http()
            .get(format!(
                "{}/v1/sandboxes?metadata=sandbox-mcp.server%3Dshared-time",
                hosted.engine.url
            ))
            .bearer_auth(KEY)
            .header("x-sandbox-tenant", tenant)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            listed["sandboxes"],
            json!([]),
            "{tenant} sees the operator's sandboxes"
        );
    }
    // Alice's own server runs in alice's sandboxes.
    assert_eq!(owners("alices-time"), [Some("alice".to_string())]);
    // A tenant can neither shadow nor remove the operator's server.
    let (status, _) = hosted
        .register(Some("bob"), "shared-time", reference_registration("time"))
        .await;
    assert_eq!(status, 409);
    let status = hosted
        .http()
        .delete(format!("{}/v1/servers/shared-time", hosted.engine.url))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "bob")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn superbox_paths_and_stateless_requests_work() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    hosted
        .register_ok(None, "time", reference_registration("time"))
        .await;
    let token = hosted.token("alice");
    // SuperBox's clients POST to /mcp?name=NAME.
    let alias = raw(&hosted, "/mcp?name=time", &token);
    let (session, init) = alias.open("2025-11-25").await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
    let (_, r) = alias.call(Some(&session), 2, "tools/list", json!({})).await;
    assert!(r.to_string().contains("get_current_time"), "{r}");
    assert_eq!(alias.delete(&session).await, 200);
    // A 2026-07-28 request without a session: an instance for that request alone.
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let stateless = raw(&hosted, "/servers/time/mcp", &token);
    let (status, r) = stateless
        .call(
            None,
            7,
            "tools/call",
            json!({"name": "get_current_time", "arguments": {"timezone": "UTC"}, "_meta": meta}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["result"].to_string().contains("UTC"), "{r}");
    hosted
        .wait_until("the stateless instance is gone", || {
            hosted.sandboxes_of("time").is_empty()
        })
        .await;
    // Without a session or the 2026-07-28 envelope: told what to do.
    let (status, r) = stateless.call(None, 8, "tools/list", json!({})).await;
    assert_eq!(status, 400);
    assert!(r.to_string().contains("send initialize first"), "{r}");
}
