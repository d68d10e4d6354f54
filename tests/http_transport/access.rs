//! Who may reach the transport: missing, wrong and revoked tokens, new keys without a restart,
//! foreign hosts and origins, tenants that see only their own sandboxes, and the MCP token that
//! never reaches the control plane.

use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use rmcp::model::ProtocolVersion;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::keys::KeyStore;

use crate::common::{KEY, TestEngine, text};
use crate::require_sandboxes;

use super::{Fixture, INIT_2025, call, initialize, ok};

#[tokio::test]
async fn missing_wrong_and_revoked_tokens_get_401_and_new_keys_work_without_restart() {
    let f = Fixture::start().await;
    let raw = f.raw();

    let none = raw.post(None, None, initialize(INIT_2025)).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    let message = none.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("keys create"), "{}", none.body);

    let wrong = raw
        .post(Some("smcp_not-a-real-token"), None, initialize(INIT_2025))
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.header("www-authenticate"), Some("Bearer"));

    // A key created after the server started (as `keys create` would) works at once.
    let token = f.token("alpha");
    let good = raw.post(Some(&token), None, initialize(INIT_2025)).await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.body);
    assert!(good.header("mcp-session-id").is_some());

    // Tokens are accepted only in the Authorization header.
    let in_query = raw
        .send(
            raw.http
                .post(format!("{}?access_token={token}&token={token}", raw.url))
                .header("accept", "application/json, text/event-stream")
                .json(&initialize(INIT_2025)),
        )
        .await;
    assert_eq!(in_query.status, StatusCode::UNAUTHORIZED);
    let other_scheme = raw
        .send(
            raw.request(reqwest::Method::POST, None)
                .header("authorization", format!("Basic {token}"))
                .json(&initialize(INIT_2025)),
        )
        .await;
    assert_eq!(other_scheme.status, StatusCode::UNAUTHORIZED);

    // Revoked through another store on the same file (as `keys revoke` would): refused at once,
    // including inside the session it opened.
    let session = raw.open_session(Some(&token)).await;
    let store = KeyStore::open(f.keys.path().parent().unwrap());
    let id = store
        .list()
        .unwrap()
        .into_iter()
        .find(|k| k.tenant == "alpha")
        .unwrap()
        .id;
    store.revoke(&id).unwrap();
    let revoked = raw.post(Some(&token), None, initialize(INIT_2025)).await;
    assert_eq!(revoked.status, StatusCode::UNAUTHORIZED);
    let in_session = raw
        .post(
            Some(&token),
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
    assert_eq!(in_session.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn foreign_host_or_origin_gets_403_and_flags_allow_more() {
    let f = Fixture::start_with(|o| {
        o.allowed_hosts = vec!["mcp.example.com".into()];
        o.allowed_origins = vec!["https://app.example.com".into()];
    })
    .await;
    let raw = f.raw();
    let token = f.token("alpha");
    let post = |host: Option<&str>, origin: Option<&str>| {
        let mut r = raw
            .request(reqwest::Method::POST, Some(&token))
            .json(&initialize(INIT_2025));
        if let Some(h) = host {
            r = r.header("host", h);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        raw.send(r)
    };

    for (host, origin) in [
        (Some("evil.example.com"), None),
        (Some("evil.example.com:80"), None),
        (Some("localhost.evil.example.com"), None),
        (None, Some("http://evil.example.com")),
        (None, Some("https://localhost.evil.example.com")),
        (None, Some("null")),
        (None, Some("https://app.example.com.evil.example.com")),
    ] {
        let r = post(host, origin).await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "host {host:?} origin {origin:?}"
        );
        let message = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("--allow-"), "{}", r.body);
    }
    for (host, origin) in [
        (None, None),
        (Some("localhost"), Some("http://localhost:5173")),
        (Some("127.0.0.1"), Some("http://127.0.0.1:3000")),
        (Some("mcp.example.com"), None),
        (Some("mcp.example.com:443"), Some("https://mcp.example.com")),
        (None, Some("https://app.example.com")),
    ] {
        let r = post(host, origin).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "host {host:?} origin {origin:?}: {}",
            r.body
        );
    }
    // The checks come before authentication: a foreign Host learns nothing about tokens.
    let r = raw
        .send(
            raw.request(reqwest::Method::POST, None)
                .header("host", "evil.example.com")
                .json(&initialize(INIT_2025)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

/// Another tenant's sandbox id answers exactly like an id that does not exist.
#[tokio::test]
async fn tenants_see_and_touch_only_their_own_sandboxes() {
    require_sandboxes!();
    let f = Fixture::start().await;
    let alpha = f
        .client(&f.token("alpha"), ProtocolVersion::V_2025_11_25)
        .await;
    let beta = f
        .client(&f.token("beta"), ProtocolVersion::V_2026_07_28)
        .await;
    let created = ok(
        &alpha,
        "sandbox_create",
        json!({"metadata": {"owner": "alpha"}}),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_string();
    ok(
        &alpha,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "secret.txt", "content": "alpha only"}),
    )
    .await;

    let listed = ok(&beta, "sandbox_list", json!({})).await;
    assert!(!listed.to_string().contains(&id), "{listed}");
    let listed = ok(&alpha, "sandbox_list", json!({})).await;
    assert!(listed.to_string().contains(&id), "{listed}");

    let fake = "sbx_00000000000000000000000000";
    let probes: [(&str, Value); 7] = [
        ("sandbox_info", json!({})),
        ("sandbox_exec", json!({"command": "cat secret.txt"})),
        ("sandbox_files_read", json!({"path": "secret.txt"})),
        ("sandbox_files_list", json!({"path": "."})),
        ("sandbox_files_write", json!({"path": "x", "content": "y"})),
        ("sandbox_pause", json!({})),
        ("sandbox_kill", json!({})),
    ];
    for (tool, args) in probes {
        let with = |sid: &str| {
            let mut a = args.clone();
            a["sandbox_id"] = json!(sid);
            a
        };
        let foreign = call(&beta, tool, with(&id)).await;
        let unknown = call(&beta, tool, with(fake)).await;
        assert_eq!(foreign.is_error, Some(true), "{tool}: {}", text(&foreign));
        assert_eq!(
            text(&foreign).replace(&id, "<id>"),
            text(&unknown).replace(fake, "<id>"),
            "{tool}: a foreign id must look unknown"
        );
    }
    // Nothing beta tried touched it.
    let r = ok(
        &alpha,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "cat secret.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "alpha only");
    let info = ok(&alpha, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "running", "{info}");
    ok(&alpha, "sandbox_kill", json!({"sandbox_id": id})).await;
}

/// A recording TCP proxy in front of the real engine: whatever the MCP server sends to the
/// control plane passes through it.
async fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let record = record.clone();
            let target = target.clone();
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(&target).await.unwrap();
                let (mut ri, mut wi) = inbound.split();
                let (mut ro, mut wo) = outbound.split();
                let up = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = ri.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            let _ = wo.shutdown().await;
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if wo.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async {
                    let _ = tokio::io::copy(&mut ro, &mut wi).await;
                    let _ = wi.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn the_mcp_token_never_reaches_the_control_plane() {
    let engine = TestEngine::start().await;
    let target = engine
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let (proxy, seen) = recording_proxy(target).await;
    let backend = Backend::remote(&proxy, Some(ApiKey::new(KEY))).unwrap();
    let f = Fixture::start_on(engine, backend, |_| {}).await;
    let token = f.token("alpha");
    let client = f.client(&token, ProtocolVersion::V_2025_11_25).await;
    ok(&client, "sandbox_list", json!({})).await;
    ok(&client, "sandbox_template_list", json!({})).await;
    let bytes = String::from_utf8_lossy(&seen.lock().unwrap()).to_lowercase();
    assert!(bytes.contains("x-sandbox-tenant: alpha"), "{bytes}");
    assert!(
        bytes.contains(&format!("bearer {}", KEY.to_lowercase())),
        "{bytes}"
    );
    assert!(
        !bytes.contains(&token.to_lowercase()),
        "the MCP token was forwarded"
    );
}
