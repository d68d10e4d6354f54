//! Fuzz targets' bodies, shared by the cargo-fuzz harness (`tests/fuzz/fuzz_targets/`) and the
//! stable replay test (`tests/fuzz_replay.rs`), both of which include this file. Each takes
//! arbitrary bytes and panics when a property breaks.
// A failed property is the point of a fuzz target: panicking on it is how it reports. Its
// functions are `pub` for the harness, a separate crate.
#![allow(clippy::expect_used, dead_code, unreachable_pub)]

use std::path::Component;
use std::sync::OnceLock;

use serde_json::Value;

use sandbox_mcp_server::args::Args;
use sandbox_mcp_server::call::CallFailure;
use sandbox_mcp_server::tooldefs::registry;

/// A client of a closed port: every request the mapping produces is built in full, then fails
/// to connect at once.
fn closed_client() -> &'static (tokio::runtime::Runtime, sandbox_mcp_api::Client) {
    static CLIENT: OnceLock<(tokio::runtime::Runtime, sandbox_mcp_api::Client)> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let client =
            sandbox_mcp_api::connect(&format!("http://127.0.0.1:{port}"), None).expect("client");
        (rt, client)
    })
}

/// Tool-argument mapping. Input: one byte choosing the tool, then the arguments as JSON.
///
/// Properties: validation never panics; arguments it accepts are accepted by the generated
/// typed client too (the request is built and sent, so the only failure is the closed port) —
/// the schema the model sees is never looser than the API; the failure message for any
/// arguments stays short.
pub fn tool_args(data: &[u8]) {
    let Some((&which, json)) = data.split_first() else {
        return;
    };
    let tools = &registry().tools;
    let def = &tools[which as usize % tools.len()];
    let Ok(value) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let raw = match value {
        Value::Object(map) => Some(map),
        Value::Null => None,
        _ => return,
    };
    match Args::prepare(def, raw) {
        Err(problems) => {
            assert!(
                !problems.is_empty(),
                "{}: rejected without a reason",
                def.name
            );
            let failure = CallFailure::InvalidArgs(problems.join("; "));
            let message = sandbox_mcp_server::shape::failure_message(def, None, &failure);
            assert!(!message.is_empty());
        }
        Ok(args) => {
            let (rt, client) = closed_client();
            let outcome = rt.block_on(sandbox_mcp_server::dispatch::dispatch(
                client, &def.name, &args,
            ));
            match outcome {
                Err(CallFailure::Unreachable(_)) => {}
                other => panic!(
                    "{}: arguments passed validation but the typed client said {other:?}; args: {}",
                    def.name,
                    String::from_utf8_lossy(json)
                ),
            }
            let failure = CallFailure::Unreachable("x".into());
            let message = sandbox_mcp_server::shape::failure_message(def, Some(&args), &failure);
            assert!(
                message.len() < 2048,
                "{}: message of {} bytes",
                def.name,
                message.len()
            );
        }
    }
}

/// Path handling in the sandbox's agent. Input: the path as UTF-8.
///
/// Properties: never panics; a resolved path is absolute and normalized (no `.` or `..`
/// components); a relative path resolves under /root unless it climbs out with `..`, and
/// climbing never goes above `/`.
pub fn paths(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(resolved) = sandbox_mcp_agent::files::resolve(path) else {
        return;
    };
    assert!(resolved.is_absolute(), "{path:?} → {resolved:?}");
    for c in resolved.components() {
        assert!(
            matches!(c, Component::RootDir | Component::Normal(_)),
            "{path:?} → {resolved:?} keeps {c:?}"
        );
    }
    if !path.starts_with('/') && !path.split('/').any(|c| c == "..") {
        assert!(resolved.starts_with("/root"), "{path:?} → {resolved:?}");
    }
}

/// The stdio framing's id scanner (used to answer an oversized request with its own id).
/// Input: bytes of a would-be JSON-RPC message.
///
/// Properties: never panics; on any JSON object with a string or number `id`, serialized
/// canonically, it finds exactly that id.
pub fn id_scanner(data: &[u8]) {
    let mut scanner = sandbox_mcp_server::jsonrpc::IdScanner::default();
    scanner.feed(data);
    let _ = scanner.id();
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Some(id) = map.get("id").filter(|v| v.is_string() || v.is_number()) else {
        return;
    };
    if id.to_string().len() > 200 {
        return; // the scanner keeps ids up to 256 bytes of JSON
    }
    let canonical = serde_json::to_vec(&Value::Object(map.clone())).expect("serializes");
    let mut scanner = sandbox_mcp_server::jsonrpc::IdScanner::default();
    scanner.feed(&canonical);
    assert_eq!(
        scanner.id().as_ref(),
        Some(id),
        "in {}",
        String::from_utf8_lossy(&canonical)
    );
}

// The parsers of untrusted bytes, a module each (the paths are from this file's directory, for
// both files that include it).
#[path = "properties/frames.rs"]
pub mod frames;
#[path = "properties/image.rs"]
pub mod image;
#[path = "properties/traffic.rs"]
pub mod traffic;
