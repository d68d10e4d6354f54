//! The engine implements the spec: every operation in openapi/ is routed, answers success with a
//! body matching its documented schema, and fails in the documented Error shape.

use serde_json::{Value, json};

use crate::common::{KEY, TestEngine};
use crate::require_sandboxes;
use sandbox_mcp_codegen::spec::Spec;

const SPEC_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/sandbox-mcp.json");

/// One request per operation, in an order that works (kill last).
const REQUESTS: &[(&str, &str, &str, Option<&str>)] = &[
    ("health", "GET", "/v1/health", None),
    ("list_templates", "GET", "/v1/templates", None),
    (
        "create_template",
        "POST",
        "/v1/templates",
        Some(r#"{"name": "conformance", "steps": [{"run": "true"}, {"env": {"A": "b"}}]}"#),
    ),
    ("get_template", "GET", "/v1/templates/conformance", None),
    // The body is a `docker save` archive the test builds (see below).
    (
        "import_template",
        "PUT",
        "/v1/templates/imported/image",
        None,
    ),
    (
        "create_volume",
        "POST",
        "/v1/volumes",
        Some(r#"{"name": "conformance"}"#),
    ),
    ("list_volumes", "GET", "/v1/volumes", None),
    ("delete_volume", "DELETE", "/v1/volumes/conformance", None),
    (
        "create_sandbox",
        "POST",
        "/v1/sandboxes",
        Some(
            r#"{"name": "conformance", "metadata": {"k": "v"}, "volumes": [{"name": "ws", "path": "/ws"}]}"#,
        ),
    ),
    (
        "list_sandboxes",
        "GET",
        "/v1/sandboxes?status=running&metadata=k%3Dv",
        None,
    ),
    ("get_sandbox", "GET", "{s}", None),
    (
        "update_sandbox",
        "PATCH",
        "{s}",
        Some(r#"{"metadata": {"k": "w"}}"#),
    ),
    (
        "exec_command",
        "POST",
        "{s}/exec",
        Some(r#"{"command": "echo hi; echo oops >&2; exit 3"}"#),
    ),
    (
        "exec_command_stream",
        "POST",
        "{s}/exec/stream",
        Some(r#"{"command": "echo a; sleep 0.1; echo b"}"#),
    ),
    (
        "run_code",
        "POST",
        "{s}/code",
        Some(r#"{"code": "x = 6 * 7\nx"}"#),
    ),
    (
        "run_code_stream",
        "POST",
        "{s}/code/stream",
        Some(r#"{"code": "print('streamed'); x + 1"}"#),
    ),
    (
        "create_code_context",
        "POST",
        "{s}/contexts",
        Some(r#"{"language": "node"}"#),
    ),
    ("list_code_contexts", "GET", "{s}/contexts", None),
    ("delete_code_context", "DELETE", "{s}/contexts/ctx_1", None),
    ("get_job", "GET", "{s}/jobs/job_1?since_offset=0", None),
    ("kill_job", "DELETE", "{s}/jobs/job_1", None),
    // A WebSocket: the real call is a handshake and a process (see below).
    ("attach_process", "GET", "{s}/attach", None),
    (
        "write_file",
        "PUT",
        "{s}/files",
        Some(r#"{"path": "/root/c/f.txt", "content": "aGk=", "encoding": "base64"}"#),
    ),
    ("read_file", "GET", "{s}/files?path=/root/c/f.txt", None),
    ("list_files", "GET", "{s}/files/list?path=/root/c", None),
    (
        "download_dir",
        "GET",
        "{s}/files/download?path=/root/c",
        None,
    ),
    (
        "move_file",
        "POST",
        "{s}/files/move",
        Some(r#"{"from": "/root/c/f.txt", "to": "/root/c/g.txt"}"#),
    ),
    (
        "delete_file",
        "DELETE",
        "{s}/files?path=/root/c&recursive=true",
        None,
    ),
    (
        "workspace_changes",
        "GET",
        "{s}/workspaces/ws/changes",
        None,
    ),
    ("apply_workspace", "POST", "{s}/workspaces/ws/apply", None),
    ("get_sandbox_metrics", "GET", "{s}/metrics", None),
    ("get_network_log", "GET", "{s}/network/log?limit=5", None),
    (
        "create_preview",
        "POST",
        "{s}/previews",
        Some(r#"{"port": 3000, "expires_in": 600}"#),
    ),
    ("list_previews", "GET", "{s}/previews", None),
    ("delete_preview", "DELETE", "{s}/previews/3000", None),
    (
        "set_secret",
        "PUT",
        "/v1/secrets/conformance",
        Some(r#"{"hosts": ["api.example.test"], "value": "v"}"#),
    ),
    ("list_secrets", "GET", "/v1/secrets", None),
    (
        "attach_secret",
        "POST",
        "{s}/secrets",
        Some(r#"{"env": "API_KEY", "secret": "conformance"}"#),
    ),
    ("detach_secret", "DELETE", "{s}/secrets/API_KEY", None),
    ("delete_secret", "DELETE", "/v1/secrets/conformance", None),
    (
        "put_server",
        "PUT",
        "/v1/servers/conformance",
        Some(
            r#"{"command": ["mcp-server-time"], "allow_out": ["pypi.org"], "env_vars": {"A": "b"}, "warm": 0}"#,
        ),
    ),
    ("list_servers", "GET", "/v1/servers", None),
    ("get_server", "GET", "/v1/servers/conformance", None),
    ("delete_server", "DELETE", "/v1/servers/conformance", None),
    (
        "create_snapshot",
        "POST",
        "{s}/snapshots",
        Some(r#"{"name": "conformance"}"#),
    ),
    ("list_snapshots", "GET", "{s}/snapshots", None),
    (
        "diff_sandbox",
        "POST",
        "{s}/diff",
        Some(r#"{"against": "{snap}", "path": "/root"}"#),
    ),
    (
        "restore_snapshot",
        "POST",
        "{s}/snapshots/{snap}/restore",
        None,
    ),
    ("fork_sandbox", "POST", "{s}/fork", Some(r#"{"count": 1}"#)),
    (
        "merge_sandbox",
        "POST",
        "{s}/merge",
        Some(r#"{"source_id": "{child}"}"#),
    ),
    ("delete_snapshot", "DELETE", "{s}/snapshots/{snap}", None),
    (
        "create_computer",
        "POST",
        "/v1/computers",
        Some(r#"{"resolution": "640x480"}"#),
    ),
    (
        "take_screenshot",
        "GET",
        "{d}/desktop/screenshot?scale=0.5",
        None,
    ),
    (
        "computer_action",
        "POST",
        "{d}/desktop/actions",
        Some(r#"{"action": "click", "x": 10, "y": 10, "screenshot": true}"#),
    ),
    (
        "stop_computer",
        "POST",
        "{d}/desktop/stop",
        Some(r#"{"kill": true}"#),
    ),
    ("pause_sandbox", "POST", "{s}/pause", None),
    ("resume_sandbox", "POST", "{s}/resume", None),
    ("kill_sandbox", "DELETE", "{s}", None),
    ("delete_template", "DELETE", "/v1/templates/imported", None),
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
            REQUESTS.iter().any(|r| r.0 == op.id),
            "no conformance request for `{}`: add one to tests/conformance.rs",
            op.id
        );
    }
    assert_eq!(REQUESTS.len(), spec.operations.len());
    let error_schema = spec
        .to_json_schema(&json!({"$ref": "#/components/schemas/Error"}), 0)
        .unwrap();
    // A workspace for the sandbox to mount, and change.
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("file.txt"), "old\n").unwrap();
    let spec_arg = format!("ws={}", folder.path().display());
    let engine = TestEngine::start_with(|c| {
        c.workspaces = vec![sandbox_mcp_model::config::Workspace::parse(&spec_arg).unwrap()];
    })
    .await;
    let http = engine.http();
    let mut id = String::from("sbx_0000000000000000000000000a");
    // A snapshot, a forked child and a desktop, once made.
    let (mut snap, mut child) = (String::new(), String::new());
    let mut desktop = String::from("sbx_0000000000000000000000000d");
    for (op_id, method, template, body) in REQUESTS {
        let op = spec.operation(op_id).unwrap();
        assert_eq!(*method, op.method, "{op_id}");
        let fill = |t: &str| {
            t.replace("{s}", &format!("/v1/sandboxes/{id}"))
                .replace("{d}", &format!("/v1/sandboxes/{desktop}"))
                .replace("{snap}", &snap)
                .replace("{child}", &child)
        };
        let path = fill(template);
        let body: Option<Value> = body.map(|b| serde_json::from_str(&fill(b)).unwrap());
        // `tenant`: the operator's key narrowed to that tenant, which owns none of these.
        let send_as = |auth: bool, tenant: Option<&str>, path: String| {
            let mut req = http.request(method.parse().unwrap(), format!("{}{path}", engine.url));
            if auth {
                req = req.bearer_auth(KEY);
            }
            if let Some(t) = tenant {
                req = req.header("x-sandbox-tenant", t);
            }
            if let Some(b) = &body {
                req = req.json(b);
            }
            if *op_id == "import_template" {
                let image = crate::images::docker_save(
                    &[crate::images::layer(&[("hello", b"hi", 0o644)], &[])],
                    json!({}),
                );
                req = req
                    .header("content-type", "application/octet-stream")
                    .body(image);
            }
            req.send()
        };
        let send = |auth: bool, path: String| send_as(auth, None, path);
        // Unauthenticated: 401 in the Error shape.
        let resp = send(false, path.clone()).await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{op_id}");
        let v: Value = resp.json().await.unwrap();
        assert!(
            sandbox_mcp_codegen::jsonschema::validate(&error_schema, &v).is_empty(),
            "{op_id}: {v}"
        );
        // An unknown sandbox: 404 in the Error shape.
        if path.contains("/v1/sandboxes/sbx_") {
            let unknown = path
                .replace(&id, "sbx_0000000000000000000000000b")
                .replace(&desktop, "sbx_0000000000000000000000000b");
            let resp = send(true, unknown.clone()).await.unwrap();
            assert_eq!(resp.status().as_u16(), 404, "{op_id}");
            let v: Value = resp.json().await.unwrap();
            assert!(
                sandbox_mcp_codegen::jsonschema::validate(&error_schema, &v).is_empty(),
                "{op_id}: {v}"
            );
            assert_eq!(v["error_code"], "not_found");
            // The same sandbox as another tenant: answered exactly as an unknown one is to that
            // tenant (404; 403 where the operation is the operator's alone), the ids aside, and
            // before anything of it is read or done: the real call below finds it as it was.
            let as_intruder = |path: String| async {
                let r = send_as(true, Some("intruder"), path).await.unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap();
                let message = v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .replace(&id, "ID")
                    .replace(&desktop, "ID")
                    .replace("sbx_0000000000000000000000000b", "ID");
                (status, v["error_code"].clone(), message)
            };
            let theirs = as_intruder(path.clone()).await;
            assert!(matches!(theirs.0, 403 | 404), "{op_id}: {theirs:?}");
            assert_eq!(theirs, as_intruder(unknown.clone()).await, "{op_id}");
        }
        if *op_id == "get_job" {
            // A job to look at (and then kill).
            let r = http
                .post(format!("{}/v1/sandboxes/{id}/exec", engine.url))
                .bearer_auth(KEY)
                .json(&json!({"command": "echo job; sleep 30", "background": true}))
                .send()
                .await
                .unwrap();
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["job_id"], "job_1", "{v}");
        }
        if op.websocket {
            // Without a handshake: refused in the Error shape. With one: the process's stdio.
            let resp = send(true, path.clone()).await.unwrap();
            assert_eq!(resp.status().as_u16(), 400, "{op_id}");
            let v: Value = resp.json().await.unwrap();
            assert!(
                sandbox_mcp_codegen::jsonschema::validate(&error_schema, &v).is_empty(),
                "{v}"
            );
            attach_echo(&engine, &id).await;
            continue;
        }
        // The real call: success, with a body that fits the documented schema exactly.
        let resp = send(true, path.clone()).await.unwrap();
        let status = resp.status().as_u16();
        if op.streaming {
            assert_eq!(status, 200, "{op_id}");
            assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
            let text = resp.text().await.unwrap();
            let events: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            for e in &events {
                let violations = sandbox_mcp_codegen::jsonschema::validate(&op.response_schema, e);
                assert!(violations.is_empty(), "{op_id}: {violations:?}\n{e}");
            }
            let last = events.last().unwrap();
            assert_eq!(last["type"], "result", "{op_id}: {text}");
            assert!(
                events[..events.len() - 1]
                    .iter()
                    .all(|e| e["type"] == "output")
            );
            // The result is shaped like the JSON operation's response.
            let mirror = op_id.trim_end_matches("_stream");
            let schema = &spec.operation(mirror).unwrap().response_schema;
            let violations = sandbox_mcp_codegen::jsonschema::validate(schema, &last["result"]);
            assert!(violations.is_empty(), "{op_id}: {violations:?}\n{last}");
            continue;
        }
        let v: Value = resp.json().await.unwrap();
        assert!(
            (200..300).contains(&status),
            "{op_id} {method} {path}: {status} {v}"
        );
        let violations = sandbox_mcp_codegen::jsonschema::validate(&op.response_schema, &v);
        assert!(violations.is_empty(), "{op_id}: {violations:?}\n{v}");
        match *op_id {
            "create_sandbox" => {
                assert_eq!(status, 201);
                id = v["id"].as_str().unwrap().to_string();
            }
            "create_snapshot" => snap = v["id"].as_str().unwrap().to_string(),
            "create_computer" => {
                assert_eq!(status, 201);
                assert_eq!(v["desktop"]["width"], 640);
                desktop = v["id"].as_str().unwrap().to_string();
            }
            "take_screenshot" => assert_eq!(
                (&v["width"], &v["screen_width"]),
                (&json!(320), &json!(640))
            ),
            "computer_action" => assert_eq!(v["screenshot"]["height"], 480),
            "stop_computer" => assert_eq!(v["status"], "killed"),
            "fork_sandbox" => child = v["ids"][0].as_str().unwrap().to_string(),
            "exec_command" => {
                assert_eq!(v["exit_code"], 3);
                assert_eq!(v["stdout"], "hi\n");
                assert_eq!(v["stderr"], "oops\n");
            }
            "read_file" => assert_eq!(v["content"], "hi"),
            "run_code" => assert_eq!(v["result"], "42"),
            "get_job" => assert_eq!(v["status"], "running"),
            "create_code_context" => assert_eq!(v["context_id"], "ctx_1"),
            _ => {}
        }
    }
}

/// `attach_process` through the generated client: `echo` attached, its output and exit.
async fn attach_echo(engine: &TestEngine, id: &str) {
    let request: sandbox_mcp_api::types::AttachRequest = serde_json::from_value(
        json!({"command": ["sh", "-c", "read line; echo got $line; echo err >&2"]}),
    )
    .unwrap();
    let attached = sandbox_mcp_server::hosted::attach::attach(&engine.client(), id, &request)
        .await
        .unwrap();
    assert!(attached.job_id.starts_with("job_"), "{}", attached.job_id);
    let (mut input, mut output) = (attached.input, attached.output);
    input.write(b"conformance\n").await.unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = loop {
        match output.next().await.unwrap().unwrap() {
            sandbox_mcp_protocol::Chunk::Stdout(d) => out.extend(d),
            sandbox_mcp_protocol::Chunk::Stderr(d) => err.extend(d),
            sandbox_mcp_protocol::Chunk::Exit { exit_code, .. } => break exit_code,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(String::from_utf8_lossy(&out), "got conformance\n");
    assert_eq!(String::from_utf8_lossy(&err), "err\n");
    assert_eq!(exit, Some(0));
}

#[test]
fn the_spec_is_openapi_3_0_with_an_operation_id_everywhere() {
    let text = std::fs::read_to_string(SPEC_FILE).unwrap();
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert!(raw["openapi"].as_str().unwrap().starts_with("3.0."));
    let spec = Spec::parse("openapi/sandbox-mcp.json", &text).unwrap();
    assert_eq!(spec.operations.len(), REQUESTS.len());
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
