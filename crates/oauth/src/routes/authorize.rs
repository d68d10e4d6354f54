//! `GET /oauth/authorize` (checks, then the sign-in and consent page) and `POST /oauth/authorize`
//! (the page's form): see the parent module for the rules.

use super::*;

/// How long the consent page waits for an answer.
const PENDING_TTL: Duration = Duration::from_secs(600);
/// Pending sign-ins kept at most (the oldest goes first).
const MAX_PENDING: usize = 1000;
/// Wrong keys before a pending sign-in ends.
const MAX_ATTEMPTS: u32 = 5;

/// A sign-in the page waits on.
pub(super) struct Pending {
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

impl Pending {
    /// The sign-in and consent page of this request (`request`: its id), with `error` above the
    /// form when the last try failed.
    fn page(&self, request: &str, error: Option<&str>) -> String {
        page::consent(&page::Consent {
            client_id: &self.client.client_id,
            client_name: self.client.name.as_deref(),
            client_kind: self.client.kind,
            redirect_uri: &self.redirect_uri,
            scope: &self.scope,
            resource: &self.resource,
            request,
            csrf: &self.csrf,
            error,
        })
    }
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

pub(super) async fn authorize(
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
    let body = p.page(&request, None);
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

pub(super) async fn consent(
    State(o): State<Arc<OAuth>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
        let body = p.page(request, Some("That is not an active access key."));
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
