//! Serving: a private preview carries HTTP, WebSocket and server-sent events to the sandbox's app,
//! with the token, and only with it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;
use crate::testnet::{ws_frame, ws_read};

use super::{Url, get, needs_previews, preview, raw, read_head, start_app, token_header};

/// The "done when", for previews: a private URL that works in a browser's way (token →
/// cookie) and a client's (header), WebSocket and SSE through it, and nothing of the token
/// reaching the app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_preview_serves_http_websocket_and_sse() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    if !needs_previews(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let id = create(&client).await;
    start_app(&client, &id, 3000, "alpha").await;
    let p = preview(&client, &id, json!({"port": 3000})).await;
    assert_eq!(p["public"], false);
    let url = Url::parse(p["url"].as_str().unwrap());
    let token = url.token.clone().expect("a private URL carries its token");
    assert_eq!(p["token"], json!(token));
    assert_eq!(
        url.host.split(':').next().unwrap(),
        format!("3000-{}.localhost", id.replace('_', "-"))
    );

    // No token: refused, with what to do.
    let a = get(&url, "/", "").await;
    assert_eq!(a.status, 401, "{a:?}");
    assert!(a.body.contains("X-Preview-Token"), "{}", a.body);
    // A wrong one: refused too.
    let a = get(&url, "/", "X-Preview-Token: nottheone\r\n").await;
    assert_eq!(a.status, 403, "{a:?}");
    let a = get(&url, "/?preview_token=nottheone", "").await;
    assert_eq!(a.status, 403, "{a:?}");

    // A browser: the URL's token becomes an HttpOnly cookie, and leaves the address bar.
    let a = get(&url, &format!("/app?x=1&preview_token={token}"), "").await;
    assert_eq!(a.status, 303, "{a:?}");
    assert_eq!(a.header("location").as_deref(), Some("/app?x=1"));
    let cookie = a.header("set-cookie").unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains(&token),
        "{cookie}"
    );
    let with_cookie = format!("Cookie: theme=dark; sandbox_preview={token}\r\n");
    let a = get(&url, "/app?x=1", &with_cookie).await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen = a.json();
    assert_eq!(seen["name"], "alpha");
    assert_eq!(seen["path"], "/app?x=1");
    let headers = &seen["headers"];
    // The app sees one Host whoever visits, its own cookies, and nothing of the token.
    assert_eq!(headers["host"], "localhost:3000");
    assert_eq!(headers["cookie"], "theme=dark");
    assert_eq!(headers["x-forwarded-host"], json!(url.host));
    assert!(
        !a.body.contains(&token),
        "the token reached the app: {}",
        a.body
    );

    // A client: the header, also removed before the app.
    let a = get(&url, "/api", &token_header(&url)).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(!a.body.contains(&token), "{}", a.body);
    assert!(a.json()["headers"].get("x-preview-token").is_none());
    // A POST body passes through.
    let body = "hello=world";
    let a = raw(
        url.listen,
        format!(
            "POST /form HTTP/1.1\r\nHost: {}\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            url.host,
            token_header(&url),
            body.len()
        ),
    )
    .await;
    assert_eq!(a.json()["body"], body);

    // The path form: the prefix is taken off, and said in X-Forwarded-Prefix.
    let path_url = p["path_url"].as_str().unwrap();
    let prefix = format!("/preview/{id}/3000");
    assert!(path_url.ends_with(&format!("{prefix}/")), "{path_url}");
    let plain = Url {
        host: format!("localhost:{}", url.listen),
        ..url.clone()
    };
    let a = get(&plain, &format!("{prefix}/deep/page"), &token_header(&url)).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json()["path"], "/deep/page");
    assert_eq!(a.json()["headers"]["x-forwarded-prefix"], json!(prefix));
    let a = get(&plain, &prefix, &token_header(&url)).await;
    assert_eq!(a.status, 308);
    assert_eq!(a.header("location"), Some(format!("{prefix}/")));

    // WebSocket, with the cookie a browser would send.
    let (listen, host) = (url.listen, url.host.clone());
    let cookie_line = with_cookie.clone();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET /ws HTTP/1.1\r\nHost: {host}\r\n{cookie_line}Upgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(
            head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            "the app's accept key came through: {head}"
        );
        for msg in ["hot", "reload"] {
            s.write_all(&ws_frame(1, msg.as_bytes())).unwrap();
            let (op, payload) = ws_read(&mut s);
            assert_eq!((op, payload), (1, format!("alpha: {msg}").into_bytes()));
        }
    })
    .await
    .unwrap();

    // Server-sent events arrive as they are sent, not when the response ends.
    let (listen, host, tok) = (url.listen, url.host.clone(), token.clone());
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET /sse HTTP/1.1\r\nHost: {host}\r\nX-Preview-Token: {tok}\r\n\r\n"
        )
        .unwrap();
        let started = std::time::Instant::now();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("tick 0") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        // The app waits 2 s before its second event: the first came through alone, at once.
        assert!(
            !String::from_utf8_lossy(&seen).contains("tick 1"),
            "the first event waited for the second"
        );
        assert!(started.elapsed() < Duration::from_millis(1900));
        assert!(String::from_utf8_lossy(&seen).contains("text/event-stream"));
    })
    .await
    .unwrap();
}
