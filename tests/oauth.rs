//! OAuth 2.1 on the Streamable HTTP transport, over real TCP in front of a real engine.
//!
//! This file holds the fixture (an engine, a key store and `serve --http --oauth` in front of
//! them) and a client that speaks the protocol by hand, the way a hostile one would. The tests
//! are by theme: [`flow`] (discovery, registration, sign-in, tokens, refresh, revocation,
//! tenants), [`attacks`] (redirects, codes, PKCE, CSRF, metadata documents, registration),
//! [`external`] (an identity provider the test starts, its JWTs and keys) and [`sdks`] (the
//! official TypeScript and Python SDKs' OAuth clients, and a real browser on the sign-in page).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqwest::StatusCode;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use sha2::Digest as _;

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_oauth::{Kind, OAuth, Settings};
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::http::{HttpOptions, HttpServer};
use sandbox_mcp_server::keys::KeyStore;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_server::tooldefs::registry;

use crate::common::{KEY, TestEngine};

mod attacks;
mod external;
mod flow;
mod sdks;

/// Where an authorization server sends the browser back to (nothing listens: the tests read the
/// `Location` header instead).
const REDIRECT: &str = "http://127.0.0.1:9/callback";

/// An engine, a key store and an MCP HTTP server with OAuth in front of them.
pub struct OAuthServer {
    pub engine: TestEngine,
    pub dir: tempfile::TempDir,
    /// Keeps serving until dropped.
    _server: HttpServer,
    /// `http://127.0.0.1:PORT`: the issuer, and the base of every URL.
    pub base: String,
}

/// How a fixture's OAuth is set up.
pub struct Setup {
    pub ttl: Duration,
    pub allow_nets: Vec<String>,
    pub ca_file: Option<std::path::PathBuf>,
    /// An external issuer instead of the built-in server: (issuer, tenant claim).
    pub external: Option<(String, String)>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            ttl: Duration::from_secs(3600),
            allow_nets: vec![],
            ca_file: None,
            external: None,
        }
    }
}

impl OAuthServer {
    pub async fn start() -> Self {
        Self::start_with(Setup::default()).await
    }

    pub async fn start_with(setup: Setup) -> Self {
        let engine = TestEngine::start().await;
        let backend = Backend::remote(&engine.url, Some(ApiKey::new(KEY))).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let keys = Arc::new(KeyStore::open(dir.path()));
        let kind = match setup.external {
            Some((issuer, claim)) => Kind::External {
                issuer,
                audiences: vec![],
                tenant_claim: claim,
            },
            None => Kind::BuiltIn {
                data_dir: dir.path().to_path_buf(),
                accounts: keys.clone(),
            },
        };
        let oauth = OAuth::new(Settings {
            kind,
            public_url: None,
            ca_file: setup.ca_file,
            allow_nets: setup.allow_nets,
            access_ttl: setup.ttl,
        })
        .unwrap();
        let opts = HttpOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            dev: false,
            allowed_hosts: vec![],
            allowed_origins: vec![],
            rate_limit: 0.0,
            session_idle: Duration::from_secs(1800),
            session_sandbox: false,
            mount_servers: vec![],
            oauth: Some(oauth),
        };
        let tools = registry().select_in(None, "all").unwrap();
        let server = HttpServer::start(
            opts,
            backend,
            Some(keys.clone()),
            tools,
            ServerSettings::default(),
        )
        .await
        .unwrap();
        let base = format!("http://{}", server.addr);
        Self {
            engine,
            dir,
            _server: server,
            base,
        }
    }

    /// A new access key for `tenant` (as `sandbox-mcp keys create` makes one).
    pub fn key(&self, tenant: &str) -> String {
        KeyStore::open(self.dir.path()).create(tenant).unwrap().1
    }

    pub fn mcp(&self) -> String {
        format!("{}/mcp", self.base)
    }
}

/// A client that follows no redirects and keeps no cookies: every step is the test's.
pub fn http() -> reqwest::Client {
    sandbox_mcp_api::http_builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A PKCE verifier and its S256 challenge.
pub fn pkce() -> (String, String) {
    let verifier = format!("v{}", sandbox_mcp_model::ids::nonce()).repeat(2);
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// Registers a public client (RFC 7591) with `redirect_uris`; its client_id.
pub async fn register(base: &str, redirect_uris: &[&str]) -> String {
    let r = http()
        .post(format!("{base}/oauth/register"))
        .json(
            &json!({"redirect_uris": redirect_uris, "client_name": "Test client",
            "token_endpoint_auth_method": "none"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v: Value = r.json().await.unwrap();
    v["client_id"].as_str().unwrap().to_string()
}

/// The sign-in page of an authorization request: its status, HTML, and the CSRF cookie.
pub struct Page {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub html: String,
    pub cookie: Option<String>,
}

impl Page {
    /// The value of the hidden form field `name`.
    pub fn field(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let at = self
            .html
            .find(&marker)
            .unwrap_or_else(|| panic!("no {name} in {}", self.html))
            + marker.len();
        self.html[at..].split('"').next().unwrap().to_string()
    }

    pub fn location(&self) -> Option<&str> {
        self.headers.get("location").and_then(|v| v.to_str().ok())
    }
}

pub async fn open_page(url: &str) -> Page {
    let r = http().get(url).send().await.unwrap();
    let headers = r.headers().clone();
    let cookie = headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(|c| c.split(';').next().unwrap().to_string());
    Page {
        status: r.status(),
        headers,
        html: r.text().await.unwrap(),
        cookie,
    }
}

/// An authorization request's URL with the usual parameters, any of them replaced or removed
/// (`None`) by `over`.
pub fn authorize_url(
    base: &str,
    client_id: &str,
    challenge: &str,
    over: &[(&str, Option<&str>)],
) -> String {
    let resource = format!("{base}/mcp");
    let mut params: Vec<(&str, Option<&str>)> = vec![
        ("response_type", Some("code")),
        ("client_id", Some(client_id)),
        ("redirect_uri", Some(REDIRECT)),
        ("state", Some("st4te")),
        ("code_challenge", Some(challenge)),
        ("code_challenge_method", Some("S256")),
        ("scope", Some("sandboxes")),
        ("resource", Some(&resource)),
    ];
    for (k, v) in over {
        match params.iter_mut().find(|(p, _)| p == k) {
            Some(p) => p.1 = *v,
            None => params.push((k, *v)),
        }
    }
    let query = serde_urlencoded_pairs(&params);
    format!("{base}/oauth/authorize?{query}")
}

fn serde_urlencoded_pairs(params: &[(&str, Option<&str>)]) -> String {
    let mut url = reqwest::Url::parse("http://x/").unwrap();
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in params {
            if let Some(v) = v {
                q.append_pair(k, v);
            }
        }
    }
    url.query().unwrap_or("").to_string()
}

/// Posts the sign-in form of `page` (as a browser on this origin would) with `key` and
/// `decision`; the answer, unfollowed.
pub async fn submit(base: &str, page: &Page, key: &str, decision: &str) -> reqwest::Response {
    http()
        .post(format!("{base}/oauth/authorize"))
        .header("origin", base)
        .header("cookie", page.cookie.clone().unwrap_or_default())
        .form(&[
            ("request", page.field("request")),
            ("csrf", page.field("csrf")),
            ("key", key.to_string()),
            ("decision", decision.to_string()),
        ])
        .send()
        .await
        .unwrap()
}

/// The query parameters of a redirect's `Location`.
pub fn query_of(location: &str) -> std::collections::HashMap<String, String> {
    reqwest::Url::parse(location)
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Signs in as `key` for a registered client and returns the code and its verifier.
pub async fn code_for(
    base: &str,
    client_id: &str,
    key: &str,
    over: &[(&str, Option<&str>)],
) -> (String, String) {
    let (verifier, challenge) = pkce();
    let page = open_page(&authorize_url(base, client_id, &challenge, over)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    let r = submit(base, &page, key, "allow").await;
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "{}",
        r.text().await.unwrap()
    );
    let q = query_of(r.headers()["location"].to_str().unwrap());
    (q["code"].clone(), verifier)
}

/// A token request; its status and JSON.
pub async fn token(base: &str, form: &[(&str, &str)]) -> (StatusCode, Value) {
    let r = http()
        .post(format!("{base}/oauth/token"))
        .form(form)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Presents a refresh token as `client_id`: the status and JSON.
pub async fn refresh(base: &str, client_id: &str, refresh_token: &str) -> (StatusCode, Value) {
    token(
        base,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("client_id", client_id),
        ],
    )
    .await
}

/// A GET's JSON body.
pub async fn get_json(url: impl AsRef<str>) -> Value {
    http()
        .get(url.as_ref())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Exchanges a code for tokens.
pub async fn exchange(
    base: &str,
    client_id: &str,
    code: &str,
    verifier: &str,
) -> (StatusCode, Value) {
    token(
        base,
        &[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("client_id", client_id),
            ("code_verifier", verifier),
        ],
    )
    .await
}

/// Exchanges a code as a confidential client (HTTP Basic): the answer, unread.
pub async fn exchange_basic(
    base: &str,
    id: &str,
    secret: &str,
    code: &str,
    verifier: &str,
) -> reqwest::Response {
    http()
        .post(format!("{base}/oauth/token"))
        .basic_auth(id, Some(secret))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", verifier),
        ])
        .send()
        .await
        .unwrap()
}

/// Signs in and exchanges the code: the token response.
pub async fn tokens_for(
    base: &str,
    client_id: &str,
    key: &str,
    over: &[(&str, Option<&str>)],
) -> Value {
    let (code, verifier) = code_for(base, client_id, key, over).await;
    let (status, body) = exchange(base, client_id, &code, &verifier).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// An MCP `initialize` POSTed to `url` with `token`: the status and `WWW-Authenticate`.
pub async fn probe(url: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut r = http()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (r.status(), challenge)
}

/// A real MCP client over Streamable HTTP with `token`.
pub async fn client(url: &str, token: &str) -> RunningService<RoleClient, ClientConfig> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token),
    );
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("oauth-test", "0"),
    )
    .with_protocol_version(ProtocolVersion::V_2025_06_18)
    .serve(transport)
    .await
    .unwrap_or_else(|e| panic!("MCP client could not connect: {e}"))
}

/// Calls a tool and returns its structured result, or the error text.
pub async fn call(
    c: &RunningService<RoleClient, ClientConfig>,
    name: &str,
    args: Value,
) -> Result<Value, String> {
    let r = c
        .call_tool(
            CallToolRequestParams::new(name.to_string())
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .map_err(|e| e.to_string())?;
    if r.is_error == Some(true) {
        return Err(crate::common::text(&r));
    }
    Ok(r.structured_content.unwrap_or(Value::Null))
}
