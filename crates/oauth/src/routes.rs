//! The HTTP side: the resource metadata every OAuth mode publishes, and the built-in
//! authorization server's endpoints: the sign-in ([`authorize`]) and the token, registration
//! and revocation endpoints ([`token`]), with what they share here.
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

/// Largest form or registration body.
const MAX_BODY: usize = 16 * 1024;

/// The built-in authorization server.
pub struct BuiltIn {
    pub store: Store,
    accounts: Arc<dyn Accounts>,
    fetcher: crate::cimd::Fetcher,
    signer: Signer,
    access_ttl: Duration,
    pending: Mutex<HashMap<String, authorize::Pending>>,
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
            .route(
                "/oauth/authorize",
                get(authorize::authorize).post(authorize::consent),
            )
            .route("/oauth/token", post(token::token).options(preflight))
            .route("/oauth/register", post(token::register).options(preflight))
            .route("/oauth/revoke", post(token::revoke).options(preflight))
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

mod authorize;
mod token;

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

/// Whether two secrets are equal, in constant time.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}
