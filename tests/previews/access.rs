//! Access: previews are per sandbox, public only on request and deletable; smuggled hosts and bad
//! arguments are refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::{Url, get, needs_previews, preview, raw, read_head, start_app, token_header};

/// Two sandboxes serve the same port, each at its own URL; one's token opens only its own
/// preview (not another sandbox's, nor another port's of its own); public previews need none; a deleted one stops answering (and its WebSocket closes);
/// a port with no server gets a page saying to start one; a paused sandbox wakes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_are_per_sandbox_public_on_request_and_deletable() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    if !needs_previews(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let a = create(&client).await;
    let b = create(&client).await;
    start_app(&client, &a, 8000, "first").await;
    start_app(&client, &b, 8000, "second").await;
    let pa = Url::parse(
        preview(&client, &a, json!({"port": 8000})).await["url"]
            .as_str()
            .unwrap(),
    );
    let pb = Url::parse(
        preview(&client, &b, json!({"port": 8000})).await["url"]
            .as_str()
            .unwrap(),
    );
    assert_ne!(pa.host, pb.host);
    assert_eq!(
        get(&pa, "/", &token_header(&pa)).await.json()["name"],
        "first"
    );
    assert_eq!(
        get(&pb, "/", &token_header(&pb)).await.json()["name"],
        "second"
    );
    // A's token on B's preview (and B's path form): refused.
    assert_eq!(get(&pb, "/", &token_header(&pa)).await.status, 403);
    let plain = Url {
        host: format!("localhost:{}", pa.listen),
        ..pa.clone()
    };
    let a_on_b = get(&plain, &format!("/preview/{b}/8000/"), &token_header(&pa)).await;
    assert_eq!(a_on_b.status, 403, "{a_on_b:?}");
    // A preview of a port the sandbox never exposed: none, whatever the token.
    let elsewhere = Url {
        host: pa.host.replacen("8000-", "8001-", 1),
        ..pa.clone()
    };
    assert_eq!(get(&elsewhere, "/", &token_header(&pa)).await.status, 404);

    // Calling create again keeps the URL (and token); public is an explicit choice.
    let again = Url::parse(
        preview(&client, &a, json!({"port": 8000})).await["url"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(again.token, pa.token);
    let public = preview(&client, &b, json!({"port": 8000, "public": true})).await;
    assert_eq!(public["public"], true);
    assert!(public["token"].is_null());
    let pub_url = Url::parse(public["url"].as_str().unwrap());
    assert!(pub_url.token.is_none(), "{public}");
    assert_eq!(get(&pub_url, "/", "").await.json()["name"], "second");
    let listed = ok(&client, "sandbox_preview_list", json!({"sandbox_id": b})).await;
    assert_eq!(listed["previews"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["previews"][0]["public"], true);

    // Nothing listening: a 502 that says what to do.
    let p = Url::parse(
        preview(&client, &a, json!({"port": 9999})).await["url"]
            .as_str()
            .unwrap(),
    );
    // Each port's token opens that port alone, of the same sandbox too: by host and by path.
    assert_eq!(get(&p, "/", &token_header(&pa)).await.status, 403);
    assert_eq!(get(&pa, "/", &token_header(&p)).await.status, 403);
    let by_path = get(&plain, &format!("/preview/{a}/8000/"), &token_header(&p)).await;
    assert_eq!(by_path.status, 403, "{by_path:?}");
    let page = get(&p, "/", &token_header(&p)).await;
    assert_eq!(page.status, 502, "{page:?}");
    assert!(
        page.body.contains("Start a server on port 9999"),
        "{}",
        page.body
    );

    // A paused sandbox resumes on the first request.
    ok(&client, "sandbox_pause", json!({"sandbox_id": a})).await;
    assert_eq!(
        get(&pa, "/", &token_header(&pa)).await.json()["name"],
        "first"
    );
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": a})).await;
    assert_eq!(info["status"], "running");

    // Delete: the URL stops answering, and an open WebSocket through it is closed.
    let (listen, host, tok) = (pa.listen, pa.host.clone(), pa.token.clone().unwrap());
    let ws = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET /ws HTTP/1.1\r\nHost: {host}\r\nX-Preview-Token: {tok}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        assert!(read_head(&mut s).starts_with("HTTP/1.1 101"));
        s
    })
    .await
    .unwrap();
    let deleted = ok(
        &client,
        "sandbox_preview_delete",
        json!({"sandbox_id": a, "port": 8000}),
    )
    .await;
    assert_eq!(deleted["deleted"], true);
    assert_eq!(get(&pa, "/", &token_header(&pa)).await.status, 404);
    tokio::task::spawn_blocking(move || {
        let mut ws = ws;
        let mut buf = [0u8; 16];
        let n = ws.read(&mut buf).unwrap_or(0);
        assert_eq!(
            n, 0,
            "the WebSocket stayed open after its preview was deleted"
        );
    })
    .await
    .unwrap();
    let again = ok(
        &client,
        "sandbox_preview_delete",
        json!({"sandbox_id": a, "port": 8000}),
    )
    .await;
    assert_eq!(again["deleted"], false);

    // Killing a sandbox ends its previews.
    ok(&client, "sandbox_kill", json!({"sandbox_id": b})).await;
    assert_eq!(get(&pub_url, "/", "").await.status, 404);
}

/// Requests built to confuse the proxy about where they go are refused, not guessed at; bad
/// arguments get errors that say what to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggled_hosts_and_bad_arguments_are_refused() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    if !needs_previews(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let a = create(&client).await;
    let b = create(&client).await;
    start_app(&client, &b, 3000, "victim").await;
    let pa = Url::parse(
        preview(&client, &a, json!({"port": 3000, "public": true})).await["url"]
            .as_str()
            .unwrap(),
    );
    let pb = Url::parse(
        preview(&client, &b, json!({"port": 3000})).await["url"]
            .as_str()
            .unwrap(),
    );

    // Two Host headers (the public one first, the private one second).
    let two = raw(
        pa.listen,
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nHost: {}\r\nConnection: close\r\n\r\n",
            pa.host, pb.host
        ),
    )
    .await;
    assert_eq!(two.status, 400, "{two:?}");
    assert!(two.body.contains("more than one Host"), "{}", two.body);
    // An absolute URI naming the private preview under the public one's Host.
    let absolute = raw(
        pa.listen,
        format!(
            "GET http://{}/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            pb.host, pa.host
        ),
    )
    .await;
    assert_eq!(absolute.status, 400, "{absolute:?}");
    // A second request on the same connection with another Host is judged on its own.
    let pipelined = raw(
        pa.listen,
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\n\r\nGET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            pa.host, pb.host
        ),
    )
    .await;
    assert_eq!(pipelined.status, 502, "{pipelined:?}");
    assert!(pipelined.body.contains("HTTP/1.1 401"), "{pipelined:?}");
    assert!(!pipelined.body.contains("victim"), "{pipelined:?}");
    // An unknown host: the listener says what it is.
    let unknown = raw(
        pa.listen,
        "GET / HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n".into(),
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert!(
        unknown.body.contains("sandbox_preview_create"),
        "{}",
        unknown.body
    );

    for (args, says) in [
        (json!({"sandbox_id": a, "port": 0}), "port"),
        (json!({"sandbox_id": a, "port": 70000}), "port"),
        (
            json!({"sandbox_id": a, "port": 3000, "expires_in": 5}),
            "expires_in",
        ),
        (json!({"sandbox_id": a}), "port"),
    ] {
        let e = err(&client, "sandbox_preview_create", args.clone()).await;
        assert!(e.contains(says), "{args}: {e}");
    }
    let e = err(
        &client,
        "sandbox_preview_create",
        json!({"sandbox_id": "sbx_0000000000000000000000000a", "port": 3000}),
    )
    .await;
    assert!(e.contains("not found"), "{e}");
    // The cap on previews per sandbox.
    for port in 1..=31 {
        preview(&client, &a, json!({"port": 10000 + port})).await;
    }
    let e = err(
        &client,
        "sandbox_preview_create",
        json!({"sandbox_id": a, "port": 20000}),
    )
    .await;
    assert!(e.contains("32 previews"), "{e}");
}
