//! The Streamable HTTP transport (`sandbox-mcp serve --http ADDR`): rmcp's service at `/mcp`
//! behind one guard that, in order,
//!
//! 1. rejects a `Host` or `Origin` that is not allowed (403): DNS rebinding cannot turn a browser
//!    into a client of a server on loopback;
//! 2. refuses new requests while draining for shutdown (503);
//! 3. authenticates the bearer token against the key store (401 with `WWW-Authenticate: Bearer`),
//!    and keeps the token to itself: the engine only ever sees the server's own key plus the tenant;
//! 4. holds a session to the tenant that opened it: another tenant's session id is unknown (404);
//! 5. rate-limits per tenant (429 with `Retry-After`);
//! 6. answers a POST body that is not a valid JSON-RPC message with a JSON-RPC error (400, with
//!    `-32700` or `-32600` and `"id": null`), where rmcp would answer 415 in plain text.
//!
//! Sessions (`Mcp-Session-Id`) serve 2025 clients; 2026-07-28 requests are stateless. A tenant's
//! sandboxes are invisible to every other tenant: each call reaches the engine as that tenant.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use sandbox_mcp_oauth::{Denied, OAuth};

use crate::backend::Backend;
use crate::keys::KeyStore;
use crate::server::{RequestTenant, SandboxMcp, Selection, ServerSettings};
use crate::session::SessionSandboxes;

pub(crate) use crate::jsonrpc::BODY_LIMIT;
/// Hosts always allowed in `Host` and `Origin`.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub listen: SocketAddr,
    /// Serve without authentication (loopback only).
    pub dev: bool,
    /// Extra host names accepted in `Host` (and as the host of `Origin`).
    pub allowed_hosts: Vec<String>,
    /// Extra origins (`scheme://host[:port]`) accepted in `Origin`.
    pub allowed_origins: Vec<String>,
    /// Requests per second per tenant (0: unlimited); bursts of twice that are allowed.
    pub rate_limit: f64,
    /// A session idle this long is closed (and its session sandbox killed).
    pub session_idle: Duration,
    /// Give each session its own sandbox (the `session` profile).
    pub session_sandbox: bool,
    /// Hosted servers to mount into `/mcp` (`all`, or names).
    pub mount_servers: Vec<String>,
    /// OAuth beside the access keys: the resource server's checks and metadata, and the built-in
    /// authorization server's routes when it is built in.
    pub oauth: Option<Arc<OAuth>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

struct Guard {
    keys: Option<Arc<KeyStore>>,
    oauth: Option<Arc<OAuth>>,
    hosts: Vec<String>,
    origins: Vec<String>,
    /// Session id → the tenant that opened it, and when it was last used.
    sessions: Mutex<HashMap<String, (Option<String>, Instant)>>,
    /// Sessions idle this long are gone from the transport too; forget them.
    session_idle: Duration,
    buckets: Mutex<HashMap<Option<String>, Bucket>>,
    rate: f64,
    draining: AtomicBool,
    inflight: AtomicUsize,
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32001, "message": message},
    });
    let mut response = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// The host of a `Host` header value (`name`, `name:port`, `[v6]:port`), lowercased.
fn host_of(authority: &str) -> String {
    let a = authority.trim().to_ascii_lowercase();
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_string();
    }
    match a.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.contains(':') => {
            h.to_string()
        }
        _ => a,
    }
}

impl Guard {
    fn host_allowed(&self, host: &str) -> bool {
        let h = host_of(host);
        self.hosts
            .iter()
            .any(|a| a == &h || a.eq_ignore_ascii_case(host.trim()))
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let o = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        if self.origins.iter().any(|a| a == &o) {
            return true;
        }
        // Any port of an allowed host, over http or https.
        let Some((scheme, rest)) = o.split_once("://") else {
            return false;
        };
        (scheme == "http" || scheme == "https") && self.hosts.contains(&host_of(rest))
    }

    /// Takes a token from the tenant's bucket; the wait until the next one when it is empty.
    fn rate_limited(&self, tenant: &Option<String>) -> Option<Duration> {
        if self.rate <= 0.0 {
            return None;
        }
        let burst = self.rate * 2.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(tenant.clone()).or_insert(Bucket {
            tokens: burst,
            at: Instant::now(),
        });
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * self.rate).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }
}

/// Counts a request as in flight until dropped.
struct InFlight(Arc<Guard>);

impl InFlight {
    fn new(g: &Arc<Guard>) -> Self {
        g.inflight.fetch_add(1, Ordering::AcqRel);
        Self(g.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A refusal by OAuth: the JSON-RPC error, with the challenge that tells a client where to sign in.
fn denied(oauth: &OAuth, req: &Request, d: &Denied) -> Response {
    let mut r = error(d.status, &d.description);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        oauth.challenge(req.headers(), req.uri().path(), req.uri().query(), d),
    );
    r
}

async fn guard(State(g): State<Arc<Guard>>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !g.host_allowed(host) {
        return error(
            StatusCode::FORBIDDEN,
            "Host not allowed; start the server with --allow-host for this name",
        );
    }
    // OAuth's own endpoints are for clients that hold no token yet, and for browsers (the
    // sign-in page checks its own origin; the rest is CORS-open and cookie-free).
    let path = req.uri().path();
    if g.oauth.is_some() && (path.starts_with("/.well-known/") || path.starts_with("/oauth/")) {
        if g.draining.load(Ordering::Acquire) {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down; retry elsewhere",
            );
        }
        return next.run(req).await;
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && !origin.to_str().is_ok_and(|o| g.origin_allowed(o))
    {
        return error(
            StatusCode::FORBIDDEN,
            "Origin not allowed; start the server with --allow-origin for this origin",
        );
    }
    if g.draining.load(Ordering::Acquire) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down; retry elsewhere",
        );
    }
    let token = sandbox_mcp_api::auth::bearer(headers);
    let tenant: Option<String> = match &g.keys {
        None => None, // --dev
        Some(keys) => match (token.and_then(|t| keys.tenant_of(t)), &g.oauth, token) {
            (Some(t), _, _) => Some(t),
            (None, Some(oauth), Some(t)) => {
                let (path, query) = (req.uri().path(), req.uri().query());
                match oauth.authenticate(headers, t, path, query).await {
                    Ok(p) => Some(p.tenant),
                    Err(d) => return denied(oauth, &req, &d),
                }
            }
            (None, Some(oauth), None) => return denied(oauth, &req, &Denied::missing()),
            (None, None, _) => {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "missing or invalid token; send `Authorization: Bearer <token>` (create one with `sandbox-mcp keys create --tenant NAME`)",
                );
            }
        },
    };
    let headers = req.headers();
    let session = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    if let Some(sid) = &session {
        let owner = g
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(sid)
            .map(|(owner, seen)| {
                *seen = Instant::now();
                owner.clone()
            });
        if matches!(&owner, Some(o) if o != &tenant) {
            // Another tenant's session answers exactly like an unknown one.
            return error(StatusCode::NOT_FOUND, "Session not found");
        }
    }
    if let Some(wait) = g.rate_limited(&tenant) {
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "rate limit exceeded: at most {} requests per second for this tenant; retry in {} ms",
                g.rate,
                wait.as_millis().max(1)
            ),
        );
        if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let deleting = req.method() == axum::http::Method::DELETE;
    let posting = req.method() == axum::http::Method::POST;
    if posting {
        req = match checked_body(req).await {
            Ok(req) => req,
            Err(answer) => return answer,
        };
    }
    req.extensions_mut().insert(RequestTenant(tenant.clone()));
    let inflight = InFlight::new(&g);
    let mut response = next.run(req).await;
    if posting {
        // A POST's answer streams (SSE) after the headers: it is in flight until its body ends.
        // GET streams (server notifications) may stay open for ever and do not count.
        response = response.map(|body| {
            use futures::StreamExt;
            axum::body::Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _ = &inflight;
                chunk
            }))
        });
    } else {
        drop(inflight);
    }
    let mut sessions = g.sessions.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(new) = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        && !sessions.contains_key(new)
    {
        let horizon = g.session_idle + Duration::from_secs(60);
        sessions.retain(|_, (_, seen)| seen.elapsed() < horizon);
        sessions.insert(new.to_string(), (tenant, Instant::now()));
    }
    if let Some(sid) = &session
        && (deleting || response.status() == StatusCode::NOT_FOUND)
    {
        sessions.remove(sid);
    }
    response
}

/// Reads a POST's JSON body and checks it is a valid JSON-RPC message; rebuilds the request for
/// rmcp when it is, answers with the JSON-RPC error when it is not. Other media types go on
/// untouched (rmcp refuses them with 415).
async fn checked_body(req: Request) -> Result<Request, Response> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("application/json"));
    if !json {
        return Ok(req);
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "request too large: the limit is {} MiB; send large files in parts or create them inside the sandbox",
                    BODY_LIMIT / (1024 * 1024)
                ),
            ));
        }
    };
    match crate::jsonrpc::check(&bytes) {
        crate::jsonrpc::Check::Forward => {
            Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
        }
        crate::jsonrpc::Check::Answer(answer) => {
            Err((StatusCode::BAD_REQUEST, axum::Json(answer)).into_response())
        }
    }
}

/// A running HTTP server.
pub struct HttpServer {
    pub addr: SocketAddr,
    guard: Arc<Guard>,
    cancel: CancellationToken,
    sandboxes: SessionSandboxes,
    /// Sessions of hosted servers (`/servers/NAME/mcp`).
    pub hosted: crate::hosted::sessions::Sessions,
    backend: Backend,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Binds and starts serving.
    pub async fn start(
        opts: HttpOptions,
        backend: Backend,
        keys: Option<Arc<KeyStore>>,
        tools: impl Into<Selection>,
        settings: ServerSettings,
    ) -> anyhow::Result<Self> {
        if opts.dev && !opts.listen.ip().is_loopback() {
            anyhow::bail!(
                "--dev serves without authentication and is only allowed on a loopback address, not {}",
                opts.listen
            );
        }
        let mut hosts: Vec<String> = LOOPBACK.iter().map(|h| h.to_string()).collect();
        hosts.extend(
            opts.allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase()),
        );
        let oauth = if opts.dev { None } else { opts.oauth.clone() };
        if let Some(public) = oauth.as_ref().and_then(|o| o.public_host()) {
            hosts.push(public);
        }
        let guard = Arc::new(Guard {
            keys: if opts.dev { None } else { keys },
            oauth: oauth.clone(),
            origins: opts
                .allowed_origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            hosts: hosts.clone(),
            sessions: Mutex::new(HashMap::new()),
            session_idle: opts.session_idle,
            buckets: Mutex::new(HashMap::new()),
            rate: opts.rate_limit,
            draining: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
        });
        let cancel = CancellationToken::new();
        let sandboxes = SessionSandboxes::default();
        let hosted = crate::hosted::sessions::Sessions::new(backend.clone());
        let factory = {
            // One server, cloned per session: its tools (schemas and all) are shared, not built
            // again for each session.
            let proto = SandboxMcp::with_selection(backend.clone(), tools.into(), settings);
            let sandboxes = sandboxes.clone();
            let session = opts.session_sandbox;
            let mounts = crate::hosted::mount::MountSet::parse(&opts.mount_servers);
            let hosted = hosted.clone();
            move || {
                let mut server = proto.clone();
                if session {
                    server = server.with_session(sandboxes.clone());
                }
                if let Some(set) = &mounts {
                    server = server.with_mounts(crate::hosted::mount::Mounted::new(
                        hosted.clone(),
                        set.clone(),
                    ));
                }
                Ok(server)
            }
        };
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(opts.session_idle);
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_cancellation_token(cancel.child_token())
            .with_max_request_body_bytes(BODY_LIMIT);
        let service = StreamableHttpService::new(factory, Arc::new(sessions), config);
        warm_hosted(&hosted);
        let mut app = Router::new();
        if let Some(oauth) = &oauth {
            app = app.merge(sandbox_mcp_oauth::routes::router(oauth.clone()));
        }
        let app = app
            .nest_service("/mcp", service)
            .route(
                "/servers/{name}/mcp",
                axum::routing::any(hosted_server).with_state(hosted.clone()),
            )
            .layer(middleware::from_fn_with_state(
                hosted.clone(),
                superbox_alias,
            ))
            .layer(middleware::from_fn_with_state(guard.clone(), guard_fn))
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .layer(middleware::from_fn(
                sandbox_mcp_api::unread::close_if_unread,
            ));
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.listen))?;
        let addr = listener.local_addr()?;
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            // Without TCP_NODELAY, a streamed (SSE) answer's second write waits for the
            // client's delayed ACK of the first: 40 ms a call (measured: 44 ms per call at any
            // concurrency before 2026-11-27).
            use axum::serve::ListenerExt as _;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!("HTTP server stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            guard,
            cancel,
            sandboxes,
            hosted,
            backend,
            task,
        })
    }

    /// Graceful shutdown: refuse new requests, let in-flight ones finish (up to `grace`), end
    /// every session (killing session sandboxes), stop.
    pub async fn shutdown(self, grace: Duration) {
        self.guard.draining.store(true, Ordering::Release);
        let deadline = Instant::now() + grace;
        while self.guard.inflight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        self.sandboxes.kill_all(&self.backend).await;
        self.hosted.close_all().await;
    }
}

/// `/servers/NAME/mcp`: hosted server NAME.
async fn hosted_server(
    State(hosted): State<crate::hosted::sessions::Sessions>,
    axum::extract::Path(name): axum::extract::Path<String>,
    req: Request,
) -> Response {
    crate::hosted::http::handle(hosted, name, req).await
}

/// `/mcp?name=NAME`: hosted server NAME, as SuperBox's clients ask for it.
async fn superbox_alias(
    State(hosted): State<crate::hosted::sessions::Sessions>,
    req: Request,
    next: Next,
) -> Response {
    let name = (req.uri().path() == "/mcp")
        .then(|| req.uri().query())
        .flatten()
        .and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("name="))
                .map(String::from)
        });
    match name {
        Some(name) => crate::hosted::http::handle(hosted, name, req).await,
        None => next.run(req).await,
    }
}

/// Fills the warm pools of the operator's hosted servers that ask for some.
fn warm_hosted(hosted: &crate::hosted::sessions::Sessions) {
    let hosted = hosted.clone();
    tokio::spawn(async move {
        let Ok(handle) = hosted.backend().client(None).await else {
            return;
        };
        let Ok(list) = handle.client.list_servers().send().await else {
            return;
        };
        for server in list.into_inner().servers {
            if server.shared && server.warm > 0 {
                hosted.refill(&crate::hosted::http::hosted_server(server, None));
            }
        }
    });
}

async fn guard_fn(state: State<Arc<Guard>>, req: Request, next: Next) -> Response {
    guard(state, req, next).await
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts_are_parsed_from_authorities() {
        assert_eq!(host_of("localhost:8080"), "localhost");
        assert_eq!(host_of("LOCALHOST"), "localhost");
        assert_eq!(host_of("[::1]:99"), "::1");
        assert_eq!(host_of("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_of("evil.example.com:80"), "evil.example.com");
    }
}
