//! The protocol: each supported version, stateless 2026 requests, oversized, garbage and malformed
//! lines, each answered and none breaking the session.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Server;

#[test]
fn initializes_with_each_supported_protocol_version() {
    for version in ["2025-06-18", "2025-11-25"] {
        let mut server = Server::offline();
        let response = server.initialize(version);
        let result = &response["result"];
        assert_eq!(result["protocolVersion"], version);
        assert_eq!(result["serverInfo"]["name"], "sandbox-mcp");
        assert_eq!(result["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(result["capabilities"]["tools"].is_object());
        assert!(server.close_and_wait().success());
    }
}

#[test]
fn answers_stateless_2026_requests_with_inline_metadata() {
    let mut server = Server::offline();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    server.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
    );
    let discover = server.recv();
    let versions = discover["result"]["supportedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(versions.contains(&json!("2026-07-28")), "{discover}");
    assert!(versions.contains(&json!("2025-06-18")), "{discover}");
    server.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}}),
    );
    let list = server.recv();
    assert_eq!(
        list["result"]["tools"].as_array().map(Vec::len),
        Some(sandbox_mcp_server::tooldefs::registry().tools.len()),
        "{list}"
    );
    assert!(server.close_and_wait().success());
}

#[test]
fn oversized_line_gets_an_error_not_a_stall() {
    let mut server = Server::offline();
    server.initialize("2025-06-18");
    // 20 MB of arguments: over the 16 MiB line limit.
    let huge = "x".repeat(20 * 1024 * 1024);
    let request = json!({"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {
        "name": "sandbox_files_write", "arguments": {"sandbox_id": "sbx_0000000000000000000000000a", "path": "f", "content": huge}}});
    let started = Instant::now();
    server.send(request);
    let response = server.recv();
    assert_eq!(response["id"], 42);
    let message = response["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("request too large") && message.contains("16 MiB"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    // Oversized garbage, with no id to read, is answered too: with `"id": null`.
    let mut garbage = vec![b'x'; 17 * 1024 * 1024];
    garbage.push(b'\n');
    server.send_raw(&garbage);
    let response = server.recv();
    assert!(
        response.as_object().unwrap().contains_key("id") && response["id"].is_null(),
        "{response}"
    );
    assert_eq!(response["error"]["code"], -32600, "{response}");
    // Still serving.
    server.send(json!({"jsonrpc": "2.0", "id": 43, "method": "tools/list"}));
    assert_eq!(server.recv()["id"], 43);
    assert!(server.close_and_wait().success());
}

#[test]
fn garbage_and_malformed_requests_do_not_break_the_session() {
    let mut server = Server::offline();
    server.initialize("2025-06-18");
    server.send_raw(b"this is not json\n\n   \n");
    // The garbage line gets a parse error (blank lines are not messages and get nothing).
    let response = server.recv();
    assert_eq!(response["error"]["code"], -32700, "{response}");
    assert!(response["id"].is_null(), "{response}");
    server.send(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": 12}}));
    let response = server.recv();
    assert_eq!(response["id"], 7);
    assert!(response["error"].is_object(), "{response}");
    server.send(json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "sandbox_list", "arguments": {"status": "sleeping"}}}));
    let response = server.recv();
    assert_eq!(response["result"]["isError"], true, "{response}");
    server.send(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}));
    assert_eq!(server.recv()["id"], 9);
    assert!(server.close_and_wait().success());
}

/// JSON-RPC 2.0 wants exactly one answer per request line: a parse error for a line that is not
/// JSON, Invalid Request for one that is not a request; none for a notification. Each answer
/// carries the request's id whenever a valid one can be read (even from a line broken after it:
/// a lone surrogate escape, invalid UTF-8), else `"id": null`. Clients wait forever otherwise:
/// they match answers to their requests by id.
#[test]
fn every_malformed_line_gets_one_answer_for_its_id() {
    let mut server = Server::offline();
    server.initialize("2025-06-18");
    let cases: [(&[u8], i64, Value); 20] = [
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#, -32700, json!(1)),
        (b"garbage", -32700, Value::Null),
        (br#""\udcff""#, -32700, Value::Null),
        (
            br#"{"jsonrpc":"2.0","id":2,"method":"ping","x":"\udcff"}"#,
            -32700,
            json!(2),
        ),
        (
            br#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"sandbox_files_read","arguments":{"sandbox_id":"sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa","path":"/root/\udcff"}}}"#,
            -32700,
            json!("c"),
        ),
        (
            br#"{"jsonrpc":"2.0","id":"d","method":"tools/call","params":{"name":"sandbox_list","arguments":{"\ud800x":1}}}"#,
            -32700,
            json!("d"),
        ),
        (b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"ping\",\"x\":\"\xff\"}", -32700, json!(11)),
        (b"\xff\xfe{}", -32700, Value::Null),
        (b"1", -32600, Value::Null),
        (br#""a string""#, -32600, Value::Null),
        (b"[]", -32600, Value::Null),
        (b"{}", -32600, Value::Null),
        (br#"{"id":3,"method":"ping"}"#, -32600, json!(3)),
        (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":6.5,"method":"ping"}"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":8,"method":5}"#, -32600, json!(8)),
        (br#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#, -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":5}"#, -32600, json!(5)),
        (
            br#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":5}}"#,
            -32602,
            json!(12),
        ),
    ];
    for (line, code, id) in cases {
        let mut bytes = line.to_vec();
        bytes.push(b'\n');
        server.send_raw(&bytes);
        let answer = server.recv();
        let shown = String::from_utf8_lossy(line);
        assert_eq!(answer["error"]["code"], code, "{shown}: {answer}");
        let object = answer.as_object().unwrap();
        assert!(object.contains_key("id"), "{shown}: {answer}");
        assert_eq!(answer["id"], id, "{shown}: {answer}");
        assert_eq!(object.len(), 3, "jsonrpc, id and error only: {answer}");
    }
    // Invalid params of a valid request keep its id; a notification, even unknown, gets nothing:
    // the next answer is the ping's.
    server.send(json!({"jsonrpc": "2.0", "id": 9, "method": "ping", "params": 5}));
    let answer = server.recv();
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (json!(9), json!(-32602))
    );
    // Without an id, unstructured params make an invalid Request object, not a notification.
    server.send(json!({"jsonrpc": "2.0", "method": "ping", "params": 5}));
    let answer = server.recv();
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (Value::Null, json!(-32600)),
        "{answer}"
    );
    assert!(answer.as_object().unwrap().contains_key("id"));
    server.send(json!({"jsonrpc": "2.0", "method": "no/such/notification"}));
    server.send(json!({"jsonrpc": "2.0", "id": 10, "method": "ping"}));
    assert_eq!(server.recv()["id"], 10);
    assert!(server.close_and_wait().success());
}
