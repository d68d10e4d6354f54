//! An external identity provider (`--oauth-issuer`): a small one the test runs itself, with its
//! own keys, discovery document and JWKS. Its tokens are accepted; a rotated key works at once and
//! the removed one stops; expired tokens, other audiences and issuers, `alg: none`, and an HMAC
//! token keyed with the public key are each refused with 401 and the challenge; a token without
//! the scope gets 403 `insufficient_scope`.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use reqwest::StatusCode;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};

use super::{OAuthServer, Setup, http, probe};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

struct Key {
    pair: EcdsaKeyPair,
    kid: String,
}

impl Key {
    fn new(kid: &str) -> Key {
        let rng = ring::rand::SystemRandom::new();
        let der = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Key {
            pair: EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der.as_ref(), &rng)
                .unwrap(),
            kid: kid.to_string(),
        }
    }

    fn jwk(&self) -> Value {
        let p = self.pair.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
            "x": b64(&p[1..33]), "y": b64(&p[33..65])})
    }

    fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = self
            .pair
            .sign(&ring::rand::SystemRandom::new(), input.as_bytes())
            .unwrap();
        format!("{input}.{}", b64(sig.as_ref()))
    }
}

/// The identity provider: discovery and a JWKS the test can change.
struct Idp {
    issuer: String,
    jwks: Arc<Mutex<Value>>,
    fetches: Arc<Mutex<u32>>,
}

async fn idp() -> Idp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let jwks = Arc::new(Mutex::new(json!({"keys": []})));
    let fetches = Arc::new(Mutex::new(0));
    let discovery = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/keys"),
        "authorization_endpoint": format!("{issuer}/authorize"), "token_endpoint": format!("{issuer}/token")});
    let (j, f) = (jwks.clone(), fetches.clone());
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || {
                let d = discovery.clone();
                async move { axum::Json(d) }
            }),
        )
        .route(
            "/keys",
            axum::routing::get(move || {
                *f.lock().unwrap() += 1;
                let v = j.lock().unwrap().clone();
                async move { axum::Json(v) }
            }),
        );
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Idp {
        issuer,
        jwks,
        fetches,
    }
}

#[tokio::test]
async fn an_external_issuers_tokens_are_checked_against_its_keys() {
    let idp = idp().await;
    let a = Key::new("key-a");
    *idp.jwks.lock().unwrap() = json!({"keys": [a.jwk()]});
    let s = OAuthServer::start_with(Setup {
        external: Some((idp.issuer.clone(), "team".into())),
        ..Setup::default()
    })
    .await;
    let mcp = s.mcp();
    let now = sandbox_mcp_model::ids::now_ms() / 1000;
    let claims = |over: Value| {
        let mut c = json!({"iss": idp.issuer, "aud": mcp, "sub": "user-1", "team": "alpha",
            "scope": "openid sandboxes", "iat": now, "exp": now + 300});
        for (k, v) in over.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };

    // The resource metadata names the issuer; a missing token gets the challenge.
    let prm = super::get_json(format!(
        "{}/.well-known/oauth-protected-resource/mcp",
        s.base
    ))
    .await;
    assert_eq!(prm["authorization_servers"], json!([idp.issuer]));
    let (status, challenge) = probe(&mcp, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(challenge.contains("resource_metadata="), "{challenge}");
    // No authorization server of our own is served.
    let none = http()
        .get(format!("{}/.well-known/oauth-authorization-server", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), StatusCode::NOT_FOUND);

    // A good token, an audience list, and `scp` as an array.
    assert_eq!(
        probe(&mcp, Some(&a.sign(&claims(json!({}))))).await.0,
        StatusCode::OK
    );
    let list = a.sign(&claims(
        json!({"aud": ["other", mcp], "scope": null, "scp": ["sandboxes"]}),
    ));
    assert_eq!(probe(&mcp, Some(&list)).await.0, StatusCode::OK);

    // Each bad one: 401 with error="invalid_token".
    let public_key = a.pair.public_key().as_ref().to_vec();
    let hmac = {
        let header = b64(br#"{"alg":"HS256","typ":"JWT","kid":"key-a"}"#);
        let body = b64(claims(json!({})).to_string().as_bytes());
        let input = format!("{header}.{body}");
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &public_key);
        format!(
            "{input}.{}",
            b64(ring::hmac::sign(&k, input.as_bytes()).as_ref())
        )
    };
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(claims(json!({})).to_string().as_bytes())
    );
    let stranger = Key::new("key-a"); // the same kid, another key
    for (what, token) in [
        ("expired", a.sign(&claims(json!({"exp": now - 3600})))),
        ("no exp", a.sign(&claims(json!({"exp": null})))),
        ("not yet valid", a.sign(&claims(json!({"nbf": now + 3600})))),
        (
            "wrong audience",
            a.sign(&claims(json!({"aud": "https://other.example/mcp"}))),
        ),
        (
            "wrong issuer",
            a.sign(&claims(json!({"iss": "https://evil.example"}))),
        ),
        ("alg none", unsigned),
        ("HMAC keyed with the public key", hmac),
        ("signed by another key", stranger.sign(&claims(json!({})))),
        ("garbage", "a.b.c".to_string()),
    ] {
        let (status, challenge) = probe(&mcp, Some(&token)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
    }
    // Missing scope: 403, asking for it. A claim that is no tenant name: 403.
    let (status, challenge) = probe(&mcp, Some(&a.sign(&claims(json!({"scope": "openid"}))))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        challenge.contains("insufficient_scope") && challenge.contains("scope=\"sandboxes\""),
        "{challenge}"
    );
    let (status, challenge) = probe(&mcp, Some(&a.sign(&claims(json!({"team": "Team A!"}))))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{challenge}");
    let (status, _) = probe(&mcp, Some(&a.sign(&claims(json!({"team": null}))))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Rotation: the provider publishes key B only. A token signed by B (a kid not seen before)
    // is accepted at once; A's, now unpublished, is refused once the keys were read again.
    let b = Key::new("key-b");
    *idp.jwks.lock().unwrap() = json!({"keys": [b.jwk()]});
    tokio::time::sleep(
        sandbox_mcp_oauth::issuer::REFETCH_AFTER + std::time::Duration::from_millis(100),
    )
    .await;
    let before = *idp.fetches.lock().unwrap();
    assert_eq!(
        probe(&mcp, Some(&b.sign(&claims(json!({}))))).await.0,
        StatusCode::OK
    );
    assert_eq!(
        *idp.fetches.lock().unwrap(),
        before + 1,
        "an unknown kid made the keys be read again"
    );
    assert_eq!(
        probe(&mcp, Some(&a.sign(&claims(json!({}))))).await.0,
        StatusCode::UNAUTHORIZED
    );
    // Unknown kids cannot make the server hammer the provider: at most one read a second.
    let start = std::time::Instant::now();
    let before = *idp.fetches.lock().unwrap();
    for i in 0..20 {
        let k = Key::new(&format!("junk-{i}"));
        let (status, _) = probe(&mcp, Some(&k.sign(&claims(json!({}))))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let most = before + 1 + start.elapsed().as_secs() as u32;
    let fetches = *idp.fetches.lock().unwrap();
    assert!(
        fetches <= most,
        "{fetches} reads of the keys, at most {most} expected"
    );
}
