//! The Streamable HTTP transport over real TCP: keys and tenants, Host/Origin checks, sessions,
//! session sandboxes, stateless 2026-07-28 requests, rate limits, concurrency, shutdown.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
    ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::http::{HttpOptions, HttpServer};
use sandbox_mcp_server::keys::KeyStore;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_server::tooldefs::registry;

use crate::common::{BIN, KEY, TestEngine, text};
use crate::require_sandboxes;

type HttpClient = RunningService<RoleClient, ClientConfig>;

/// An engine, a key store and an MCP HTTP server in front of them.
struct Fixture {
    engine: TestEngine,
    keys: Arc<KeyStore>,
    _keydir: tempfile::TempDir,
    _server: HttpServer,
    url: String,
}

fn options() -> HttpOptions {
    HttpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        dev: false,
        allowed_hosts: vec![],
        allowed_origins: vec![],
        rate_limit: 0.0,
        session_idle: Duration::from_secs(1800),
        session_sandbox: false,
    }
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    async fn start_with(adjust: impl FnOnce(&mut HttpOptions)) -> Self {
        let engine = TestEngine::start().await;
        let backend = Backend::remote(&engine.url, Some(ApiKey::new(KEY))).unwrap();
        Self::start_on(engine, backend, adjust).await
    }

    async fn start_on(
        engine: TestEngine,
        backend: Backend,
        adjust: impl FnOnce(&mut HttpOptions),
    ) -> Self {
        let keydir = tempfile::tempdir().unwrap();
        let keys = Arc::new(KeyStore::open(keydir.path()));
        let mut opts = options();
        adjust(&mut opts);
        let profile = opts.session_sandbox.then_some("session");
        let tools = registry().select_in(profile, "all").unwrap();
        let server = HttpServer::start(
            opts,
            backend,
            Some(keys.clone()),
            tools,
            ServerSettings::default(),
        )
        .await
        .unwrap();
        let url = format!("http://{}/mcp", server.addr);
        Self {
            engine,
            keys,
            _keydir: keydir,
            _server: server,
            url,
        }
    }

    /// A new token for `tenant`, created the way `sandbox-mcp keys create` does (a separate
    /// store on the same file: the running server must pick it up by itself).
    fn token(&self, tenant: &str) -> String {
        let store = KeyStore::open(self.keys.path().parent().unwrap());
        store.create(tenant).unwrap().1
    }

    fn raw(&self) -> Raw {
        Raw {
            http: sandbox_mcp_api::http_builder().no_proxy().build().unwrap(),
            url: self.url.clone(),
        }
    }

    /// A real rmcp client over Streamable HTTP. 2025 versions open a session; 2026-07-28 is
    /// stateless.
    async fn client(&self, token: &str, version: ProtocolVersion) -> HttpClient {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(self.url.clone()).auth_header(token),
        );
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("http-test", "0"),
        )
        .with_protocol_version(version)
        .serve(transport)
        .await
        .unwrap_or_else(|e| panic!("MCP client could not connect over HTTP: {e}"))
    }

    /// Ids of the sandboxes the engine holds (all tenants).
    fn sandboxes(&self) -> Vec<String> {
        self.engine
            .manager
            .list(None, &[], None)
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    async fn wait_for_sandboxes(&self, want: impl Fn(&[String]) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = self.sandboxes();
            if want(&now) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}; sandboxes: {now:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Plain HTTP requests for what an MCP client library would never send.
struct Raw {
    http: reqwest::Client,
    url: String,
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    /// The JSON-RPC response (from a JSON body or the SSE stream).
    body: Value,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

const INIT_2025: &str = "2025-11-25";

fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

impl Raw {
    fn request(&self, method: reqwest::Method, token: Option<&str>) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, &self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let sse = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let text = response.text().await.unwrap_or_default();
        let body = if sse {
            // The JSON-RPC response is the data of the event that carries an id with a result
            // or error (progress notifications and priming events come first).
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .find(|m| m.get("result").is_some() || m.get("error").is_some())
                .unwrap_or(Value::Null)
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn post(&self, token: Option<&str>, session: Option<&str>, message: Value) -> Reply {
        let mut r = self.request(reqwest::Method::POST, token).json(&message);
        if let Some(s) = session {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", INIT_2025);
        }
        self.send(r).await
    }

    /// Opens a 2025 session and returns its id.
    async fn open_session(&self, token: Option<&str>) -> String {
        let init = self.post(token, None, initialize(INIT_2025)).await;
        assert_eq!(init.status, StatusCode::OK, "{}", init.body);
        let session = init
            .header("mcp-session-id")
            .unwrap_or_else(|| panic!("no Mcp-Session-Id on initialize: {:?}", init.headers))
            .to_string();
        let note = self
            .post(
                token,
                Some(&session),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .await;
        assert!(note.status.is_success(), "{}", note.status);
        session
    }

    async fn call(&self, token: &str, session: &str, id: u64, tool: &str, args: Value) -> Value {
        let reply = self
            .post(
                Some(token),
                Some(session),
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body["result"].clone()
    }

    async fn delete(&self, token: &str, session: &str) -> StatusCode {
        let r = self
            .request(reqwest::Method::DELETE, Some(token))
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", INIT_2025);
        self.send(r).await.status
    }
}

async fn call(client: &HttpClient, name: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("arguments must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(map))
        .await
        .unwrap_or_else(|e| panic!("{name} failed at the protocol level: {e}"))
}

async fn ok(client: &HttpClient, name: &str, args: Value) -> Value {
    let r = call(client, name, args).await;
    assert_ne!(r.is_error, Some(true), "{name}: {}", text(&r));
    r.structured_content.unwrap_or(Value::Null)
}

#[tokio::test]
async fn missing_wrong_and_revoked_tokens_get_401_and_new_keys_work_without_restart() {
    let f = Fixture::start().await;
    let raw = f.raw();

    let none = raw.post(None, None, initialize(INIT_2025)).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    let message = none.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("keys create"), "{}", none.body);

    let wrong = raw
        .post(Some("smcp_not-a-real-token"), None, initialize(INIT_2025))
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.header("www-authenticate"), Some("Bearer"));

    // A key created after the server started (as `keys create` would) works at once.
    let token = f.token("alpha");
    let good = raw.post(Some(&token), None, initialize(INIT_2025)).await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.body);
    assert!(good.header("mcp-session-id").is_some());

    // Tokens are accepted only in the Authorization header.
    let in_query = raw
        .send(
            raw.http
                .post(format!("{}?access_token={token}&token={token}", raw.url))
                .header("accept", "application/json, text/event-stream")
                .json(&initialize(INIT_2025)),
        )
        .await;
    assert_eq!(in_query.status, StatusCode::UNAUTHORIZED);
    let other_scheme = raw
        .send(
            raw.request(reqwest::Method::POST, None)
                .header("authorization", format!("Basic {token}"))
                .json(&initialize(INIT_2025)),
        )
        .await;
    assert_eq!(other_scheme.status, StatusCode::UNAUTHORIZED);

    // Revoked through another store on the same file (as `keys revoke` would): refused at once,
    // including inside the session it opened.
    let session = raw.open_session(Some(&token)).await;
    let store = KeyStore::open(f.keys.path().parent().unwrap());
    let id = store
        .list()
        .unwrap()
        .into_iter()
        .find(|k| k.tenant == "alpha")
        .unwrap()
        .id;
    store.revoke(&id).unwrap();
    let revoked = raw.post(Some(&token), None, initialize(INIT_2025)).await;
    assert_eq!(revoked.status, StatusCode::UNAUTHORIZED);
    let in_session = raw
        .post(
            Some(&token),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
    assert_eq!(in_session.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn foreign_host_or_origin_gets_403_and_flags_allow_more() {
    let f = Fixture::start_with(|o| {
        o.allowed_hosts = vec!["mcp.example.com".into()];
        o.allowed_origins = vec!["https://app.example.com".into()];
    })
    .await;
    let raw = f.raw();
    let token = f.token("alpha");
    let post = |host: Option<&str>, origin: Option<&str>| {
        let mut r = raw
            .request(reqwest::Method::POST, Some(&token))
            .json(&initialize(INIT_2025));
        if let Some(h) = host {
            r = r.header("host", h);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        raw.send(r)
    };

    for (host, origin) in [
        (Some("evil.example.com"), None),
        (Some("evil.example.com:80"), None),
        (Some("localhost.evil.example.com"), None),
        (None, Some("http://evil.example.com")),
        (None, Some("https://localhost.evil.example.com")),
        (None, Some("null")),
        (None, Some("https://app.example.com.evil.example.com")),
    ] {
        let r = post(host, origin).await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "host {host:?} origin {origin:?}"
        );
        let message = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("--allow-"), "{}", r.body);
    }
    for (host, origin) in [
        (None, None),
        (Some("localhost"), Some("http://localhost:5173")),
        (Some("127.0.0.1"), Some("http://127.0.0.1:3000")),
        (Some("mcp.example.com"), None),
        (Some("mcp.example.com:443"), Some("https://mcp.example.com")),
        (None, Some("https://app.example.com")),
    ] {
        let r = post(host, origin).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "host {host:?} origin {origin:?}: {}",
            r.body
        );
    }
    // The checks come before authentication: a foreign Host learns nothing about tokens.
    let r = raw
        .send(
            raw.request(reqwest::Method::POST, None)
                .header("host", "evil.example.com")
                .json(&initialize(INIT_2025)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

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

/// Another tenant's sandbox id answers exactly like an id that does not exist.
#[tokio::test]
async fn tenants_see_and_touch_only_their_own_sandboxes() {
    require_sandboxes!();
    let f = Fixture::start().await;
    let alpha = f
        .client(&f.token("alpha"), ProtocolVersion::V_2025_11_25)
        .await;
    let beta = f
        .client(&f.token("beta"), ProtocolVersion::V_2026_07_28)
        .await;
    let created = ok(
        &alpha,
        "sandbox_create",
        json!({"metadata": {"owner": "alpha"}}),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_string();
    ok(
        &alpha,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "secret.txt", "content": "alpha only"}),
    )
    .await;

    let listed = ok(&beta, "sandbox_list", json!({})).await;
    assert!(!listed.to_string().contains(&id), "{listed}");
    let listed = ok(&alpha, "sandbox_list", json!({})).await;
    assert!(listed.to_string().contains(&id), "{listed}");

    let fake = "sbx_00000000000000000000000000";
    let probes: [(&str, Value); 7] = [
        ("sandbox_info", json!({})),
        ("sandbox_exec", json!({"command": "cat secret.txt"})),
        ("sandbox_files_read", json!({"path": "secret.txt"})),
        ("sandbox_files_list", json!({"path": "."})),
        ("sandbox_files_write", json!({"path": "x", "content": "y"})),
        ("sandbox_pause", json!({})),
        ("sandbox_kill", json!({})),
    ];
    for (tool, args) in probes {
        let with = |sid: &str| {
            let mut a = args.clone();
            a["sandbox_id"] = json!(sid);
            a
        };
        let foreign = call(&beta, tool, with(&id)).await;
        let unknown = call(&beta, tool, with(fake)).await;
        assert_eq!(foreign.is_error, Some(true), "{tool}: {}", text(&foreign));
        assert_eq!(
            text(&foreign).replace(&id, "<id>"),
            text(&unknown).replace(fake, "<id>"),
            "{tool}: a foreign id must look unknown"
        );
    }
    // Nothing beta tried touched it.
    let r = ok(
        &alpha,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "cat secret.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "alpha only");
    let info = ok(&alpha, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "running", "{info}");
    ok(&alpha, "sandbox_kill", json!({"sandbox_id": id})).await;
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

/// A recording TCP proxy in front of the real engine: whatever the MCP server sends to the
/// control plane passes through it.
async fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let record = record.clone();
            let target = target.clone();
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(&target).await.unwrap();
                let (mut ri, mut wi) = inbound.split();
                let (mut ro, mut wo) = outbound.split();
                let up = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = ri.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            let _ = wo.shutdown().await;
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if wo.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async {
                    let _ = tokio::io::copy(&mut ro, &mut wi).await;
                    let _ = wi.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn the_mcp_token_never_reaches_the_control_plane() {
    let engine = TestEngine::start().await;
    let target = engine
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let (proxy, seen) = recording_proxy(target).await;
    let backend = Backend::remote(&proxy, Some(ApiKey::new(KEY))).unwrap();
    let f = Fixture::start_on(engine, backend, |_| {}).await;
    let token = f.token("alpha");
    let client = f.client(&token, ProtocolVersion::V_2025_11_25).await;
    ok(&client, "sandbox_list", json!({})).await;
    ok(&client, "sandbox_template_list", json!({})).await;
    let bytes = String::from_utf8_lossy(&seen.lock().unwrap()).to_lowercase();
    assert!(bytes.contains("x-sandbox-tenant: alpha"), "{bytes}");
    assert!(
        bytes.contains(&format!("bearer {}", KEY.to_lowercase())),
        "{bytes}"
    );
    assert!(
        !bytes.contains(&token.to_lowercase()),
        "the MCP token was forwarded"
    );
}

// ---- The binary: keys CLI, --dev refusal, graceful shutdown ----

fn cli(data: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("SANDBOX_MCP_DATA_DIR", data)
        .env_remove("SANDBOX_MCP_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn keys_cli_prints_the_token_alone_and_stores_only_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(dir.path(), &["keys", "create", "--tenant", "team-a"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "stdout must be the token alone: {stdout:?}"
    );
    let token = stdout.trim_end_matches('\n');
    assert!(
        token.starts_with("smcp_") && token.len() > 30 && !token.contains(' '),
        "{token}"
    );

    let file = dir.path().join("mcp-keys.json");
    let stored = std::fs::read_to_string(&file).unwrap();
    assert!(!stored.contains(token), "the token must not be stored");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let list = cli(dir.path(), &["keys", "list"]);
    let listed = String::from_utf8(list.stdout).unwrap();
    assert!(
        listed.contains("team-a") && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(token));
    let id = listed
        .lines()
        .find(|l| l.contains("team-a"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let revoke = cli(dir.path(), &["keys", "revoke", &id]);
    assert!(revoke.status.success());
    assert!(revoke.stdout.is_empty());
    let listed = String::from_utf8(cli(dir.path(), &["keys", "list"]).stdout).unwrap();
    assert!(listed.contains("revoked"), "{listed}");

    let bad = cli(dir.path(), &["keys", "create", "--tenant", "Bad Name!"]);
    assert!(!bad.status.success());
    assert!(bad.stdout.is_empty());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid tenant name"));
    let missing = cli(dir.path(), &["keys", "revoke", "key_nope"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("keys list"));
}

#[test]
fn dev_mode_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(
        dir.path(),
        &[
            "serve",
            "--http",
            "0.0.0.0:0",
            "--dev",
            "--url",
            "http://127.0.0.1:9",
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--dev") && stderr.contains("loopback"),
        "{stderr}"
    );
}

/// A `serve --http` process on a free port, pointed at `engine`; its address once it listens.
fn spawn_http_server(
    data: &std::path::Path,
    engine: &TestEngine,
    extra: &[&str],
) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0"])
        .args(extra)
        .env("SANDBOX_MCP_DATA_DIR", data)
        .env("SANDBOX_MCP_URL", &engine.url)
        .env("SANDBOX_MCP_API_KEY", KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "server exited before listening"
        );
        if let Some(rest) = line.trim().strip_prefix("sandbox-mcp: serving MCP on ") {
            break rest.to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (child, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_calls_then_exits() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let data = tempfile::tempdir().unwrap();
    let token =
        String::from_utf8(cli(data.path(), &["keys", "create", "--tenant", "alpha"]).stdout)
            .unwrap()
            .trim()
            .to_string();
    let (mut child, url) = spawn_http_server(data.path(), &engine, &[]);
    let raw = Raw {
        http: sandbox_mcp_api::http_builder().no_proxy().build().unwrap(),
        url,
    };
    let session = raw.open_session(Some(&token)).await;
    let created = raw
        .call(&token, &session, 2, "sandbox_create", json!({}))
        .await;
    let id = created["structuredContent"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let slow = {
        let raw = Raw {
            http: raw.http.clone(),
            url: raw.url.clone(),
        };
        let (token, session, id) = (token.clone(), session.clone(), id.clone());
        tokio::spawn(async move {
            raw.call(
                &token,
                &session,
                3,
                "sandbox_exec",
                json!({"sandbox_id": id, "command": "sleep 2; echo finished"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let result = slow.await.unwrap();
    assert_eq!(
        result["structuredContent"]["stdout"], "finished\n",
        "{result}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    // The sandbox is the tenant's, not the session's: it outlives the server.
    assert_eq!(engine.manager.list(None, &[], None).len(), 1);
    engine
        .client()
        .kill_sandbox()
        .sandbox_id(id)
        .send()
        .await
        .unwrap();
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
