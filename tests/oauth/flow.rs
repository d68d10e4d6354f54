//! The built-in authorization server's whole flow, spoken by hand: discovery from a 401,
//! registration, the sign-in page, the code, tokens for the tools, refresh with rotation and
//! reuse detection, revocation, scopes, audiences, and tenants.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{
    OAuthServer, REDIRECT, call, client, code_for, exchange, http, open_page, probe, register,
    tokens_for,
};

#[tokio::test]
async fn discovery_registration_sign_in_tokens_and_tools() {
    let s = OAuthServer::start().await;
    let key = s.key("alpha");

    // 1. No header at all: 401, and where to start.
    let (status, challenge) = probe(&s.mcp(), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let prm_url = format!("{}/.well-known/oauth-protected-resource/mcp", s.base);
    assert!(
        challenge.starts_with("Bearer ")
            && challenge.contains(&format!("resource_metadata=\"{prm_url}\""))
            && challenge.contains("scope=\"sandboxes\""),
        "{challenge}"
    );
    // An access key still works beside OAuth.
    assert_eq!(probe(&s.mcp(), Some(&key)).await.0, StatusCode::OK);

    // 2. Protected resource metadata names this server as the authorization server.
    let prm: Value = super::get_json(&prm_url).await;
    assert_eq!(prm["resource"], s.mcp());
    assert_eq!(prm["authorization_servers"], json!([s.base]));
    assert_eq!(prm["scopes_supported"], json!(["sandboxes"]));
    let hosted: Value = http()
        .get(format!(
            "{}/.well-known/oauth-protected-resource/servers/time/mcp",
            s.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(hosted["resource"], format!("{}/servers/time/mcp", s.base));
    assert_eq!(hosted["scopes_supported"], json!(["servers"]));
    let nothing = http()
        .get(format!(
            "{}/.well-known/oauth-protected-resource/etc/passwd",
            s.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(nothing.status(), StatusCode::NOT_FOUND);

    // 3. Authorization server metadata, and OpenID discovery.
    for path in ["oauth-authorization-server", "openid-configuration"] {
        let meta: Value = super::get_json(format!("{}/.well-known/{path}", s.base)).await;
        assert_eq!(meta["issuer"], s.base);
        assert_eq!(meta["code_challenge_methods_supported"], json!(["S256"]));
        assert_eq!(meta["client_id_metadata_document_supported"], true);
        assert_eq!(meta["authorization_response_iss_parameter_supported"], true);
    }

    // 4. Registration, sign-in and consent.
    let client_id = register(&s.base, &[REDIRECT]).await;
    let (verifier, challenge) = super::pkce();
    let page = open_page(&super::authorize_url(
        &s.base,
        &client_id,
        &challenge,
        &[
            ("scope", Some("sandboxes openid")),
            ("nonce", Some("n0nce")),
        ],
    ))
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.html.contains("Test client") && page.html.contains("127.0.0.1"));
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    let cookie = page.headers["set-cookie"].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    // A wrong key: the page again, no code.
    let wrong = super::submit(&s.base, &page, "smcp_wrong", "allow").await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(
        wrong
            .text()
            .await
            .unwrap()
            .contains("not an active access key")
    );
    let r = super::submit(&s.base, &page, &key, "allow").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let q = super::query_of(r.headers()["location"].to_str().unwrap());
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with(REDIRECT)
    );
    assert_eq!(q["state"], "st4te");
    assert_eq!(q["iss"], s.base, "RFC 9207");

    // 5. Tokens, with an ID token carrying the nonce.
    let (status, tokens) = exchange(&s.base, &client_id, &q["code"], &verifier).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["scope"], "sandboxes openid");
    assert!(tokens["expires_in"].as_u64().unwrap() > 0);
    let id_token = tokens["id_token"].as_str().unwrap();
    let claims: Value = serde_json::from_slice(
        &sandbox_mcp_oauth::jwt::unb64(id_token.split('.').nth(1).unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(claims["nonce"], "n0nce");
    assert_eq!(claims["aud"], client_id);
    assert_eq!(claims["tenant"], "alpha");
    let jwks: Value = super::get_json(format!("{}/oauth/jwks", s.base)).await;
    let keys = sandbox_mcp_oauth::jwt::parse_jwks(&jwks);
    assert!(
        sandbox_mcp_oauth::jwt::split(id_token)
            .unwrap()
            .verified_by(&keys)
    );
    let access = tokens["access_token"].as_str().unwrap();
    let refresh = tokens["refresh_token"].as_str().unwrap();

    // 6. The tools, as tenant alpha.
    let mcp = client(&s.mcp(), access).await;
    let listed = call(&mcp, "sandbox_list", json!({})).await.unwrap();
    assert!(listed["sandboxes"].is_array(), "{listed}");

    // 7. Refresh rotates: the new pair works, the old refresh token is spent, and presenting it
    // again revokes the whole grant (the new tokens too).
    let (status, fresh) = super::refresh(&s.base, &client_id, refresh).await;
    assert_eq!(status, StatusCode::OK, "{fresh}");
    let access2 = fresh["access_token"].as_str().unwrap().to_string();
    assert_ne!(access2, access);
    assert_ne!(fresh["refresh_token"], tokens["refresh_token"]);
    assert_eq!(probe(&s.mcp(), Some(&access2)).await.0, StatusCode::OK);
    let (status, reused) = super::refresh(&s.base, &client_id, refresh).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reused["error"], "invalid_grant");
    let (status, challenge) = probe(&s.mcp(), Some(&access2)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the grant is revoked");
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    let (status, _) = super::refresh(
        &s.base,
        &client_id,
        fresh["refresh_token"].as_str().unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // 8. Revocation (RFC 7009): a refresh token takes its grant with it.
    let t = tokens_for(&s.base, &client_id, &key, &[]).await;
    let at = t["access_token"].as_str().unwrap();
    assert_eq!(probe(&s.mcp(), Some(at)).await.0, StatusCode::OK);
    let r = http()
        .post(format!("{}/oauth/revoke", s.base))
        .form(&[
            ("token", t["refresh_token"].as_str().unwrap()),
            ("client_id", &client_id),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(probe(&s.mcp(), Some(at)).await.0, StatusCode::UNAUTHORIZED);

    // 9. Revoking the access key that signed in ends its tokens.
    let t = tokens_for(&s.base, &client_id, &key, &[]).await;
    let at = t["access_token"].as_str().unwrap();
    let store = sandbox_mcp_server::keys::KeyStore::open(s.dir.path());
    let id = store
        .list()
        .unwrap()
        .into_iter()
        .find(|k| k.tenant == "alpha")
        .unwrap()
        .id;
    store.revoke(&id).unwrap();
    let (status, challenge) = probe(&s.mcp(), Some(at)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(challenge.contains("revoked"), "{challenge}");
    let (status, body) =
        super::refresh(&s.base, &client_id, t["refresh_token"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn scopes_and_audiences_are_checked_on_every_request() {
    let s = OAuthServer::start().await;
    let key = s.key("alpha");
    let client_id = register(&s.base, &[REDIRECT]).await;

    // A token for the whole server with only the hosted servers' scope: /mcp asks for more
    // (step-up), naming the scope.
    let base_only = tokens_for(
        &s.base,
        &client_id,
        &key,
        &[("scope", Some("servers")), ("resource", Some(&s.base))],
    )
    .await;
    let (status, challenge) = probe(&s.mcp(), base_only["access_token"].as_str()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{challenge}");
    assert!(
        challenge.contains("error=\"insufficient_scope\"")
            && challenge.contains("scope=\"sandboxes\""),
        "{challenge}"
    );
    // …and the hosted servers' endpoint lets it past authentication (there is no such server:
    // what answers is not a 401 or 403).
    let (status, _) = probe(
        &format!("{}/servers/nothing/mcp", s.base),
        base_only["access_token"].as_str(),
    )
    .await;
    assert!(
        status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
        "{status}"
    );

    // A token for /mcp is not one for a hosted server (RFC 8707 audience).
    let mcp_only = tokens_for(&s.base, &client_id, &key, &[]).await;
    let (status, challenge) = probe(
        &format!("{}/servers/time/mcp", s.base),
        mcp_only["access_token"].as_str(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        challenge.contains("error=\"invalid_token\"")
            && challenge.contains("/.well-known/oauth-protected-resource/servers/time/mcp"),
        "{challenge}"
    );
    // An unknown token, and a key-shaped one.
    for bad in ["smcp_at_nope", "smcp_nope", "x"] {
        let (status, challenge) = probe(&s.mcp(), Some(bad)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}");
        assert!(challenge.contains("resource_metadata="), "{challenge}");
    }
    // A resource that is not this server's is refused at authorization.
    let (_, challenge) = super::pkce();
    let page = open_page(&super::authorize_url(
        &s.base,
        &client_id,
        &challenge,
        &[("resource", Some("https://elsewhere.example/mcp"))],
    ))
    .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(
        super::query_of(page.location().unwrap())["error"],
        "invalid_target"
    );
}

#[tokio::test]
async fn a_tenant_signed_in_through_oauth_sees_only_its_own_sandboxes() {
    crate::require_sandboxes!();
    let s = OAuthServer::start().await;
    let client_id = register(&s.base, &[REDIRECT]).await;
    let alpha = tokens_for(&s.base, &client_id, &s.key("alpha"), &[]).await;
    let beta = tokens_for(&s.base, &client_id, &s.key("beta"), &[]).await;
    let a = client(&s.mcp(), alpha["access_token"].as_str().unwrap()).await;
    let b = client(&s.mcp(), beta["access_token"].as_str().unwrap()).await;
    let created = call(&a, "sandbox_create", json!({})).await.unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    let out = call(
        &a,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo from-alpha"}),
    )
    .await
    .unwrap();
    assert!(out["stdout"].as_str().unwrap().contains("from-alpha"));
    // Beta's token: the sandbox does not exist for it.
    let listed = call(&b, "sandbox_list", json!({})).await.unwrap();
    assert!(!listed.to_string().contains(&id), "{listed}");
    let e = call(
        &b,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "id"}),
    )
    .await
    .unwrap_err();
    assert!(e.contains("not found") || e.contains("No sandbox"), "{e}");
    let e = call(&b, "sandbox_kill", json!({"sandbox_id": id}))
        .await
        .unwrap_err();
    assert!(!e.is_empty());
    // The engine holds it as alpha's.
    let record = s
        .engine
        .manager
        .list(None, &[], None)
        .into_iter()
        .find(|r| r.id == id)
        .unwrap();
    assert_eq!(record.tenant.as_deref(), Some("alpha"));
    call(&a, "sandbox_kill", json!({"sandbox_id": id}))
        .await
        .unwrap();
    // A code made for alpha cannot be exchanged by another client.
    let other = register(&s.base, &[REDIRECT]).await;
    let (code, verifier) = code_for(&s.base, &client_id, &s.key("alpha"), &[]).await;
    let (status, body) = exchange(&s.base, &other, &code, &verifier).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");
}

/// `sandbox-mcp oauth …` on the data dir of a running server.
fn operator(s: &OAuthServer, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(crate::common::BIN)
        .arg("oauth")
        .args(args)
        .env("SANDBOX_MCP_DATA_DIR", s.dir.path())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn operators_add_clients_and_revoke_grants_and_clients() {
    let s = OAuthServer::start().await;
    let key = s.key("alpha");
    // A pre-registered confidential client.
    let (ok, out, err) = operator(
        &s,
        &[
            "clients",
            "add",
            "--name",
            "Team dashboard",
            "--redirect-uri",
            REDIRECT,
            "--confidential",
        ],
    );
    assert!(ok, "{err}");
    let value = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap()
            .to_string()
    };
    let (client_id, secret) = (value("client_id"), value("client_secret"));
    let (bad, _, err) = operator(
        &s,
        &[
            "clients",
            "add",
            "--name",
            "x",
            "--redirect-uri",
            "http://evil.example/cb",
        ],
    );
    assert!(!bad && err.contains("loopback"), "{err}");
    let (code, verifier) = code_for(&s.base, &client_id, &key, &[]).await;
    let r = super::exchange_basic(&s.base, &client_id, &secret, &code, &verifier).await;
    assert_eq!(r.status(), StatusCode::OK);
    let tokens: Value = r.json().await.unwrap();
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(probe(&s.mcp(), Some(access)).await.0, StatusCode::OK);

    let (ok, listed, _) = operator(&s, &["clients", "list"]);
    assert!(
        ok && listed.contains("Team dashboard") && listed.contains("registered"),
        "{listed}"
    );
    let (ok, grants, _) = operator(&s, &["grants", "list", "--json"]);
    assert!(ok);
    let grants: Value = serde_json::from_str(&grants).unwrap();
    let grant = grants
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["client_id"] == client_id.as_str())
        .unwrap();
    assert_eq!(grant["tenant"], "alpha");
    assert!(!grants.to_string().contains(access) && !grants.to_string().contains(&secret));

    // Revoking the grant ends its tokens at once.
    let (ok, _, err) = operator(&s, &["grants", "revoke", grant["id"].as_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(
        probe(&s.mcp(), Some(access)).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (ok, _, err) = operator(&s, &["grants", "revoke", "grant_nope"]);
    assert!(!ok && err.contains("no grant"), "{err}");

    // Revoking the client ends its sign-ins and grants.
    let t = {
        let (code, verifier) = code_for(&s.base, &client_id, &key, &[]).await;
        let r = super::exchange_basic(&s.base, &client_id, &secret, &code, &verifier).await;
        r.json::<Value>().await.unwrap()["access_token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (ok, _, err) = operator(&s, &["clients", "revoke", &client_id]);
    assert!(ok, "{err}");
    assert_eq!(probe(&s.mcp(), Some(&t)).await.0, StatusCode::UNAUTHORIZED);
    let (_, challenge) = super::pkce();
    let page = open_page(&super::authorize_url(&s.base, &client_id, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(page.html.contains("revoked"), "{}", page.html);
}

#[test]
fn oauth_flags_are_checked_at_start() {
    for (args, want) in [
        (vec!["serve", "--oauth"], "--http"),
        (
            vec!["serve", "--http", "127.0.0.1:0", "--oauth", "--dev"],
            "cannot be used with",
        ),
        (
            vec![
                "serve",
                "--http",
                "127.0.0.1:0",
                "--oauth",
                "--oauth-issuer",
                "https://idp.example",
            ],
            "cannot be used with",
        ),
        (
            vec![
                "serve",
                "--http",
                "127.0.0.1:0",
                "--oauth",
                "--public-url",
                "https://mcp.example.com/mcp",
            ],
            "no path",
        ),
        // Checked without OAuth too: the server accepts its host either way.
        (
            vec![
                "serve",
                "--http",
                "127.0.0.1:0",
                "--public-url",
                "https://mcp.example.com/mcp",
            ],
            "no path",
        ),
        (
            vec![
                "serve",
                "--http",
                "127.0.0.1:0",
                "--oauth-issuer",
                "http://idp.example",
            ],
            "https",
        ),
        (
            vec![
                "serve",
                "--http",
                "127.0.0.1:0",
                "--oauth",
                "--oauth-allow-net",
                "10.0.0.0/99",
            ],
            "not a CIDR",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(crate::common::BIN)
            .args(&args)
            .env("SANDBOX_MCP_DATA_DIR", dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
        // Refused, it leaves nothing running or mounted: the engine the server had begun to
        // start in the background is stopped, or never started.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(dir.path().to_str().unwrap()),
            "{args:?} left its store mounted"
        );
    }
}
