//! The HTTP side: the resource metadata every OAuth mode publishes, and the built-in
//! authorization server's endpoints.
//!
//! - `GET /.well-known/oauth-authorization-server` and `/.well-known/openid-configuration`:
//!   metadata (RFC 8414, OpenID discovery);
//! - `GET /oauth/authorize`: checks the client and its redirect URI *before* anything can be sent
//!   back to it (an unknown client or an unregistered redirect URI gets an error page, never a
//!   redirect: no open redirector), then the rest (`response_type=code`, PKCE with `S256` only,
//!   known scopes, a resource of this server), then shows the sign-in and consent page;
//! - `POST /oauth/authorize`: the page's form. It must carry the pending request's CSRF token
//!   both in the form and in the cookie set with the page, come from this origin (`Origin`,
//!   `Sec-Fetch-Site`), and within ten minutes; five wrong keys end the request. Allowing
//!   redirects with `code`, `state` and `iss` (RFC 9207);
//! - `POST /oauth/token`: `authorization_code` (the code once, within a minute, with the same
//!   client and redirect URI and the PKCE verifier; a code used twice revokes its grant) and
//!   `refresh_token` (rotated at every use; a used one presented again revokes the whole grant);
//! - `POST /oauth/register` (RFC 7591), `POST /oauth/revoke` (RFC 7009), `GET /oauth/jwks`.
//!
//! The page is framed by nobody (`frame-ancestors 'none'`), cached by nobody, and sends no
//! referrer. Secrets (keys, codes, tokens) never reach a log.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::clients::{self, ClientInfo};
use crate::jwt::{Signer, b64, sha2_256};
use crate::page;
use crate::store::{Store, digest};
use crate::{Accounts, Denied, Mode, OAuth, Principal, SCOPES};

/// How long a refresh token lives.
const REFRESH_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the consent page waits for an answer.
const PENDING_TTL: Duration = Duration::from_secs(600);
/// Pending sign-ins kept at most (the oldest goes first).
const MAX_PENDING: usize = 1000;
/// Wrong keys before a pending sign-in ends.
const MAX_ATTEMPTS: u32 = 5;
/// Largest form or registration body.
const MAX_BODY: usize = 16 * 1024;

struct Pending {
    client: ClientInfo,
    redirect_uri: String,
    state: Option<String>,
    challenge: String,
    scope: String,
    resource: String,
    nonce: Option<String>,
    csrf: String,
    created: Instant,
    attempts: u32,
}

/// The built-in authorization server.
pub struct BuiltIn {
    pub store: Store,
    accounts: Arc<dyn Accounts>,
    fetcher: crate::cimd::Fetcher,
    signer: Signer,
    access_ttl: Duration,
    pending: Mutex<HashMap<String, Pending>>,
}

impl BuiltIn {
    pub(crate) fn open(
        data_dir: &Path,
        accounts: Arc<dyn Accounts>,
        fetcher: crate::cimd::Fetcher,
        access_ttl: Duration,
    ) -> Result<BuiltIn, String> {
        let store = Store::open(data_dir)?;
        let key_path = data_dir.join("oauth-signing-key.p8");
        let existing = std::fs::read(&key_path).ok();
        let (signer, der) = Signer::load_or_generate(existing.as_deref())?;
        if existing.is_none() {
            sandbox_mcp_sys::durable::write_atomically(&key_path, &der, 0o600)
                .map_err(|e| format!("cannot write {}: {e}", key_path.display()))?;
        }
        Ok(BuiltIn {
            store,
            accounts,
            fetcher,
            signer,
            access_ttl,
            pending: Mutex::new(HashMap::new()),
        })
    }

    /// Checks one of this server's access tokens for `resource` and `scope`.
    pub(crate) fn check(
        &self,
        token: &str,
        base: &str,
        resource: &str,
        scope: &str,
    ) -> Result<Principal, Denied> {
        let t = self
            .store
            .token(token, "access", false)
            .map_err(Denied::invalid)?
            .ok_or_else(|| Denied::invalid("unknown or revoked token"))?;
        if t.expired {
            return Err(Denied::invalid("the token has expired; refresh it"));
        }
        if t.grant.revoked_at.is_some() {
            return Err(Denied::invalid("the grant was revoked"));
        }
        if !self.accounts.active(&t.grant.key_id) {
            return Err(Denied::invalid(
                "the access key that signed in was revoked; sign in again",
            ));
        }
        if !audience_fits(&t.grant.resource, base, resource) {
            return Err(Denied::invalid(format!(
                "the token is for {}, not for {resource}",
                t.grant.resource
            )));
        }
        if !t.scope.split_whitespace().any(|s| s == scope) {
            return Err(Denied::scope(scope));
        }
        Ok(Principal {
            tenant: t.grant.tenant,
        })
    }
}

/// A token for the whole server (its base URL) fits every endpoint; otherwise the resource must be
/// the endpoint's own.
fn audience_fits(granted: &str, base: &str, resource: &str) -> bool {
    granted == resource || granted.trim_end_matches('/') == base
}

/// The routes of OAuth: resource metadata always; the authorization server's when built in.
pub fn router(oauth: Arc<OAuth>) -> Router {
    let mut r = Router::new()
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata).options(preflight),
        )
        .route(
            "/.well-known/oauth-protected-resource/{*path}",
            get(resource_metadata).options(preflight),
        );
    if matches!(oauth.mode, Mode::BuiltIn(_)) {
        r = r
            .route(
                "/.well-known/oauth-authorization-server",
                get(server_metadata).options(preflight),
            )
            .route(
                "/.well-known/openid-configuration",
                get(server_metadata).options(preflight),
            )
            .route("/oauth/authorize", get(authorize).post(consent))
            .route("/oauth/token", post(token).options(preflight))
            .route("/oauth/register", post(register).options(preflight))
            .route("/oauth/revoke", post(revoke).options(preflight))
            .route("/oauth/jwks", get(jwks).options(preflight));
    }
    r.with_state(oauth)
}

fn built_in(o: &OAuth) -> &BuiltIn {
    match &o.mode {
        Mode::BuiltIn(b) => b,
        // The routes that call this exist only in built-in mode.
        Mode::External(_) => unreachable!("built-in routes are not mounted for an external issuer"),
    }
}

/// JSON for anyone (CORS: these endpoints carry no cookies and are meant for browser clients).
fn public_json(status: StatusCode, body: Value) -> Response {
    let mut r = (status, axum::Json(body)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn preflight() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, mcp-protocol-version"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    r
}

async fn resource_metadata(
    State(o): State<Arc<OAuth>>,
    headers: HeaderMap,
    uri: http::Uri,
) -> Response {
    let base = o.base(&headers);
    let path = uri
        .path()
        .strip_prefix("/.well-known/oauth-protected-resource")
        .unwrap_or("");
    match o.resource_metadata(&base, path) {
        Some(doc) => public_json(StatusCode::OK, doc),
        None => public_json(
            StatusCode::NOT_FOUND,
            json!({"error": "not_found", "error_description": "no protected resource at that path: /mcp and /servers/NAME/mcp are"}),
        ),
    }
}

async fn server_metadata(State(o): State<Arc<OAuth>>, headers: HeaderMap) -> Response {
    let base = o.base(&headers);
    public_json(
        StatusCode::OK,
        json!({
            "issuer": base,
            "authorization_endpoint": format!("{base}/oauth/authorize"),
            "token_endpoint": format!("{base}/oauth/token"),
            "registration_endpoint": format!("{base}/oauth/register"),
            "revocation_endpoint": format!("{base}/oauth/revoke"),
            "jwks_uri": format!("{base}/oauth/jwks"),
            "scopes_supported": SCOPES,
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "revocation_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "client_id_metadata_document_supported": true,
            "authorization_response_iss_parameter_supported": true,
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "nonce", "tenant"],
            "service_documentation": "https://github.com/sandbox-mcp/sandbox-mcp#use-it-from-claudeai-claude-desktop-or-chatgpt-oauth",
        }),
    )
}

async fn jwks(State(o): State<Arc<OAuth>>) -> Response {
    public_json(StatusCode::OK, built_in(&o).signer.jwks())
}

/// Form or query parameters; a parameter given twice is an error (RFC 6749 §3.1).
fn params(text: &str) -> Result<HashMap<String, String>, String> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(text).map_err(|e| format!("malformed parameters: {e}"))?;
    let mut out = HashMap::new();
    for (k, v) in pairs {
        if out.insert(k.clone(), v).is_some() {
            return Err(format!("the parameter {k} is given more than once"));
        }
    }
    Ok(out)
}

fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, axum::response::Html(body)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: browsers then send `Origin: null` with the form, and its origin check
    // could not tell this page from any other. Nothing goes to another origin either way.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn error_page(status: StatusCode, message: &str) -> Response {
    html(status, page::error(message))
}

/// A redirect to the client's redirect URI with `params` added to its query.
fn redirect_to(uri: &str, params: &[(&str, Option<&str>)]) -> Response {
    let Ok(mut url) = reqwest::Url::parse(uri) else {
        return error_page(StatusCode::BAD_REQUEST, "the redirect URI is malformed");
    };
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in params {
            if let Some(v) = v {
                q.append_pair(k, v);
            }
        }
    }
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(url.as_str()) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.headers_mut().insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// An error sent back to a client whose redirect URI was checked.
fn redirect_error(p: &Pending, issuer: &str, error: &str, description: &str) -> Response {
    redirect_to(
        &p.redirect_uri,
        &[
            ("error", Some(error)),
            ("error_description", Some(description)),
            ("state", p.state.as_deref()),
            ("iss", Some(issuer)),
        ],
    )
}

/// Whether `resource` names this server or one of its endpoints; returns it normalised.
fn our_resource(base: &str, resource: &str) -> Option<String> {
    let r = resource.trim_end_matches('/');
    if r == base {
        return Some(base.to_string());
    }
    let path = r.strip_prefix(base)?;
    if path.contains(['?', '#']) {
        return None;
    }
    crate::resource_path(path).then(|| r.to_string())
}

/// Finds the client: a registered one, or the metadata document at its URL.
async fn find_client(b: &BuiltIn, client_id: &str) -> Result<ClientInfo, String> {
    if client_id.is_empty() || client_id.len() > 2000 {
        return Err("the request has no valid client_id".into());
    }
    if b.store.client_revoked(client_id)? {
        return Err("this client was revoked by the operator".into());
    }
    if crate::cimd::is_document_url(client_id) {
        return b.fetcher.client(client_id).await;
    }
    clients::stored(&b.store, client_id)?
        .ok_or_else(|| "unknown client_id: register the client first (or use a client metadata document URL as client_id)".into())
}

fn pkce_ok(s: &str) -> bool {
    (43..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

async fn authorize(
    State(o): State<Arc<OAuth>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let b = built_in(&o);
    let base = o.base(&headers);
    let q = match params(query.as_deref().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e),
    };
    let get = |k: &str| q.get(k).map(String::as_str);
    // 1. The client and its redirect URI, before anything is sent to that URI.
    let client = match find_client(b, get("client_id").unwrap_or("")).await {
        Ok(c) => c,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e),
    };
    let redirect_uri = match get("redirect_uri") {
        Some(u) if client.redirect_uris.iter().any(|r| r == u) => u.to_string(),
        Some(_) => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "the redirect_uri is not one the client registered (it must match exactly)",
            );
        }
        None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
        None => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "the request has no redirect_uri and the client registered several",
            );
        }
    };
    let mut p = Pending {
        client,
        redirect_uri,
        state: get("state").map(String::from),
        challenge: String::new(),
        scope: String::new(),
        resource: String::new(),
        nonce: get("nonce").map(String::from),
        csrf: crate::store::secret(""),
        created: Instant::now(),
        attempts: 0,
    };
    // 2. The rest goes back to the client as an error.
    if get("response_type") != Some("code") {
        return redirect_error(
            &p,
            &base,
            "unsupported_response_type",
            "only response_type=code is supported",
        );
    }
    match (get("code_challenge"), get("code_challenge_method")) {
        (Some(c), Some("S256")) if pkce_ok(c) => p.challenge = c.to_string(),
        (None, _) => {
            return redirect_error(
                &p,
                &base,
                "invalid_request",
                "PKCE is required: send code_challenge with code_challenge_method=S256",
            );
        }
        (Some(_), Some("S256")) => {
            return redirect_error(
                &p,
                &base,
                "invalid_request",
                "code_challenge must be 43-128 characters of A-Z a-z 0-9 - . _ ~",
            );
        }
        _ => {
            return redirect_error(
                &p,
                &base,
                "invalid_request",
                "only code_challenge_method=S256 is supported (plain is not)",
            );
        }
    }
    let resource = match get("resource") {
        None => format!("{base}/mcp"),
        Some(r) => match our_resource(&base, r) {
            Some(r) => r,
            None => {
                return redirect_error(
                    &p,
                    &base,
                    "invalid_target",
                    "resource must be this server's /mcp or /servers/NAME/mcp URL",
                );
            }
        },
    };
    let default_scope = if resource.contains("/servers/") {
        crate::SERVERS
    } else {
        crate::SANDBOXES
    };
    let mut scopes: Vec<&str> = get("scope").unwrap_or("").split_whitespace().collect();
    if let Some(bad) = scopes.iter().find(|s| !SCOPES.contains(s)) {
        return redirect_error(
            &p,
            &base,
            "invalid_scope",
            &format!("unknown scope {bad:?}; known: {}", SCOPES.join(" ")),
        );
    }
    if !scopes
        .iter()
        .any(|s| *s == crate::SANDBOXES || *s == crate::SERVERS)
    {
        scopes.push(default_scope);
    }
    scopes.dedup();
    p.scope = scopes.join(" ");
    p.resource = resource;
    let request = crate::store::secret("");
    let body = page::consent(&page::Consent {
        client_id: &p.client.client_id,
        client_name: p.client.name.as_deref(),
        client_kind: p.client.kind,
        redirect_uri: &p.redirect_uri,
        scope: &p.scope,
        resource: &p.resource,
        request: &request,
        csrf: &p.csrf,
        error: None,
    });
    let cookie = csrf_cookie(&base, &request, &p.csrf, 600);
    {
        let mut pending = b.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|_, p| p.created.elapsed() < PENDING_TTL);
        if pending.len() >= MAX_PENDING
            && let Some(oldest) = pending
                .iter()
                .min_by_key(|(_, p)| p.created)
                .map(|(k, _)| k.clone())
        {
            pending.remove(&oldest);
        }
        pending.insert(request, p);
    }
    let mut r = html(StatusCode::OK, body);
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn cookie_name(request: &str) -> String {
    format!("smcp_csrf_{}", &request[..request.len().min(16)])
}

fn csrf_cookie(base: &str, request: &str, value: &str, max_age: u32) -> String {
    let secure = if base.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    format!(
        "{}={value}; Max-Age={max_age}; Path=/oauth/authorize; HttpOnly; SameSite=Strict{secure}",
        cookie_name(request)
    )
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

async fn consent(State(o): State<Arc<OAuth>>, headers: HeaderMap, body: Bytes) -> Response {
    let b = built_in(&o);
    let base = o.base(&headers);
    // A form posted from another site is refused before its fields are read.
    if let Some(origin) = headers.get(header::ORIGIN)
        && origin.to_str().ok().map(|s| s.trim_end_matches('/')) != Some(base.as_str())
    {
        return error_page(StatusCode::FORBIDDEN, "the form was sent from another site");
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return error_page(StatusCode::FORBIDDEN, "the form was sent from another site");
    }
    if body.len() > MAX_BODY {
        return error_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large");
    }
    let form = match params(&String::from_utf8_lossy(&body)) {
        Ok(f) => f,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e),
    };
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    let request = field("request");
    let mut pending = b.pending.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = pending.get_mut(request) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "this sign-in request is unknown or has expired",
        );
    };
    let from_cookie = cookie(&headers, &cookie_name(request)).unwrap_or_default();
    if !same(field("csrf"), &p.csrf) || !same(&from_cookie, &p.csrf) {
        return error_page(
            StatusCode::FORBIDDEN,
            "the form's anti-forgery token does not match this browser's: start again from the client",
        );
    }
    if p.created.elapsed() >= PENDING_TTL {
        pending.remove(request);
        return error_page(
            StatusCode::BAD_REQUEST,
            "this sign-in request has expired; start again from the client",
        );
    }
    let clear = csrf_cookie(&base, request, "", 0);
    let with_clear = |mut r: Response| {
        if let Ok(v) = HeaderValue::from_str(&clear) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        r
    };
    if field("decision") != "allow" {
        let Some(p) = pending.remove(request) else {
            return error_page(StatusCode::BAD_REQUEST, "this sign-in request is unknown");
        };
        return with_clear(redirect_error(
            &p,
            &base,
            "access_denied",
            "the user denied the request",
        ));
    }
    let Some(account) = b.accounts.sign_in(field("key").trim()) else {
        p.attempts += 1;
        if p.attempts >= MAX_ATTEMPTS {
            pending.remove(request);
            return error_page(
                StatusCode::FORBIDDEN,
                "too many wrong keys; start again from the client",
            );
        }
        let body = page::consent(&page::Consent {
            client_id: &p.client.client_id,
            client_name: p.client.name.as_deref(),
            client_kind: p.client.kind,
            redirect_uri: &p.redirect_uri,
            scope: &p.scope,
            resource: &p.resource,
            request,
            csrf: &p.csrf,
            error: Some("That is not an active access key."),
        });
        return html(StatusCode::UNAUTHORIZED, body);
    };
    let Some(p) = pending.remove(request) else {
        return error_page(StatusCode::BAD_REQUEST, "this sign-in request is unknown");
    };
    drop(pending);
    let name = p
        .client
        .name
        .clone()
        .unwrap_or_else(|| p.client.client_id.clone());
    let code = match b.store.grant_code(
        &p.client.client_id,
        &name,
        &account.tenant,
        &account.key_id,
        &p.scope,
        &p.resource,
        &p.redirect_uri,
        &p.challenge,
        p.nonce.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => return redirect_error(&p, &base, "server_error", &e),
    };
    tracing::info!(client = %p.client.client_id, tenant = %account.tenant, key = %account.key_id, "OAuth grant made");
    with_clear(redirect_to(
        &p.redirect_uri,
        &[
            ("code", Some(&code)),
            ("state", p.state.as_deref()),
            ("iss", Some(&base)),
        ],
    ))
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    let mut r = public_json(
        status,
        json!({"error": error, "error_description": description}),
    );
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"sandbox-mcp\""),
        );
    }
    r
}

fn bad(error: &str, description: &str) -> Response {
    oauth_error(StatusCode::BAD_REQUEST, error, description)
}

/// One half of HTTP Basic client credentials, form-decoded (RFC 6749 §2.3.1). A half holding a
/// raw `&` or `=` is refused: decoding it as a form would read another field.
fn basic_part(s: &str) -> Option<String> {
    if s.contains(['&', '=']) {
        return None;
    }
    let mut pairs = serde_urlencoded::from_str::<Vec<(String, String)>>(&format!("x={s}")).ok()?;
    (pairs.len() == 1).then(|| pairs.remove(0).1)
}

/// The client a token request authenticates as (RFC 6749 §2.3): a secret in Basic or the form,
/// or a public client's bare `client_id`.
async fn token_client(
    b: &BuiltIn,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
) -> Result<ClientInfo, Response> {
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Basic ")
                .or_else(|| v.strip_prefix("basic "))
        })
        .and_then(|v| {
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, v.trim()).ok()
        })
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| {
            let (id, secret) = v.split_once(':')?;
            let dec = basic_part;
            Some((dec(id)?, dec(secret)?))
        });
    let (id, secret) = match (&basic, form.get("client_id")) {
        (Some((id, s)), form_id) => {
            if form_id.is_some_and(|f| f != id) {
                return Err(oauth_error(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "client_id differs from the authenticated client",
                ));
            }
            (id.clone(), Some(s.clone()))
        }
        (None, Some(id)) => (id.clone(), form.get("client_secret").cloned()),
        (None, None) => {
            return Err(oauth_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "no client_id",
            ));
        }
    };
    let client = if crate::cimd::is_document_url(&id) {
        // Codes and grants are bound to the URL; the document was checked when the user consented.
        if b.store.client_revoked(&id).unwrap_or(true) {
            return Err(oauth_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "this client was revoked",
            ));
        }
        ClientInfo {
            client_id: id,
            name: None,
            redirect_uris: vec![],
            secret_sha256: None,
            kind: "metadata document",
        }
    } else {
        match clients::stored(&b.store, &id) {
            Ok(Some(c)) => c,
            _ => {
                return Err(oauth_error(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "unknown or revoked client",
                ));
            }
        }
    };
    if let Some(expected) = &client.secret_sha256 {
        let given = secret.as_deref().map(digest).unwrap_or_default();
        if !same(&given, expected) {
            return Err(oauth_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "the client secret is wrong or missing",
            ));
        }
    }
    Ok(client)
}

/// A token or revocation request's form, and the client it authenticates as.
async fn client_form(
    b: &BuiltIn,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(HashMap<String, String>, ClientInfo), Response> {
    if body.len() > MAX_BODY {
        return Err(bad("invalid_request", "the request is too large"));
    }
    let form = params(&String::from_utf8_lossy(body)).map_err(|e| bad("invalid_request", &e))?;
    let client = token_client(b, headers, &form).await?;
    Ok((form, client))
}

async fn token(State(o): State<Arc<OAuth>>, headers: HeaderMap, body: Bytes) -> Response {
    let b = built_in(&o);
    let base = o.base(&headers);
    let (form, client) = match client_form(b, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let field = |k: &str| form.get(k).map(String::as_str);
    match field("grant_type") {
        Some("authorization_code") => code_grant(b, &base, &client, &form),
        Some("refresh_token") => refresh_grant(b, &base, &client, &form),
        Some(other) => bad(
            "unsupported_grant_type",
            &format!(
                "grant_type {other:?} is not supported: authorization_code and refresh_token are"
            ),
        ),
        None => bad("invalid_request", "grant_type is missing"),
    }
}

fn code_grant(
    b: &BuiltIn,
    base: &str,
    client: &ClientInfo,
    form: &HashMap<String, String>,
) -> Response {
    let field = |k: &str| form.get(k).map(String::as_str);
    let Some(code) = field("code") else {
        return bad("invalid_request", "code is missing");
    };
    let c = match b.store.take_code(code) {
        Ok(Some(c)) => c,
        Ok(None) => return bad("invalid_grant", "unknown code"),
        Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
    };
    if c.used {
        let _ = b.store.revoke_grant(&c.grant.id, "its code was used twice");
        tracing::warn!(grant = %c.grant.id, "an authorization code was used twice: its grant is revoked");
        return bad(
            "invalid_grant",
            "the code was already used; every token it gave is revoked",
        );
    }
    if c.expired {
        return bad(
            "invalid_grant",
            "the code has expired (codes last a minute)",
        );
    }
    if c.grant.client_id != client.client_id {
        return bad("invalid_grant", "the code was issued to another client");
    }
    if field("redirect_uri") != Some(c.redirect_uri.as_str()) {
        return bad(
            "invalid_grant",
            "redirect_uri differs from the authorization request's",
        );
    }
    let Some(verifier) = field("code_verifier") else {
        return bad(
            "invalid_grant",
            "code_verifier is missing (PKCE is required)",
        );
    };
    if !pkce_ok(verifier) || !same(&b64(&sha2_256(verifier.as_bytes())), &c.challenge) {
        return bad(
            "invalid_grant",
            "code_verifier does not match the code_challenge",
        );
    }
    if let Some(r) = field("resource")
        && our_resource(base, r).as_deref() != Some(c.grant.resource.as_str())
    {
        return bad(
            "invalid_target",
            "resource differs from the authorization request's",
        );
    }
    if c.grant.revoked_at.is_some() || !b.accounts.active(&c.grant.key_id) {
        return bad(
            "invalid_grant",
            "the grant or the key that made it was revoked",
        );
    }
    issue(b, base, &c.grant, &c.grant.scope, c.nonce.as_deref(), true)
}

fn refresh_grant(
    b: &BuiltIn,
    base: &str,
    client: &ClientInfo,
    form: &HashMap<String, String>,
) -> Response {
    let field = |k: &str| form.get(k).map(String::as_str);
    let Some(rt) = field("refresh_token") else {
        return bad("invalid_request", "refresh_token is missing");
    };
    let t = match b.store.token(rt, "refresh", true) {
        Ok(Some(t)) => t,
        Ok(None) => return bad("invalid_grant", "unknown or revoked refresh token"),
        Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
    };
    if t.grant.client_id != client.client_id {
        return bad(
            "invalid_grant",
            "the refresh token was issued to another client",
        );
    }
    if t.used {
        let _ = b
            .store
            .revoke_grant(&t.grant.id, "a rotated refresh token was used again");
        tracing::warn!(grant = %t.grant.id, "a refresh token was reused: its grant is revoked");
        return bad(
            "invalid_grant",
            "the refresh token was already used; the whole grant is revoked, sign in again",
        );
    }
    if t.expired || t.grant.revoked_at.is_some() {
        return bad(
            "invalid_grant",
            "the refresh token has expired or its grant was revoked",
        );
    }
    if !b.accounts.active(&t.grant.key_id) {
        return bad(
            "invalid_grant",
            "the access key that signed in was revoked; sign in again",
        );
    }
    if let Some(r) = field("resource")
        && !our_resource(base, r)
            .is_some_and(|r| audience_fits(&t.grant.resource, base, &r) || r == t.grant.resource)
    {
        return bad("invalid_target", "resource differs from the grant's");
    }
    let scope = match field("scope") {
        None => t.scope.clone(),
        Some(s) => {
            if let Some(extra) = s
                .split_whitespace()
                .find(|x| !t.grant.scope.split_whitespace().any(|g| g == *x))
            {
                return bad(
                    "invalid_scope",
                    &format!("scope {extra:?} was not granted; sign in again to ask for it"),
                );
            }
            s.split_whitespace().collect::<Vec<_>>().join(" ")
        }
    };
    issue(b, base, &t.grant, &scope, None, false)
}

fn issue(
    b: &BuiltIn,
    base: &str,
    grant: &crate::store::Grant,
    scope: &str,
    nonce: Option<&str>,
    first: bool,
) -> Response {
    let ttl = b.access_ttl.as_millis() as i64;
    let (access, refresh) =
        match b
            .store
            .issue(&grant.id, scope, ttl, REFRESH_TTL.as_millis() as i64)
        {
            Ok(t) => t,
            Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e),
        };
    let mut body = json!({
        "access_token": access,
        "token_type": "Bearer",
        "expires_in": b.access_ttl.as_secs(),
        "refresh_token": refresh,
        "scope": scope,
    });
    if first && scope.split_whitespace().any(|s| s == "openid") {
        let now = sandbox_mcp_model::ids::now_ms() / 1000;
        let mut claims = json!({
            "iss": base, "sub": grant.key_id, "aud": grant.client_id,
            "iat": now, "exp": now + 3600, "auth_time": now, "tenant": grant.tenant,
        });
        if let Some(n) = nonce {
            claims["nonce"] = json!(n);
        }
        if let Ok(id_token) = b.signer.sign(&claims) {
            body["id_token"] = json!(id_token);
        }
    }
    public_json(StatusCode::OK, body)
}

async fn register(State(o): State<Arc<OAuth>>, body: Bytes) -> Response {
    let b = built_in(&o);
    if body.len() > MAX_BODY {
        return bad(
            "invalid_client_metadata",
            "the registration is larger than 16 KiB",
        );
    }
    let doc: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return bad("invalid_client_metadata", "the body must be a JSON object"),
    };
    let (name, uris, method) = match clients::check_registration(&doc) {
        Ok(x) => x,
        Err((error, description)) => return bad(&error, &description),
    };
    match b.store.add_client("dynamic", &name, &uris, &method) {
        Ok((client, secret)) => public_json(
            StatusCode::CREATED,
            clients::registration_response(
                &client,
                secret.as_deref(),
                sandbox_mcp_model::ids::now_ms(),
            ),
        ),
        Err(e) => oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            &e,
        ),
    }
}

async fn revoke(State(o): State<Arc<OAuth>>, headers: HeaderMap, body: Bytes) -> Response {
    let b = built_in(&o);
    let (form, client) = match client_form(b, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(t) = form.get("token") else {
        return bad("invalid_request", "token is missing");
    };
    // A refresh token takes its whole grant; an access token only itself. Another client's token
    // is left alone (and the answer is the same: RFC 7009 §2.2).
    if let Ok(Some(rt)) = b.store.token(t, "refresh", false) {
        if rt.grant.client_id == client.client_id {
            let _ = b.store.revoke_grant(&rt.grant.id, "revoked by the client");
        }
    } else if let Ok(Some(at)) = b.store.token(t, "access", false)
        && at.grant.client_id == client.client_id
    {
        let _ = b.store.delete_token(t);
    }
    public_json(StatusCode::OK, json!({}))
}

#[cfg(test)]
mod tests {
    #[test]
    fn basic_credentials_decode_one_field_each() {
        assert_eq!(super::basic_part("a%2Bb").as_deref(), Some("a+b"));
        assert_eq!(
            super::basic_part("smcp_client_x").as_deref(),
            Some("smcp_client_x")
        );
        assert_eq!(super::basic_part("a&x=other"), None);
        assert_eq!(super::basic_part("a=b"), None);
    }
}
