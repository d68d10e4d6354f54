//! Preview URLs through MCP, against a real dev server in real sandboxes: private and public
//! previews, the token's ways in and out, WebSocket and server-sent events, two sandboxes on
//! one port, a 502 with advice, deletion, expiry across a restart, and requests that try to
//! confuse the proxy. Requests to the preview listener are written by hand (raw HTTP/1.1), so
//! the tests control every byte — two Host headers included.
//!
//! This file holds the hand-written client and the app; the tests are by theme: [`serving`]
//! (HTTP, WebSocket and SSE through a private preview), [`access`] (per sandbox, public on
//! request, deletable; smuggled hosts refused), [`lifetime`] (restarts and expiry) and
//! [`settings`] (the preview flags of both commands).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

mod access;
mod lifetime;
mod serving;
mod settings;

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

fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed during the head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_string()
}
