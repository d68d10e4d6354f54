//! Hosted MCP servers: real third-party servers (three from npm, two from PyPI) run in sandboxes
//! and driven by a real MCP client (rmcp) through every door — `sandbox-mcp run` on stdio,
//! `/servers/NAME/mcp` over Streamable HTTP, and mounted into our own endpoint.
//!
//! This file holds the fixture (an engine, keys, the HTTP server) and what every door shares:
//! [`exercise`] drives one reference server through whatever client it is given. The tests are
//! by theme: [`doors`] (the five servers through each door), [`sessions`] (one sandbox per
//! session, DELETE, idle eviction, warm pools, tenants, stateless requests), [`fidelity`]
//! (progress, sampling, versions, resources and prompts), [`failures`] (servers that exit, hang,
//! print garbage or flood), [`containment`] (host files and environment, the engine, secrets) and
//! [`registry`] (the API, the CLI, servers from source).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::http::{HttpOptions, HttpServer};
use sandbox_mcp_server::keys::KeyStore;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_server::tooldefs::registry;

use crate::common::{KEY, TestEngine, server_program};
use crate::testnet::TestNet;

mod containment;
mod doors;
mod failures;
mod fidelity;
mod registry;
mod sessions;

/// An engine (resolving through the test internet when there is one), a key store and an MCP
/// HTTP server in front of them.
struct Hosted {
    engine: TestEngine,
    keys: Arc<KeyStore>,
    _keydir: tempfile::TempDir,
    server: HttpServer,
    base: String,
}

impl Hosted {
    async fn start(net: Option<&TestNet>) -> Self {
        Self::start_with(net, |_| {}, "all").await
    }

    async fn start_with(
        net: Option<&TestNet>,
        adjust: impl FnOnce(&mut HttpOptions),
        tools: &str,
    ) -> Self {
        let dns = net.map(|n| (n.dns, format!("{}/32", n.net_ip)));
        let engine = TestEngine::start_with(move |c| {
            if let Some((dns, allow)) = dns {
                c.network.dns_upstream = vec![dns];
                c.network.egress_allow = vec![allow];
            }
        })
        .await;
        let backend = Backend::remote(&engine.url, Some(ApiKey::new(KEY))).unwrap();
        let keydir = tempfile::tempdir().unwrap();
        let keys = Arc::new(KeyStore::open(keydir.path()));
        let mut opts = HttpOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            dev: false,
            allowed_hosts: vec![],
            allowed_origins: vec![],
            rate_limit: 0.0,
            session_idle: Duration::from_secs(1800),
            session_sandbox: false,
            mount_servers: vec![],
            oauth: None,
        };
        adjust(&mut opts);
        let server = HttpServer::start(
            opts,
            backend,
            Some(keys.clone()),
            registry().select(tools).unwrap(),
            ServerSettings::default(),
        )
        .await
        .unwrap();
        server.hosted.set_initialize_wait(Duration::from_secs(20));
        let base = format!("http://{}", server.addr);
        Self {
            engine,
            keys,
            _keydir: keydir,
            server,
            base,
        }
    }

    fn token(&self, tenant: &str) -> String {
        let store = KeyStore::open(self.keys.path().parent().unwrap());
        store.create(tenant).unwrap().1
    }

    fn http(&self) -> reqwest::Client {
        sandbox_mcp_api::http_builder().no_proxy().build().unwrap()
    }

    /// Registers server `name` through the engine API, as `tenant` (the operator with `None`).
    async fn register(&self, tenant: Option<&str>, name: &str, body: Value) -> (u16, Value) {
        let mut request = self
            .http()
            .put(format!("{}/v1/servers/{name}", self.engine.url))
            .bearer_auth(KEY)
            .json(&body);
        if let Some(t) = tenant {
            request = request.header("x-sandbox-tenant", t);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn register_ok(&self, tenant: Option<&str>, name: &str, body: Value) {
        let (status, answer) = self.register(tenant, name, body).await;
        assert_eq!(status, 200, "{answer}");
    }

    /// A real MCP client of hosted server `name`.
    async fn connect(
        &self,
        name: &str,
        token: &str,
    ) -> rmcp::service::RunningService<RoleClient, ()> {
        self.connect_with(name, token, ()).await
    }

    async fn connect_with<H: rmcp::ClientHandler>(
        &self,
        name: &str,
        token: &str,
        handler: H,
    ) -> rmcp::service::RunningService<RoleClient, H> {
        self.client_at(&format!("/servers/{name}/mcp"), token, handler)
            .await
    }

    /// A real MCP client of the endpoint at `path` (`/mcp`, `/servers/NAME/mcp`).
    async fn client_at<H: rmcp::ClientHandler>(
        &self,
        path: &str,
        token: &str,
        handler: H,
    ) -> rmcp::service::RunningService<RoleClient, H> {
        use rmcp::ServiceExt;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{}{path}", self.base))
                .auth_header(token),
        );
        handler
            .serve(transport)
            .await
            .unwrap_or_else(|e| panic!("MCP client could not connect to {path}: {e}"))
    }

    /// `sandbox-mcp servers ARGS…` against this engine.
    fn servers_cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(crate::common::BIN)
            .args(["servers", "--url", &self.engine.url, "--api-key", KEY])
            .args(args)
            .output()
            .unwrap()
    }

    /// Ids of the sandboxes running hosted server `name` (any tenant).
    fn sandboxes_of(&self, name: &str) -> Vec<String> {
        let label = [(
            sandbox_mcp_server::hosted::SERVER_LABEL.to_string(),
            name.to_string(),
        )];
        self.engine
            .manager
            .list(None, &label, None)
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    async fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The command that starts reference server `name` (the filesystem server is given /tmp).
fn reference_command(name: &str) -> Vec<String> {
    let program = crate::common::REFERENCE_SERVERS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, p, _)| *p)
        .unwrap();
    let mut command = vec![server_program(program).unwrap()];
    if name == "filesystem" {
        command.push("/tmp".into());
    }
    if name == "fetch" {
        // The test internet is TEST-NET-2, which the server's own SSRF guard counts as private;
        // the sandbox's allowlist is what confines it here.
        command.push("--allow-private-ips".into());
    }
    command
}

/// The registration of reference server `name`; fetch may reach the test internet's API host.
fn reference_registration(name: &str) -> Value {
    let mut body = json!({"command": reference_command(name)});
    if name == "fetch" {
        body["allow_out"] = json!(["api.example.test"]);
    }
    body
}

/// The names of every tool `peer` lists.
async fn tool_names(peer: &Peer<RoleClient>) -> Vec<String> {
    peer.list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

/// Calls a tool; the result, tool errors included.
async fn tool(peer: &Peer<RoleClient>, name: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("arguments must be an object")
    };
    peer.call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(map))
        .await
        .unwrap_or_else(|e| panic!("{name} failed at the protocol level: {e}"))
}

/// Everything a result says: its text blocks and its structured content.
fn said(result: &CallToolResult) -> String {
    let mut text = crate::common::text(result);
    if let Some(s) = &result.structured_content {
        text.push('\n');
        text.push_str(&s.to_string());
    }
    text
}

/// Drives reference server `server` through `peer`, its tools prefixed with `prefix` (mounted
/// servers' are namespaced): one real task of each.
async fn exercise(peer: &Peer<RoleClient>, server: &str, prefix: &str) {
    let t = |name: &str| format!("{prefix}{name}");
    let tools = tool_names(peer).await;
    assert!(!tools.is_empty(), "{server} lists no tools");
    match server {
        "everything" => {
            let r = tool(peer, &t("echo"), json!({"message": "hello from the test"})).await;
            assert!(said(&r).contains("hello from the test"), "{}", said(&r));
        }
        "memory" => {
            let r = tool(
                peer,
                &t("create_entities"),
                json!({"entities": [{"name": "alice", "entityType": "person", "observations": ["likes green tea"]}]}),
            )
            .await;
            assert_ne!(r.is_error, Some(true), "{}", said(&r));
            let r = tool(peer, &t("read_graph"), json!({})).await;
            assert!(said(&r).contains("likes green tea"), "{}", said(&r));
        }
        "filesystem" => {
            let write = if tools.contains(&t("write_file")) {
                t("write_file")
            } else {
                panic!("{tools:?}")
            };
            let r = tool(
                peer,
                &write,
                json!({"path": "/tmp/hosted.txt", "content": "written in a sandbox"}),
            )
            .await;
            assert_ne!(r.is_error, Some(true), "{}", said(&r));
            let read = if tools.contains(&t("read_text_file")) {
                t("read_text_file")
            } else {
                t("read_file")
            };
            let r = tool(peer, &read, json!({"path": "/tmp/hosted.txt"})).await;
            assert!(said(&r).contains("written in a sandbox"), "{}", said(&r));
        }
        "time" => {
            let r = tool(
                peer,
                &t("get_current_time"),
                json!({"timezone": "Asia/Tokyo"}),
            )
            .await;
            assert!(said(&r).contains("Asia/Tokyo"), "{}", said(&r));
        }
        "fetch" => {
            let r = tool(
                peer,
                &t("fetch"),
                json!({"url": "http://api.example.test/", "raw": true}),
            )
            .await;
            assert!(
                said(&r).contains("hello from api.example.test"),
                "{}",
                said(&r)
            );
            // Not on its allowlist: the sandbox's network refuses it.
            let r = tool(
                peer,
                &t("fetch"),
                json!({"url": "http://other.test/", "raw": true}),
            )
            .await;
            assert!(!said(&r).contains("hello from other.test"), "{}", said(&r));
            assert_eq!(r.is_error, Some(true), "{}", said(&r));
        }
        other => panic!("no exercise for {other}"),
    }
}
