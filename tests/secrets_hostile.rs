//! Brokered secrets under attack from the sandbox, with the secret's own host as the weapon:
//! servers that hand a credential back (echoes, CORS, error pages, encodings, redirects, cookies,
//! stored requests, TRACE, split and late bodies), and requests fronted to another site behind
//! the same address (absolute request lines, two `Host` headers, HTTP/2 `:authority` beside a
//! `host`, routing headers). The value must never reach the sandbox, and never another site.

use base64::Engine;
use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;
use crate::secrets::{VALUE, bound_sandbox, engine_for, py_out};

/// The forms of [`VALUE`] a test server hands back, as fragments a leak would contain.
fn leaked(text: &str) -> Option<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let hex: String = VALUE.bytes().map(|b| format!("{b:02x}")).collect();
    let fragments = [
        VALUE[..16].to_string(),
        VALUE[10..26].to_string(),
        VALUE[13..].to_lowercase(),
        b64.encode(format!("Bearer {VALUE}"))[8..28].to_string(),
        b64.encode(format!("user:{VALUE}"))[8..28].to_string(),
        hex[..24].to_string(),
    ];
    let lower = text.to_lowercase();
    fragments
        .into_iter()
        .find(|f| text.contains(f.as_str()) || lower.contains(&f.to_lowercase()))
}

/// A value in which every 16-byte window holds a character that escaping changes (`/ + " < & '`,
/// space, `>`), so no form is found by a window the escaping left alone: handed back
/// JSON-escaped (as Python and as Go write it, with and without `\/`), HTML-escaped and
/// percent-encoded (with `%20` and with `+`) by the test server's own encoders, each is cut or
/// withheld before it reaches the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_full_of_escaped_characters_comes_back_in_no_form() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net).await;
    const SPECIAL: &str = "a/b+c\"d<e&f'g h>i/j+k\"l<m&n'o p>q/r+s\"t<u&v";
    let (client, id) = bound_sandbox(
        &engine,
        "special",
        json!({"hosts": ["api.example.test"], "value": SPECIAL, "format": "Bearer {value}"}),
    )
    .await;
    for (how, expect) in [
        ("json", "cut"),
        ("json-slash", "cut"),
        ("json-u", "cut"),
        ("error", "cut"),
        ("percent", "cut"),
        ("plus", "cut"),
        ("header", "withheld"),
        ("location", "withheld"),
    ] {
        let out = exec(
            &client,
            &id,
            &format!(
                "curl -sS -i -H \"Authorization: $API_KEY\" 'https://api.example.test/reflect?how={how}'; echo \" exit=$?\""
            ),
        )
        .await;
        let text = format!("{}{}", out["stdout"], out["stderr"]);
        match expect {
            "withheld" => assert!(
                text.contains("502") && text.contains("withheld"),
                "{how}: {text}"
            ),
            _ => assert!(
                !text.contains("exit=0"),
                "{how}: the body came through whole: {text}"
            ),
        }
    }
    // The value did go out, whole.
    sh(
        &client,
        &id,
        "curl -sS -H \"Authorization: $API_KEY\" https://api.example.test/record",
    )
    .await;
    assert_eq!(
        net.recorded().last().unwrap()["headers"]["authorization"],
        format!("Bearer {SPECIAL}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secrets_own_host_cannot_hand_its_value_back() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net).await;
    let (client, id) = bound_sandbox(
        &engine,
        "example",
        json!({"hosts": ["api.example.test"], "value": VALUE, "format": "Bearer {value}"}),
    )
    .await;
    let curl = |how: &str, extra: &str| {
        format!(
            "curl -sS -i {extra} -H \"Authorization: $API_KEY\" 'https://api.example.test/reflect?how={how}'; echo \" exit=$?\""
        )
    };
    // Each way back, and what the sandbox gets instead: the response withheld (502, with the
    // reason), or its body cut before the value (curl fails mid-body).
    for (how, extra, expect) in [
        ("json", "", "cut"),
        ("json-slash", "", "cut"),
        ("header", "", "withheld"),
        ("header-name", "", "withheld"),
        ("error", "", "cut"),
        ("base64", "", "cut"),
        ("basic", "", "cut"),
        ("percent", "", "cut"),
        ("hex", "", "cut"),
        ("truncated", "", "cut"),
        ("location", "", "withheld"),
        ("location", "-L", "withheld"),
        ("cookie", "", "withheld"),
        ("reason", "", "reason"),
        ("gzip", "--compressed", "encoded"),
        ("te-gzip", "", "encoded"),
        ("te-gzip-close", "", "encoded"),
        ("split", "", "cut"),
        ("late", "", "cut"),
    ] {
        let out = exec(&client, &id, &curl(how, extra)).await;
        let text = format!("{}{}", out["stdout"], out["stderr"]);
        assert_eq!(leaked(&text), None, "{how}: the value came back: {text}");
        match expect {
            "withheld" => assert!(
                text.contains("502") && text.contains("withheld"),
                "{how}: {text}"
            ),
            "encoded" => assert!(text.contains("gzip-encoded"), "{how}: {text}"),
            // The status line is not carried; the response is.
            "reason" => assert!(
                text.contains("200") && text.contains("exit=0"),
                "{how}: {text}"
            ),
            _ => assert!(
                !text.contains("exit=0"),
                "{how}: the body was not cut: {text}"
            ),
        }
    }
    // A late hit: what came before it did arrive, so the cut is where the value began.
    let late = exec(
        &client,
        &id,
        "curl -sS -H \"Authorization: $API_KEY\" 'https://api.example.test/reflect?how=late' | wc -c",
    )
    .await;
    let got: usize = late["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!((150_000..=200_005).contains(&got), "{late}");
    // Stored by one request, handed back to the next, which carries no stand-in.
    let store = sh(&client, &id, &curl("store", "")).await;
    assert!(
        store.contains("stored") && store.contains("exit=0"),
        "{store}"
    );
    let log = exec(
        &client,
        &id,
        "curl -sS 'https://api.example.test/reflect?how=log'; echo \" exit=$?\"",
    )
    .await;
    let text = log.to_string();
    assert_eq!(leaked(&text), None, "{text}");
    assert!(!text.contains("exit=0"), "{text}");
    // Headers servers mirror (Origin into CORS, Referer into a page) never carry the value:
    // the stand-in there is refused before anything goes out.
    for (how, header) in [("cors", "Origin"), ("referer", "Referer")] {
        let out = exec(
            &client,
            &id,
            &format!(
                "curl -sS -i -H \"{header}: $API_KEY\" 'https://api.example.test/reflect?how={how}'"
            ),
        )
        .await;
        let text = out.to_string();
        assert_eq!(leaked(&text), None, "{how}: {text}");
        assert!(
            text.contains("403") && text.contains("only be sent in the Authorization header"),
            "{how}: {text}"
        );
    }
    // TRACE echoes the request: refused outright, in any case the server would.
    for method in ["TRACE", "TRACK"] {
        let out = exec(
            &client,
            &id,
            &format!("curl -sS -i -X {method} -H \"Authorization: $API_KEY\" https://api.example.test/reflect"),
        )
        .await;
        let text = out.to_string();
        assert_eq!(leaked(&text), None, "{method}: {text}");
        assert!(text.contains("405"), "{method}: {text}");
    }
    // CONNECT (a tunnel through the secret's host, which would carry the stand-in on as the
    // value): refused as well (405; to another authority it is a 421 before that), written by
    // hand since curl will not send one to an https URL.
    let connect = py_out(
        &client,
        &id,
        r#"
import os, socket, ssl
ctx = ssl.create_default_context()
with socket.create_connection(("api.example.test", 443)) as raw:
    with ctx.wrap_socket(raw, server_hostname="api.example.test") as s:
        s.sendall(("CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n"
                   "Authorization: " + os.environ["API_KEY"] + "\r\n\r\n").encode())
        print(s.recv(4096).decode(errors="replace").split("\r\n")[0])
"#,
    )
    .await;
    assert_eq!(leaked(&connect), None, "CONNECT: {connect}");
    assert!(connect.contains("405"), "CONNECT: {connect}");
    assert!(
        !net.recorded().iter().any(|r| r["method"] == "CONNECT"),
        "a CONNECT reached the host"
    );
    // A clean request still works, and the value did go out where it should.
    assert_eq!(
        sh(
            &client,
            &id,
            "curl -sS -H \"Authorization: $API_KEY\" https://api.example.test/record"
        )
        .await,
        "recorded\n"
    );
    assert_eq!(
        net.recorded().last().unwrap()["headers"]["authorization"],
        format!("Bearer {VALUE}")
    );
    // The log names each reflection as a leak attempt, and never the value.
    let log = ok(
        &client,
        "sandbox_network_log",
        json!({"sandbox_id": id, "limit": 200}),
    )
    .await;
    let text = log.to_string();
    assert!(
        text.contains("carried the value of secret example in its body")
            && text.contains("carried the value of secret example in its headers"),
        "{log:#}"
    );
    assert_eq!(leaked(&text), None);
}

/// One authority per request: whatever a request names besides its TLS connection's host, over
/// HTTP/1.1 or HTTP/2, it is refused before it goes out, and the value reaches no other site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fronted_to_another_host_never_leave() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net).await;
    let (client, id) = bound_sandbox(
        &engine,
        "example",
        json!({"hosts": ["api.example.test"], "value": VALUE}),
    )
    .await;
    let before = net.recorded().len();
    // Raw HTTP/1.1 over TLS to api.example.test, each request fronted a different way.
    let answers = py_out(
        &client,
        &id,
        r#"
import os, socket, ssl
key = os.environ["API_KEY"]
ctx = ssl.create_default_context()
def ask(head):
    s = ctx.wrap_socket(socket.create_connection(("api.example.test", 443), timeout=10), server_hostname="api.example.test")
    s.sendall((head + "Authorization: Bearer " + key + "\r\nConnection: close\r\n\r\n").encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data.decode(errors="replace").split("\r\n")[0]
for head in [
    "GET https://api.example.test/record HTTP/1.1\r\nHost: other.test\r\n",
    "GET https://other.test/record HTTP/1.1\r\nHost: api.example.test\r\n",
    "GET /record HTTP/1.1\r\nHost: api.example.test\r\nHost: other.test\r\n",
    "GET /record HTTP/1.1\r\nHost: other.test\r\nHost: api.example.test\r\n",
    "GET /record HTTP/1.1\r\nHost: api.example.test\r\nX-Forwarded-Host: other.test\r\n",
    "GET /record HTTP/1.1\r\nHost: api.example.test\r\nForwarded: host=other.test\r\n",
    "GET /record HTTP/1.1\r\nHost: api.example.test:444\r\n",
]:
    print(ask(head))
"#,
    )
    .await;
    let lines: Vec<&str> = answers.lines().collect();
    assert_eq!(lines.len(), 7, "{answers}");
    for line in lines {
        assert!(line.contains("421"), "{answers}");
    }
    // HTTP/2: `:authority` names the secret's host, a `host` header another one. (HPACK
    // literals without Huffman coding, written by hand: nothing but the standard library.)
    let h2 = py_out(
        &client,
        &id,
        r#"
import os, socket, ssl, struct
key = os.environ["API_KEY"]
ctx = ssl.create_default_context()
ctx.set_alpn_protocols(["h2"])
s = ctx.wrap_socket(socket.create_connection(("api.example.test", 443), timeout=10), server_hostname="api.example.test")
assert s.selected_alpn_protocol() == "h2", s.selected_alpn_protocol()
def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload
def literal(name, value):
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
block = b"".join(literal(k, v) for k, v in [
    (":method", "GET"), (":scheme", "https"), (":path", "/record"),
    (":authority", "api.example.test"), ("host", "other.test"),
    ("authorization", "Bearer " + key),
])
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") + frame(1, 5, 1, block))
body = b""
def read(n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data
try:
    while True:
        head = read(9)
        length = int.from_bytes(head[:3], "big")
        kind, flags, stream = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7fffffff
        payload = read(length)
        if kind == 4 and not flags & 1:
            s.sendall(frame(4, 1, 0, b""))
        if kind == 0 and stream == 1:
            body += payload
            if flags & 1:
                break
        if kind in (3, 7):
            break
except (EOFError, OSError):
    pass
print(body.decode(errors="replace"))
"#,
    )
    .await;
    assert!(h2.contains("domain fronting"), "{h2}");
    // Through curl as well, over both protocols.
    for flag in ["--http1.1", "--http2"] {
        let out = exec(
            &client,
            &id,
            &format!(
                "curl -sS {flag} -H 'Host: other.test' -H \"Authorization: Bearer $API_KEY\" https://api.example.test/record"
            ),
        )
        .await;
        assert!(
            out["stdout"].as_str().unwrap().contains("domain fronting"),
            "{flag}: {out}"
        );
    }
    // Nothing reached the test internet's server, under any name.
    let seen = net.recorded();
    assert_eq!(seen.len(), before, "{:?}", &seen[before..]);
    let log = ok(&client, "sandbox_network_log", json!({"sandbox_id": id})).await;
    assert!(log.to_string().contains("domain fronting"), "{log:#}");
}
