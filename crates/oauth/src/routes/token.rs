//! `POST /oauth/token`, `/oauth/register` and `/oauth/revoke`: clients authenticated, codes and
//! refresh tokens exchanged, clients registered, tokens revoked.

use super::*;

/// How long a refresh token lives.
const REFRESH_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

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

pub(super) async fn token(
    State(o): State<Arc<OAuth>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
    // Looked at first, spent only once its client is known to be the right one: another client
    // presenting it gets nothing and takes nothing from the one it was issued to.
    let unknown = || bad("invalid_grant", "unknown or revoked refresh token");
    let failed = |e: String| oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", &e);
    match b.store.token(rt, "refresh", false) {
        Ok(Some(t)) if t.grant.client_id != client.client_id => {
            return bad(
                "invalid_grant",
                "the refresh token was issued to another client",
            );
        }
        Ok(Some(_)) => {}
        Ok(None) => return unknown(),
        Err(e) => return failed(e),
    }
    let t = match b.store.token(rt, "refresh", true) {
        Ok(Some(t)) => t,
        Ok(None) => return unknown(),
        Err(e) => return failed(e),
    };
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

pub(super) async fn register(State(o): State<Arc<OAuth>>, body: Bytes) -> Response {
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

pub(super) async fn revoke(
    State(o): State<Arc<OAuth>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
