//! Attacks on the built-in authorization server: redirects to where the client did not register,
//! codes used twice, PKCE downgraded or left out, forged consent (CSRF), client metadata
//! documents that point inside the network or never end, and registrations of dangerous
//! redirect URIs.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{
    OAuthServer, REDIRECT, Setup, authorize_url, code_for, exchange, http, open_page, pkce, probe,
    query_of, register,
};

#[tokio::test]
async fn redirects_go_only_to_registered_uris_and_never_for_unknown_clients() {
    let s = OAuthServer::start().await;
    let client_id = register(&s.base, &[REDIRECT]).await;
    let (_, challenge) = pkce();
    let evil = "https://evil.example/steal";
    for over in [
        vec![("redirect_uri", Some(evil))],
        vec![("redirect_uri", Some("http://127.0.0.1:9/callback/../steal"))],
        vec![("redirect_uri", Some("http://127.0.0.1:9/callback?x=1"))],
        vec![("redirect_uri", Some("http://127.0.0.1:9/Callback"))],
        vec![("redirect_uri", Some("http://127.0.0.1:9/callback#frag"))],
        // An unknown client, however plausible its redirect.
        vec![
            ("client_id", Some("smcp_client_unknown")),
            ("redirect_uri", Some(evil)),
        ],
        vec![("client_id", None)],
    ] {
        let page = open_page(&authorize_url(&s.base, &client_id, &challenge, &over)).await;
        assert_eq!(
            page.status,
            StatusCode::BAD_REQUEST,
            "{over:?}: {}",
            page.html
        );
        assert!(page.location().is_none(), "{over:?} redirected");
        assert!(page.html.contains("Nothing was sent back"), "{}", page.html);
    }
    // A parameter given twice is refused too (which one would count?).
    let url = authorize_url(&s.base, &client_id, &challenge, &[])
        + "&redirect_uri=https%3A%2F%2Fevil.example%2F";
    let page = open_page(&url).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(page.location().is_none());
}

#[tokio::test]
async fn pkce_is_required_s256_only_and_checked() {
    let s = OAuthServer::start().await;
    let key = s.key("alpha");
    let client_id = register(&s.base, &[REDIRECT]).await;
    let (verifier, challenge) = pkce();
    // Downgrades and omissions go back to the client as errors, with state and iss.
    for over in [
        vec![("code_challenge_method", Some("plain"))],
        vec![("code_challenge_method", None)],
        vec![("code_challenge", None), ("code_challenge_method", None)],
        vec![("code_challenge", Some("short"))],
        vec![("response_type", Some("token"))],
        vec![("scope", Some("sandboxes admin"))],
    ] {
        let page = open_page(&authorize_url(&s.base, &client_id, &challenge, &over)).await;
        assert_eq!(
            page.status,
            StatusCode::SEE_OTHER,
            "{over:?}: {}",
            page.html
        );
        let q = query_of(page.location().unwrap());
        assert!(page.location().unwrap().starts_with(REDIRECT));
        assert!(
            q.contains_key("error") && !q.contains_key("code"),
            "{over:?}: {q:?}"
        );
        assert_eq!(q["state"], "st4te");
        assert_eq!(q["iss"], s.base);
    }
    // The exchange needs the verifier, the right one.
    let (code, _) = code_for(&s.base, &client_id, &key, &[]).await;
    let (status, body) = super::token(
        &s.base,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", REDIRECT),
            ("client_id", &client_id),
        ],
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_grant")),
        "{body}"
    );
    let (code, _) = code_for(&s.base, &client_id, &key, &[]).await;
    let (status, body) = exchange(&s.base, &client_id, &code, &verifier).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_grant")),
        "another request's verifier: {body}"
    );
    // The redirect URI of the exchange must be the request's.
    let (code, verifier) = code_for(&s.base, &client_id, &key, &[]).await;
    let (status, body) = super::token(
        &s.base,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", "http://127.0.0.1:9/other"),
            ("client_id", &client_id),
            ("code_verifier", &verifier),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_code_works_once_and_its_reuse_revokes_what_it_gave() {
    let s = OAuthServer::start().await;
    let client_id = register(&s.base, &[REDIRECT]).await;
    let (code, verifier) = code_for(&s.base, &client_id, &s.key("alpha"), &[]).await;
    let (status, tokens) = exchange(&s.base, &client_id, &code, &verifier).await;
    assert_eq!(status, StatusCode::OK);
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(probe(&s.mcp(), Some(access)).await.0, StatusCode::OK);
    let (status, body) = exchange(&s.base, &client_id, &code, &verifier).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");
    assert_eq!(
        probe(&s.mcp(), Some(access)).await.0,
        StatusCode::UNAUTHORIZED
    );
    // Codes and tokens are kept as digests only.
    let db = std::fs::read(s.dir.path().join("oauth.db")).unwrap();
    let wal = std::fs::read(s.dir.path().join("oauth.db-wal")).unwrap_or_default();
    for secret in [
        &code,
        &access.to_string(),
        &tokens["refresh_token"].as_str().unwrap().to_string(),
    ] {
        for bytes in [&db, &wal] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} stored in the clear"
            );
        }
    }
}

/// A refresh token works for the client it was issued to only: another client presenting it
/// gets nothing.
#[tokio::test]
async fn a_refresh_token_refreshes_for_its_own_client_only() {
    let s = OAuthServer::start().await;
    let mine = register(&s.base, &[REDIRECT]).await;
    let theirs = register(&s.base, &[REDIRECT]).await;
    let (code, verifier) = code_for(&s.base, &mine, &s.key("alpha"), &[]).await;
    let (status, tokens) = exchange(&s.base, &mine, &code, &verifier).await;
    assert_eq!(status, StatusCode::OK);
    let refresh_token = tokens["refresh_token"].as_str().unwrap().to_string();
    let (status, body) = crate::oauth::refresh(&s.base, &theirs, &refresh_token).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"], "invalid_grant");
    assert!(body["access_token"].is_null(), "{body}");
    let (status, body) = crate::oauth::refresh(&s.base, &mine, &refresh_token).await;
    assert_eq!(status, StatusCode::OK, "its own client: {body}");
    let access = body["access_token"].as_str().unwrap();
    assert_eq!(probe(&s.mcp(), Some(access)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn forged_consent_is_refused() {
    let s = OAuthServer::start().await;
    let key = s.key("alpha");
    let client_id = register(&s.base, &[REDIRECT]).await;
    let (_, challenge) = pkce();
    let page = open_page(&authorize_url(&s.base, &client_id, &challenge, &[])).await;
    let form = |csrf: String| {
        vec![
            ("request", page.field("request")),
            ("csrf", csrf),
            ("key", key.clone()),
            ("decision", "allow".to_string()),
        ]
    };
    let cookie = page.cookie.clone().unwrap();
    let post = |headers: Vec<(&'static str, String)>, form: Vec<(&'static str, String)>| {
        let mut r = http()
            .post(format!("{}/oauth/authorize", s.base))
            .form(&form);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    // Another site's page posting the form (it cannot read the cookie or the token).
    let cross = post(
        vec![
            ("origin", "https://evil.example".into()),
            ("cookie", cookie.clone()),
        ],
        form(page.field("csrf")),
    )
    .await
    .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    let cross = post(
        vec![
            ("sec-fetch-site", "cross-site".into()),
            ("cookie", cookie.clone()),
        ],
        form(page.field("csrf")),
    )
    .await
    .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    // Without the cookie, or with a token that is not this request's.
    let no_cookie = post(vec![("origin", s.base.clone())], form(page.field("csrf")))
        .await
        .unwrap();
    assert_eq!(no_cookie.status(), StatusCode::FORBIDDEN);
    let wrong = post(
        vec![("origin", s.base.clone()), ("cookie", cookie.clone())],
        form("x".repeat(52)),
    )
    .await
    .unwrap();
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
    let other_page = open_page(&authorize_url(&s.base, &client_id, &challenge, &[])).await;
    let swapped = post(
        vec![
            ("origin", s.base.clone()),
            ("cookie", other_page.cookie.clone().unwrap()),
        ],
        form(page.field("csrf")),
    )
    .await
    .unwrap();
    assert_eq!(swapped.status(), StatusCode::FORBIDDEN);
    for r in [cross, no_cookie, wrong, swapped] {
        assert!(r.headers().get("location").is_none());
    }
    // The real page still works after all that, once.
    let ok = super::submit(&s.base, &page, &key, "allow").await;
    assert_eq!(ok.status(), StatusCode::SEE_OTHER);
    let again = super::submit(&s.base, &page, &key, "allow").await;
    assert_eq!(
        again.status(),
        StatusCode::BAD_REQUEST,
        "a consent is used once"
    );
    // Deny sends access_denied back.
    let page = open_page(&authorize_url(&s.base, &client_id, &challenge, &[])).await;
    let denied = super::submit(&s.base, &page, "", "deny").await;
    assert_eq!(
        query_of(denied.headers()["location"].to_str().unwrap())["error"],
        "access_denied"
    );
    // Five wrong keys end the request.
    let page = open_page(&authorize_url(&s.base, &client_id, &challenge, &[])).await;
    for _ in 0..5 {
        super::submit(&s.base, &page, "smcp_guess", "allow").await;
    }
    assert_eq!(
        super::submit(&s.base, &page, &key, "allow").await.status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn registration_refuses_dangerous_redirect_uris() {
    let s = OAuthServer::start().await;
    for (uris, error) in [
        (json!(["http://evil.example/cb"]), "invalid_redirect_uri"),
        (json!(["javascript:alert(1)"]), "invalid_redirect_uri"),
        (json!(["data:text/html,x"]), "invalid_redirect_uri"),
        (json!(["https://app.example/cb#x"]), "invalid_redirect_uri"),
        (json!([]), "invalid_redirect_uri"),
        (json!("https://app.example/cb"), "invalid_redirect_uri"),
    ] {
        let r = http()
            .post(format!("{}/oauth/register", s.base))
            .json(&json!({"redirect_uris": uris}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{uris}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], error, "{uris}: {body}");
    }
    let big = http()
        .post(format!("{}/oauth/register", s.base))
        .json(&json!({"redirect_uris": [REDIRECT], "client_name": "x".repeat(100_000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::BAD_REQUEST);
    // A confidential client gets a secret, and the token endpoint wants it.
    let r: Value = http()
        .post(format!("{}/oauth/register", s.base))
        .json(&json!({"redirect_uris": [REDIRECT], "client_name": "<b>Conf</b>"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (id, secret) = (
        r["client_id"].as_str().unwrap(),
        r["client_secret"].as_str().unwrap(),
    );
    let (code, verifier) = code_for(&s.base, id, &s.key("alpha"), &[]).await;
    let (status, body) = exchange(&s.base, id, &code, &verifier).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no secret: {body}");
    assert_eq!(body["error"], "invalid_client");
    let (code, verifier) = code_for(&s.base, id, &s.key("alpha"), &[]).await;
    let r = super::exchange_basic(&s.base, id, secret, &code, &verifier).await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn client_metadata_documents_are_fetched_only_from_the_public_internet_and_small() {
    let net = crate::require_testnet!();
    // The test internet is documentation space: forbidden unless the operator opens it, as an
    // internal network would be.
    let closed = OAuthServer::start_with(Setup {
        ca_file: Some(net.ca_pem()),
        ..Setup::default()
    })
    .await;
    let s = OAuthServer::start_with(Setup {
        ca_file: Some(net.ca_pem()),
        allow_nets: vec![net.subnet.clone()],
        ..Setup::default()
    })
    .await;
    let ip = net.net_ip;
    let doc = |id: &str, redirect: &str| json!({"client_id": id, "client_name": "Doc client", "redirect_uris": [redirect], "token_endpoint_auth_method": "none"});
    let write = |name: &str, v: &Value| {
        std::fs::write(net.dir.path().join("static").join(name), v.to_string()).unwrap()
    };
    let good = format!("https://{ip}/static/client.json");
    write("client.json", &doc(&good, REDIRECT));
    let (_, challenge) = pkce();

    let page = open_page(&authorize_url(&closed.base, &good, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(page.html.contains("documentation"), "{}", page.html);

    // This host's own address on that network stays closed unless opened, like any other.
    let own = format!("https://{}/client.json", net.host_ip);
    let page = open_page(&authorize_url(&closed.base, &own, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(page.html.contains("own address"), "{}", page.html);

    let page = open_page(&authorize_url(&s.base, &good, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.html);
    assert!(page.html.contains("Doc client") && page.html.contains("metadata document"));

    let lying = format!("https://{ip}/static/lying.json");
    write(
        "lying.json",
        &doc("https://claude.ai/oauth/client", REDIRECT),
    );
    let elsewhere = format!("https://{ip}/static/elsewhere.json");
    write(
        "elsewhere.json",
        &doc(&elsewhere, "https://evil.example/cb"),
    );
    let secret = format!("https://{ip}/static/secret.json");
    write(
        "secret.json",
        &json!({"client_id": secret, "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_basic"}),
    );
    for (client_id, want) in [
        (format!("https://{ip}/bytes/10000000"), "larger than"),
        (lying, "not the URL"),
        (secret, "not supported"),
        (format!("https://{ip}/static/missing.json"), "404"),
        (
            format!("http://{ip}/static/client.json"),
            "unknown client_id",
        ),
        ("https://127.0.0.1/client.json".to_string(), "is refused"),
        ("https://localhost/client.json".to_string(), "is refused"),
        ("https://[::1]/client.json".to_string(), "is refused"),
        ("https://10.1.2.3/client.json".to_string(), "private"),
        ("https://192.168.0.1/client.json".to_string(), "private"),
        (
            "https://169.254.169.254/latest/meta-data".to_string(),
            "link-local",
        ),
        ("https://[::ffff:127.0.0.1]/x".to_string(), "is refused"),
        (format!("https://{ip}/"), "path"),
    ] {
        let page = open_page(&authorize_url(&s.base, &client_id, &challenge, &[])).await;
        assert_eq!(
            page.status,
            StatusCode::BAD_REQUEST,
            "{client_id}: {}",
            page.html
        );
        assert!(
            page.html.contains(want),
            "{client_id}: wanted {want:?} in {}",
            page.html
        );
        assert!(page.location().is_none());
    }
    // The redirect URI must be one the document lists.
    let page = open_page(&authorize_url(&s.base, &elsewhere, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(
        page.html.contains("not one the client registered"),
        "{}",
        page.html
    );
    // A redirect is not followed (here it leads to this machine's loopback), and a server that
    // does not answer in 5 s is given up on.
    let moved = format!("https://{ip}/moved/client.json");
    write("client.json", &doc(&moved, REDIRECT));
    let page = open_page(&authorize_url(&s.base, &moved, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(page.html.contains("302"), "{}", page.html);
    let slow = format!("https://{ip}/slow/slow.json");
    write("slow.json", &doc(&slow, REDIRECT));
    let began = std::time::Instant::now();
    let page = open_page(&authorize_url(&s.base, &slow, &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "{}", page.html);
    assert!(
        began.elapsed() < std::time::Duration::from_secs(8),
        "the slow document was waited for: {:?}",
        began.elapsed()
    );
    // A document read is kept for a while: changed on its server meanwhile, the client is still
    // the one first read (10 minutes, README).
    let kept = format!("https://{ip}/static/kept.json");
    write("kept.json", &doc(&kept, REDIRECT));
    let page = open_page(&authorize_url(&s.base, &kept, &challenge, &[])).await;
    assert!(page.html.contains("Doc client"), "{}", page.html);
    let mut changed = doc(&kept, REDIRECT);
    changed["client_name"] = json!("Renamed client");
    write("kept.json", &changed);
    let page = open_page(&authorize_url(&s.base, &kept, &challenge, &[])).await;
    assert!(
        page.html.contains("Doc client") && !page.html.contains("Renamed"),
        "{}",
        page.html
    );
}
