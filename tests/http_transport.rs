//! The Streamable HTTP transport over real TCP: keys and tenants, Host/Origin checks, sessions,
//! session sandboxes, stateless 2026-07-28 requests, rate limits, concurrency, shutdown.
//!
//! This file holds the fixture (an engine, a key store and an MCP HTTP server in front of them)
//! and the raw client; the tests are by theme: [`access`] (tokens, tenants, hosts and origins),
//! [`sessions`] (sessions, stateless requests, session sandboxes), [`limits`] (rate limits, body
//! size, concurrency, malformed bodies) and [`binary`] (the keys CLI, `--dev`, graceful shutdown).

use std::sync::Arc;
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

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::http::{HttpOptions, HttpServer};
use sandbox_mcp_server::keys::KeyStore;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_server::tooldefs::registry;

use crate::common::{KEY, TestEngine, text};

mod access;
mod binary;
mod limits;
mod sessions;

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
        mount_servers: vec![],
        oauth: None,
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
