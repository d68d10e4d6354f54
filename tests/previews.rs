//! Preview URLs through MCP, against a real dev server in real sandboxes: private and public
//! previews, the token's ways in and out, WebSocket and server-sent events, two sandboxes on
//! one port, a 502 with advice, deletion, expiry across a restart, and requests that try to
//! confuse the proxy. Requests to the preview listener are written by hand (raw HTTP/1.1), so
//! the tests control every byte — two Host headers included.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;
use crate::testnet::{ws_frame, ws_read};

const APP: &str = include_str!("fixtures/preview_app.py");

/// A preview URL, taken apart.
#[derive(Debug, Clone)]
struct Url {
    /// `{port}-{id}.localhost:{listen port}`.
    host: String,
    listen: u16,
    token: Option<String>,
}

impl Url {
    fn parse(url: &str) -> Url {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, query) = rest.split_once('/').unwrap();
        let listen = host.rsplit_once(':').unwrap().1.parse().unwrap();
        let token = query.strip_prefix("?preview_token=").map(str::to_string);
        Url {
            host: host.to_string(),
            listen,
            token,
        }
    }
}

/// What came back: status, head (status line and headers), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Sends `request` as written to the preview listener and reads the answer to its end.
async fn raw(listen: u16, request: String) -> Answer {
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut data = Vec::new();
        let _ = s.read_to_end(&mut data);
        let text = String::from_utf8_lossy(&data).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {text:?}"));
        // Chunked bodies (streamed by the proxy) are de-chunked for the assertions.
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        Answer {
            status,
            head: head.to_string(),
            body,
        }
    })
    .await
    .unwrap()
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n.min(rest.len())]);
        s = rest.get(n + 2..).unwrap_or("");
    }
    out
}

/// A GET of `path` on `host` with extra header lines (each ending in `\r\n`).
async fn get(url: &Url, path: &str, extra: &str) -> Answer {
    raw(
        url.listen,
        format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{extra}Connection: close\r\n\r\n",
            url.host
        ),
    )
    .await
}

fn token_header(url: &Url) -> String {
    format!("X-Preview-Token: {}\r\n", url.token.as_ref().unwrap())
}

/// Starts the test app on `port` in sandbox `id`, answering as `name`; waits until it listens.
async fn start_app(client: &McpClient, id: &str, port: u16, name: &str) {
    ok(
        client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/app.py", "content": APP}),
    )
    .await;
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": format!("python3 /root/app.py {port} {name}"), "background": true}),
    )
    .await;
    let probe = format!(
        "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1"
    );
    sh(client, id, &probe).await;
}

async fn preview(client: &McpClient, id: &str, args: Value) -> Value {
    let mut args = args;
    args["sandbox_id"] = json!(id);
    ok(client, "sandbox_preview_create", args).await
}

fn needs_previews(engine: &TestEngine) -> bool {
    if !engine.manager.driver().capabilities().egress {
        eprintln!(
            "SKIPPED: previews need the engine to run as root (it enters each sandbox's network namespace)"
        );
        return false;
    }
    true
}

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

fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed during the head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_string()
}

/// Two sandboxes serve the same port, each at its own URL; one's token opens only its own
/// preview; public previews need none; a deleted one stops answering (and its WebSocket closes);
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

/// Previews are stored with their sandbox: they survive an engine restart, and one past its
/// expiry answers 410 and is listed as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_survive_a_restart_and_expire() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    if !needs_previews(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let id = create(&client).await;
    let kept = preview(&client, &id, json!({"port": 4000})).await;
    let expiring = preview(&client, &id, json!({"port": 4001, "expires_in": 60})).await;
    assert!(expiring["expires_at"].is_string(), "{expiring}");
    drop(client);
    let dir = engine.stop().await;
    // Move the expiry into the past while the engine is down.
    let db = rusqlite::Connection::open(dir.path().join("data/state.db")).unwrap();
    db.execute(
        "UPDATE previews SET expires_at = 1000 WHERE port = 4001",
        [],
    )
    .unwrap();
    drop(db);
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    start_app(&client, &id, 4000, "back").await;
    let listed = ok(&client, "sandbox_preview_list", json!({"sandbox_id": id})).await;
    let previews = listed["previews"].as_array().unwrap();
    assert_eq!(previews.len(), 2, "{listed}");
    let url = Url::parse(previews[0]["url"].as_str().unwrap());
    assert_eq!(
        url.token,
        Url::parse(kept["url"].as_str().unwrap()).token,
        "the token survived the restart"
    );
    assert_eq!(
        get(&url, "/", &token_header(&url)).await.json()["name"],
        "back"
    );
    assert_eq!(previews[1]["expired"], true, "{listed}");
    let gone = Url::parse(previews[1]["url"].as_str().unwrap());
    let a = get(&gone, "/", &token_header(&gone)).await;
    assert_eq!(a.status, 410, "{a:?}");
    assert!(a.body.contains("expired"), "{}", a.body);
}

/// `--preview-listen` and `--preview-domain` (and their variables) on both commands: checked
/// with a way to write them, used in the URLs, an explicit address that is taken is an error,
/// and `off` makes create say previews are off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_settings_on_both_commands() {
    for (flag, value, expected) in [
        (
            "--preview-listen",
            "localhost",
            "is not an address to listen on",
        ),
        ("--preview-domain", "under_score.test", "is not a domain"),
    ] {
        assert_flag_refused_on_both_commands(flag, value, expected);
    }
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: previews need root");
        return;
    }
    // The standalone engine, configured by environment.
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempData::new();
    let data = dir.data();
    let api = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut engine = std::process::Command::new(BIN)
        .args(["engine", "--listen", &format!("127.0.0.1:{api}")])
        .env("SANDBOX_MCP_DATA_DIR", &data)
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .env("SANDBOX_MCP_PREVIEW_LISTEN", format!("127.0.0.1:{listen}"))
        .env("SANDBOX_MCP_PREVIEW_DOMAIN", "Preview.Example.test")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let base = format!("http://127.0.0.1:{api}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/v1/health")).send().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "engine did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, sandbox) = crate::common::api(&base, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let id = sandbox["id"].as_str().unwrap();
    let (_, p) = crate::common::api(
        &base,
        "POST",
        &format!("/v1/sandboxes/{id}/previews"),
        Some(json!({"port": 5000})),
    )
    .await;
    let url = Url::parse(p["url"].as_str().unwrap());
    assert_eq!(
        url.host,
        format!(
            "5000-{}.preview.example.test:{listen}",
            id.replace('_', "-")
        ),
        "{p}"
    );
    // That listener serves it (nothing listens in the sandbox yet: the 502 page).
    let a = get(&url, "/", &token_header(&url)).await;
    assert_eq!(a.status, 502, "{a:?}");
    // Another engine asking for the same address explicitly fails, saying which.
    let other = TempData::new();
    let out = std::process::Command::new("timeout")
        .args(["20", BIN, "engine", "--listen", "127.0.0.1:0"])
        .args(["--preview-listen", &format!("127.0.0.1:{listen}")])
        .env("SANDBOX_MCP_DATA_DIR", other.data())
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot listen for previews on"), "{said}");
    let _ = http
        .delete(format!("{base}/v1/sandboxes/{id}"))
        .bearer_auth(KEY)
        .send()
        .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(engine.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    assert!(engine.wait().unwrap().success());

    // The embedded engine with previews off: create says so.
    let off = TempData::new();
    let mut server = std::process::Command::new(BIN)
        .args(["--preview-listen", "off"])
        .env_remove("SANDBOX_MCP_URL")
        .env("SANDBOX_MCP_DATA_DIR", off.data())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let said = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut stdin = server.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(server.stdout.take().unwrap());
        let mut ask = |msg: Value| {
            writeln!(stdin, "{msg}").unwrap();
            if msg.get("id").is_none() {
                return Value::Null;
            }
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            serde_json::from_str::<Value>(&line).unwrap()
        };
        ask(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}));
        ask(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let created = ask(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "sandbox_create", "arguments": {}}}));
        let id = created["result"]["structuredContent"]["id"].as_str().unwrap().to_string();
        let refused = ask(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "sandbox_preview_create", "arguments": {"sandbox_id": id, "port": 3000}}}));
        ask(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "sandbox_kill", "arguments": {"sandbox_id": id}}}));
        drop(stdin);
        let _ = server.wait();
        refused
    })
    .await
    .unwrap();
    assert_eq!(said["result"]["isError"], true, "{said}");
    assert!(
        said.to_string().contains("previews are off on this engine"),
        "{said}"
    );
}
