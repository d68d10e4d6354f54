//! A control plane that is unreachable, slow, or answers garbage: every tool answers within its
//! deadline with an actionable `isError` result, and the MCP server stays up.
//!
//! The real engine cannot be made slow or broken on demand, so these use test-only HTTP stubs
//! (the standards allow exactly that); everything on the MCP side is the real server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_server::tooldefs::registry;

use crate::common::{McpClient, call, mcp_for, text};

const SANDBOX: &str = "sbx_0123456789abcdefghjkmnpqrs";

/// Valid arguments for every tool (so the failure is the control plane's, not validation's).
fn valid_args(tool: &str) -> Value {
    let schema = &registry()
        .tools
        .iter()
        .find(|t| t.name == tool)
        .unwrap()
        .input_schema;
    let mut args = serde_json::Map::new();
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = name.as_str().unwrap();
        let value = match name {
            "sandbox_id" => json!(SANDBOX),
            "metadata" => json!({"k": "v"}),
            "command" => json!("true"),
            "code" => json!("1 + 1"),
            "language" => json!("python"),
            "job_id" => json!("job_1"),
            "context_id" => json!("default"),
            "content" => json!("x"),
            "path" | "from" => json!("a.txt"),
            "to" => json!("b.txt"),
            "port" => json!(3000),
            "env" => json!("API_KEY"),
            "secret" => json!("example"),
            "name" => json!("example"),
            "snapshot_id" => json!("snap_00000000000000000000000000"),
            "against" => json!(SANDBOX),
            "source_id" => json!(SANDBOX),
            "action" => json!("click"),
            other => panic!("{tool}: no test value for required argument `{other}`; add one"),
        };
        args.insert(name.to_string(), value);
    }
    // Tools with their own timeout argument get a short one: their deadline derives from it.
    if schema["properties"].get("timeout_ms").is_some() {
        args.insert("timeout_ms".into(), json!(1000));
    }
    Value::Object(args)
}

fn settings() -> ServerSettings {
    ServerSettings {
        request_timeout: Duration::from_secs(2),
        timeout_grace: Duration::from_secs(1),
    }
}

/// Calls every tool at once; returns (tool, elapsed, result text, is_error).
async fn call_every_tool(client: &McpClient) -> Vec<(String, Duration, String, Option<bool>)> {
    let calls = registry().tools.iter().map(|t| async move {
        let started = Instant::now();
        let r = call(client, &t.name, valid_args(&t.name)).await;
        (t.name.clone(), started.elapsed(), text(&r), r.is_error)
    });
    futures::future::join_all(calls).await
}

/// Every tool failed within `limit`, with a short message that says what happened and what to
/// do; the server still answers afterwards.
async fn assert_contained(client: &McpClient, kind: &str, limit: Duration, expect: &[&str]) {
    for (tool, elapsed, message, is_error) in call_every_tool(client).await {
        if tool == "sandbox_files_read" {
            eprintln!("{kind}: {tool} after {elapsed:?}: {message}");
        }
        assert_eq!(
            is_error,
            Some(true),
            "{kind}: {tool} did not fail: {message}"
        );
        assert!(
            elapsed <= limit,
            "{kind}: {tool} took {elapsed:?} (limit {limit:?})"
        );
        assert!(
            expect.iter().any(|e| message.contains(e)),
            "{kind}: {tool}: {message}"
        );
        assert!(
            message.len() < 600,
            "{kind}: {tool}: message too long: {message}"
        );
        for leak in ["panicked", "stack backtrace", "super-secret", "<html"] {
            assert!(
                !message.contains(leak),
                "{kind}: {tool} leaked {leak:?}: {message}"
            );
        }
    }
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(
        tools.len(),
        registry().tools.len(),
        "{kind}: server not answering"
    );
}

async fn serve_stub(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn client_for(url: &str) -> McpClient {
    let backend = Backend::remote(url, Some(ApiKey::new("super-secret-key"))).unwrap();
    mcp_for(backend, settings(), "all").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_control_plane() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = client_for(&format!("http://127.0.0.1:{port}")).await;
    assert_contained(
        &client,
        "unreachable",
        Duration::from_secs(5),
        &["unreachable"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_reset_by_the_control_plane() {
    // Accepts and closes every connection without a byte.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    let client = client_for(&url).await;
    assert_contained(&client, "reset", Duration::from_secs(5), &["unreachable"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_control_plane_hits_each_tools_deadline() {
    let url = serve_stub(axum::Router::new().fallback(|| async {
        tokio::time::sleep(Duration::from_secs(120)).await;
        "too late"
    }))
    .await;
    let client = client_for(&url).await;
    // Deadline: 2 s (request timeout), or timeout_ms 1 s + 1 s grace; plus scheduling slack.
    assert_contained(
        &client,
        "slow",
        Duration::from_secs(6),
        &["did not answer in time", "No answer"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_the_control_plane() {
    for (kind, app) in [
        (
            "html 200",
            axum::Router::new().fallback(|| async {
                (
                    [("content-type", "text/html")],
                    "<html><body>proxy error page</body></html>",
                )
            }),
        ),
        (
            "json of the wrong shape",
            axum::Router::new().fallback(|| async { axum::Json(json!({"unexpected": [1, 2, 3]})) }),
        ),
        (
            "html 502",
            axum::Router::new().fallback(|| async {
                (
                    axum::http::StatusCode::BAD_GATEWAY,
                    [("content-type", "text/html")],
                    "<html><body>bad gateway</body></html>",
                )
            }),
        ),
        (
            "truncated json",
            axum::Router::new()
                .fallback(|| async { ([("content-type", "application/json")], "{\"id\": \"sbx_") }),
        ),
    ] {
        let url = serve_stub(app).await;
        let client = client_for(&url).await;
        let expect: &[&str] = if kind.starts_with("html") {
            &["an HTML page came back"]
        } else {
            &["does not understand"]
        };
        assert_contained(&client, kind, Duration::from_secs(5), expect).await;
    }
}

/// A server whose certificate no system root vouches for (self-signed for `localhost`): the
/// client ends the handshake, so no request and no key ever goes to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_control_plane_with_an_untrusted_certificate_never_gets_the_key() {
    use tokio::io::AsyncReadExt;
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // What each connection came to: a handshake error, or the bytes sent over it once secure.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let server = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let outcome = match acceptor.accept(tcp).await {
                Err(e) => Err(e.to_string()),
                Ok(mut tls) => {
                    let mut buf = vec![0u8; 4096];
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    Ok(String::from_utf8_lossy(&buf[..n]).to_string())
                }
            };
            record.lock().unwrap().push(outcome);
        }
    });
    let client = client_for(&format!("https://localhost:{port}")).await;
    let r = call(&client, "sandbox_list", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the client never connected: {}", text(&r));
    // The message says what is wrong and what to change.
    let said = text(&r);
    assert!(
        said.contains("certificate") && said.contains("not one this machine trusts"),
        "{said}"
    );
    for outcome in &seen {
        assert!(
            outcome.is_err(),
            "a handshake with an untrusted certificate went through, and got: {outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_control_plane_is_spoken_to_over_tls() {
    use tokio::io::AsyncReadExt;
    // A listener that keeps what the client sends first, then hangs up: it cannot finish a
    // handshake, but it shows what reached the wire.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let first = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        buf.truncate(n);
        buf
    });
    let client = client_for(&format!("https://localhost:{port}")).await;
    let r = call(&client, "sandbox_list", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    let m = text(&r);
    assert!(m.contains("unreachable"), "{m}");
    let hello = first.await.unwrap();
    // A TLS handshake record (0x16, version 3.x) carrying a ClientHello (1) — and no key.
    assert!(hello.len() > 5, "{hello:?}");
    assert_eq!(
        (hello[0], hello[1], hello[5]),
        (0x16, 0x03, 0x01),
        "{hello:?}"
    );
    let seen = String::from_utf8_lossy(&hello);
    assert!(!seen.contains("super-secret-key") && !seen.contains("HTTP/1.1"));
}
