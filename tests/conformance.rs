//! The engine implements the spec: every operation in openapi/ is routed, answers success with a
//! body matching its documented schema, and fails in the documented Error shape.

use serde_json::{Value, json};

use crate::codegen::spec::Spec;
use crate::common::{KEY, TestEngine};
use crate::require_sandboxes;

const SPEC_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/sandbox-mcp.json");

/// One request per operation, in an order that works (kill last).
fn request_for(op: &str, id: &str) -> Option<(&'static str, String, Option<Value>)> {
    let s = format!("/v1/sandboxes/{id}");
    Some(match op {
        "health" => ("GET", "/v1/health".into(), None),
        "list_templates" => ("GET", "/v1/templates".into(), None),
        "create_sandbox" => (
            "POST",
            "/v1/sandboxes".into(),
            Some(json!({"name": "conformance", "metadata": {"k": "v"}})),
        ),
        "list_sandboxes" => (
            "GET",
            "/v1/sandboxes?status=running&metadata=k%3Dv".into(),
            None,
        ),
        "get_sandbox" => ("GET", s, None),
        "update_sandbox" => ("PATCH", s, Some(json!({"metadata": {"k": "w"}}))),
        "exec_command" => (
            "POST",
            format!("{s}/exec"),
            Some(json!({"command": "echo hi; echo oops >&2; exit 3"})),
        ),
        "write_file" => (
            "PUT",
            format!("{s}/files"),
            Some(json!({"path": "/root/c/f.txt", "content": "aGk=", "encoding": "base64"})),
        ),
        "read_file" => ("GET", format!("{s}/files?path=/root/c/f.txt"), None),
        "list_files" => ("GET", format!("{s}/files/list?path=/root/c"), None),
        "download_dir" => ("GET", format!("{s}/files/download?path=/root/c"), None),
        "move_file" => (
            "POST",
            format!("{s}/files/move"),
            Some(json!({"from": "/root/c/f.txt", "to": "/root/c/g.txt"})),
        ),
        "delete_file" => (
            "DELETE",
            format!("{s}/files?path=/root/c&recursive=true"),
            None,
        ),
        "get_sandbox_metrics" => ("GET", format!("{s}/metrics"), None),
        "pause_sandbox" => ("POST", format!("{s}/pause"), None),
        "resume_sandbox" => ("POST", format!("{s}/resume"), None),
        "kill_sandbox" => ("DELETE", s, None),
        _ => return None,
    })
}

const ORDER: [&str; 17] = [
    "health",
    "list_templates",
    "create_sandbox",
    "list_sandboxes",
    "get_sandbox",
    "update_sandbox",
    "exec_command",
    "write_file",
    "read_file",
    "list_files",
    "download_dir",
    "move_file",
    "delete_file",
    "get_sandbox_metrics",
    "pause_sandbox",
    "resume_sandbox",
    "kill_sandbox",
];

#[tokio::test]
async fn every_operation_is_routed_and_answers_its_documented_shapes() {
    require_sandboxes!();
    let spec = Spec::parse(
        "openapi/sandbox-mcp.json",
        &std::fs::read_to_string(SPEC_FILE).unwrap(),
    )
    .unwrap();
    for op in &spec.operations {
        assert!(
            ORDER.contains(&op.id.as_str()),
            "no conformance request for `{}`: add one to tests/conformance.rs",
            op.id
        );
    }
    assert_eq!(ORDER.len(), spec.operations.len());
    let error_schema = spec
        .to_json_schema(&json!({"$ref": "#/components/schemas/Error"}), 0)
        .unwrap();
    let engine = TestEngine::start().await;
    let http = engine.http();
    let mut id = String::from("sbx_0000000000000000000000000a");
    for op_id in ORDER {
        let op = spec.operation(op_id).unwrap();
        let (method, path, body) = request_for(op_id, &id).unwrap();
        assert_eq!(method, op.method, "{op_id}");
        let send = |auth: bool, path: String| {
            let mut req = http.request(method.parse().unwrap(), format!("{}{path}", engine.url));
            if auth {
                req = req.bearer_auth(KEY);
            }
            if let Some(b) = &body {
                req = req.json(b);
            }
            req.send()
        };
        // Unauthenticated: 401 in the Error shape.
        let resp = send(false, path.clone()).await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{op_id}");
        let v: Value = resp.json().await.unwrap();
        assert!(
            sandbox_mcp::jsonschema::validate(&error_schema, &v).is_empty(),
            "{op_id}: {v}"
        );
        // An unknown sandbox: 404 in the Error shape.
        if path.contains("/v1/sandboxes/sbx_") {
            let unknown = path.replace(&id, "sbx_0000000000000000000000000b");
            let resp = send(true, unknown).await.unwrap();
            assert_eq!(resp.status().as_u16(), 404, "{op_id}");
            let v: Value = resp.json().await.unwrap();
            assert!(
                sandbox_mcp::jsonschema::validate(&error_schema, &v).is_empty(),
                "{op_id}: {v}"
            );
            assert_eq!(v["error_code"], "not_found");
        }
        // The real call: success, with a body that fits the documented schema exactly.
        let resp = send(true, path.clone()).await.unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert!(
            (200..300).contains(&status),
            "{op_id} {method} {path}: {status} {v}"
        );
        let violations = sandbox_mcp::jsonschema::validate(&op.response_schema, &v);
        assert!(violations.is_empty(), "{op_id}: {violations:?}\n{v}");
        if op_id == "create_sandbox" {
            assert_eq!(status, 201);
            id = v["id"].as_str().unwrap().to_string();
        }
        if op_id == "exec_command" {
            assert_eq!(v["exit_code"], 3);
            assert_eq!(v["stdout"], "hi\n");
            assert_eq!(v["stderr"], "oops\n");
        }
        if op_id == "read_file" {
            assert_eq!(v["content"], "hi");
        }
    }
}

#[test]
fn the_spec_is_openapi_3_0_with_an_operation_id_everywhere() {
    let text = std::fs::read_to_string(SPEC_FILE).unwrap();
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert!(raw["openapi"].as_str().unwrap().starts_with("3.0."));
    let spec = Spec::parse("openapi/sandbox-mcp.json", &text).unwrap();
    assert_eq!(spec.operations.len(), 17);
    for (path, item) in raw["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["operationId"].is_string(), "{method} {path}");
            assert!(
                op["responses"]["4XX"].is_object() && op["responses"]["5XX"].is_object(),
                "{method} {path} must document its errors"
            );
        }
    }
}
