//! The MCP server in-process, driven by a real rmcp client, against a real engine.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{TestEngine, call, create, err, exec, ok, sh, text};
use crate::require_sandboxes;

mod limits;

#[tokio::test]
async fn tools_list_carries_annotations_and_schemas() {
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(
        tools.len(),
        sandbox_mcp_server::tooldefs::registry().tools.len()
    );
    let get = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    for read_only in [
        "sandbox_list",
        "sandbox_info",
        "sandbox_metrics",
        "sandbox_template_list",
        "sandbox_snapshot_list",
        "sandbox_files_read",
        "sandbox_files_list",
    ] {
        let a = get(read_only).annotations.clone().unwrap();
        assert_eq!(a.read_only_hint, Some(true), "{read_only}");
    }
    let kill = get("sandbox_kill").annotations.clone().unwrap();
    assert_eq!(kill.destructive_hint, Some(true));
    assert_eq!(kill.read_only_hint, Some(false));
    // Forks and merges make or replace sandboxes each time; restores and merges destroy files.
    for (tool, destructive, idempotent) in [
        ("sandbox_fork", false, false),
        ("sandbox_merge_into", true, false),
        ("sandbox_snapshot_restore", true, true),
        ("sandbox_snapshot_create", false, false),
    ] {
        let a = get(tool).annotations.clone().unwrap();
        assert_eq!(a.destructive_hint, Some(destructive), "{tool}");
        assert_eq!(a.idempotent_hint, Some(idempotent), "{tool}");
    }
    for tool in &tools {
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            tool.name
        );
        assert_eq!(
            tool.input_schema.get("additionalProperties"),
            Some(&json!(false))
        );
        assert!(
            !serde_json::to_string(&*tool.input_schema)
                .unwrap()
                .contains("$ref"),
            "{} has a $ref",
            tool.name
        );
        let out = tool.output_schema.clone().unwrap();
        assert_eq!(out.get("type"), Some(&json!("object")));
        assert!(tool.title.is_some() && tool.description.as_deref().unwrap_or("").len() > 40);
        // Tools about the engine as a whole rather than one sandbox.
        if ![
            "sandbox_create",
            "sandbox_list",
            "sandbox_template_list",
            "secret_list",
            "sandbox_template_create",
            "sandbox_template_delete",
            "computer_create",
            "volume_create",
            "volume_list",
            "volume_delete",
        ]
        .contains(&tool.name.as_ref())
        {
            let required = tool.input_schema["required"].as_array().unwrap();
            assert!(
                required.contains(&json!("sandbox_id")),
                "{} must take sandbox_id",
                tool.name
            );
        }
    }
    // Constraints from the spec survive into the schema the model sees.
    let exec_schema = &get("sandbox_exec").input_schema;
    assert_eq!(exec_schema["properties"]["timeout_ms"]["maximum"], 600000);
    assert_eq!(exec_schema["properties"]["command"]["maxLength"], 65536);
    assert_eq!(
        exec_schema["properties"]["sandbox_id"]["pattern"],
        "^sbx_[0-9a-hjkmnp-tv-z]{26}$"
    );
}

#[tokio::test]
async fn toolsets_select_a_subset() {
    let engine = TestEngine::start().await;
    let client = engine.mcp_with(Default::default(), "core").await;
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "sandbox_create",
            "sandbox_exec",
            "sandbox_files_list",
            "sandbox_files_read",
            "sandbox_files_write",
            "sandbox_kill"
        ]
    );
}

#[tokio::test]
async fn unknown_tool_is_a_protocol_error() {
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let Value::Object(args) = json!({}) else {
        unreachable!()
    };
    let result = client
        .call_tool(rmcp::model::CallToolRequestParams::new("sandbox_teleport").with_arguments(args))
        .await;
    let e = result.expect_err("unknown tools are JSON-RPC errors");
    assert!(
        e.to_string().contains("unknown tool `sandbox_teleport`"),
        "{e}"
    );
}
use serde_json::Value;

#[tokio::test]
async fn bad_arguments_name_the_argument_and_the_fix() {
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = "sbx_0000000000000000000000000a";
    let cases = [
        (
            "sandbox_exec",
            json!({"sandbox_id": id}),
            "missing required argument `command`",
        ),
        (
            "sandbox_exec",
            json!({"sandbox_id": id, "command": 5}),
            "argument `command` must be a string, got integer 5",
        ),
        (
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "ls", "bogus": true}),
            "unknown argument `bogus`",
        ),
        (
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "ls", "timeout_ms": 700000}),
            "the maximum is 600000",
        ),
        (
            "sandbox_exec",
            json!({"sandbox_id": "nope", "command": "ls"}),
            "From sandbox_list",
        ),
        (
            "sandbox_exec",
            json!({"sandbox_id": "sbx_AAAAAAAAAAAAAAAAAAAAAAAAAA", "command": "ls"}),
            "does not match the pattern",
        ),
        (
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "x".repeat(70_000)}),
            "is 70000 characters long; the limit is 65536",
        ),
        (
            "sandbox_files_read",
            json!({"sandbox_id": id, "path": "/x", "encoding": "hex"}),
            "must be one of \"utf8\", \"base64\"",
        ),
        (
            "sandbox_create",
            json!({"metadata": {"k": 1}}),
            "argument `metadata.k` must be a string",
        ),
        (
            "sandbox_create",
            json!({"timeout_seconds": -1}),
            "the minimum is 1",
        ),
    ];
    for (tool, args, expected) in cases {
        let message = err(&client, tool, args.clone()).await;
        assert!(message.contains(expected), "{tool}({args}): {message}");
        assert!(
            message.starts_with(&format!("Invalid arguments for {tool}")),
            "{message}"
        );
        assert!(message.len() < 600, "message floods the context: {message}");
    }
}

#[tokio::test]
async fn unknown_sandbox_gets_the_tool_def_message() {
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = "sbx_0000000000000000000000000a";
    let message = err(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(
        message,
        format!(
            "Sandbox {id} not found: it was killed, timed out, or never existed. Call sandbox_list to see your sandboxes, or sandbox_create to make a new one."
        )
    );
    let message = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "true"}),
    )
    .await;
    assert!(message.contains("Call sandbox_list"), "{message}");
}

#[tokio::test]
async fn unreachable_control_plane_is_an_actionable_tool_error() {
    // A port nothing listens on: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let backend =
        sandbox_mcp_server::backend::Backend::remote(&format!("http://127.0.0.1:{port}"), None)
            .unwrap();
    let client = crate::common::mcp_for(backend, Default::default(), "all").await;
    let started = Instant::now();
    let message = err(&client, "sandbox_list", json!({})).await;
    assert!(
        message.contains("unreachable") && message.contains("SANDBOX_MCP_URL"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server is still up.
    assert_eq!(
        client.list_all_tools().await.unwrap().len(),
        sandbox_mcp_server::tooldefs::registry().tools.len()
    );
}

#[tokio::test]
async fn control_plane_errors_keep_their_code_and_never_leak_the_key() {
    // A test-only stub: the real engine cannot be made to answer 503 on demand.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error_code": "unavailable", "message": "engine draining", "request_id": "r1"})),
        )
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    let backend = sandbox_mcp_server::backend::Backend::remote(
        &url,
        Some(sandbox_mcp_api::ApiKey::new("super-secret-key")),
    )
    .unwrap();
    let client = crate::common::mcp_for(backend, Default::default(), "all").await;
    let message = err(&client, "sandbox_list", json!({})).await;
    assert!(
        message.contains("unavailable") && message.contains("engine draining"),
        "{message}"
    );
    assert!(!message.contains("super-secret-key"));
}

#[tokio::test]
async fn agent_session_create_exec_files_caps_timeout_pause_kill() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;

    assert!(
        sh(&client, &id, "python3 --version")
            .await
            .starts_with("Python 3")
    );

    let written = ok(&client, "sandbox_files_write", json!({
        "sandbox_id": id, "path": "proj/main.py", "content": "import sys\nprint('hello from', sys.argv[1])\n"
    })).await;
    assert_eq!(written["path"], "/root/proj/main.py");
    assert_eq!(
        sh(&client, &id, "cd proj && python3 main.py sandbox").await,
        "hello from sandbox\n"
    );

    let read = ok(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/root/proj/main.py"}),
    )
    .await;
    assert_eq!(read["encoding"], "utf8");
    assert!(read["content"].as_str().unwrap().contains("hello from"));
    let listing = ok(
        &client,
        "sandbox_files_list",
        json!({"sandbox_id": id, "path": "proj"}),
    )
    .await;
    assert_eq!(listing["entries"][0]["name"], "main.py");
    assert_eq!(listing["entries"][0]["type"], "file");

    // Output is capped with exact counts.
    let big = exec(&client, &id, "python3 -c \"print('x' * 200000)\"").await;
    assert_eq!(big["stdout_bytes"], 200001);
    assert_eq!(big["truncated"], true);
    assert!(big["stdout"].as_str().unwrap().len() <= 32 * 1024);

    // A timeout kills the command and says so.
    let started = Instant::now();
    let slow = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "sleep 30", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(slow["timed_out"], true);
    assert!(started.elapsed() < Duration::from_secs(5));

    // Pause, then exec resumes transparently.
    let paused = ok(&client, "sandbox_pause", json!({"sandbox_id": id})).await;
    assert_eq!(paused["status"], "paused");
    assert_eq!(sh(&client, &id, "echo back").await, "back\n");
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "running");

    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    let message = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "true"}),
    )
    .await;
    assert!(message.contains("not found"), "{message}");
}

#[tokio::test]
async fn files_read_refuses_large_files_with_a_slice_hint() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "head -c 2000000 /dev/zero > /root/big.bin").await;
    let message = err(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/root/big.bin"}),
    )
    .await;
    assert!(
        message.contains("2000000 bytes") && message.contains("head -c"),
        "{message}"
    );
    // Binary content comes back as base64, with the encoding reported.
    sh(&client, &id, "printf '\\377\\376' > /root/bin.dat").await;
    let r = ok(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/root/bin.dat"}),
    )
    .await;
    assert_eq!(r["encoding"], "base64");
    assert_eq!(r["content"], "//4=");
    // Invalid base64 on write is a clear error.
    let message = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "x", "content": "!!!", "encoding": "base64"}),
    )
    .await;
    assert!(message.contains("not valid base64"), "{message}");
}

#[tokio::test]
async fn cancelled_call_returns_promptly_and_kills_the_command() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let Value::Object(args) = json!({"sandbox_id": id, "command": "sleep 77", "timeout_ms": 60000})
    else {
        unreachable!()
    };
    let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        rmcp::model::CallToolRequestParams::new("sandbox_exec").with_arguments(args),
    ));
    let handle = client
        .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(sh(&client, &id, "ps -eo args").await.contains("sleep 77"));
    handle
        .cancel(Some("user changed their mind".into()))
        .await
        .unwrap();
    // The command dies with the call.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if !sh(&client, &id, "ps -eo args").await.contains("sleep 77") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled command is still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn structured_content_matches_the_output_schema() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let tools = client.list_all_tools().await.unwrap();
    let schema = |name: &str| {
        serde_json::Value::Object(
            (*tools
                .iter()
                .find(|t| t.name == name)
                .unwrap()
                .output_schema
                .clone()
                .unwrap())
            .clone(),
        )
    };
    let id = create(&client).await;
    let results = [
        (
            "sandbox_info",
            ok(&client, "sandbox_info", json!({"sandbox_id": id})).await,
        ),
        (
            "sandbox_exec",
            exec(&client, &id, "echo hi; echo err >&2").await,
        ),
        (
            "sandbox_metrics",
            ok(&client, "sandbox_metrics", json!({"sandbox_id": id})).await,
        ),
        ("sandbox_list", ok(&client, "sandbox_list", json!({})).await),
        (
            "sandbox_template_list",
            ok(&client, "sandbox_template_list", json!({})).await,
        ),
        (
            "sandbox_files_list",
            ok(
                &client,
                "sandbox_files_list",
                json!({"sandbox_id": id, "path": "/"}),
            )
            .await,
        ),
    ];
    for (name, value) in results {
        let violations = sandbox_mcp_codegen::jsonschema::validate(&schema(name), &value);
        assert!(violations.is_empty(), "{name}: {violations:?} in {value}");
    }
    let r = call(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo text"}),
    )
    .await;
    assert!(
        text(&r).contains("\"stdout\":\"text\\n\""),
        "the text block carries the same JSON"
    );
}

#[tokio::test]
async fn nulls_for_optional_arguments_and_whole_floats_are_accepted() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    // What models and generic clients really send: `null` for "not given", `30.0` for 30.
    let created = ok(
        &client,
        "sandbox_create",
        json!({"name": null, "template": null, "metadata": null, "timeout_seconds": 600.0}),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["template"], "base");
    let out = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "pwd", "cwd": null, "env": null, "timeout_ms": 5000.0}),
    )
    .await;
    assert_eq!(out["stdout"], "/root\n");
    // A required argument given as null is still an error that names it.
    let m = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": null}),
    )
    .await;
    assert!(m.contains("command"), "{m}");
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
}

/// A download near the 10 MiB limit is one MCP message a client accepts (rmcp-based clients drop
/// any over 16 MiB and wait forever): the zip is whole in `structuredContent`, and the text copy
/// names its size instead of repeating it.
#[tokio::test]
async fn a_download_near_the_limit_fits_in_one_client_message() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(
        &client,
        &id,
        "mkdir /root/big && for i in 1 2 3 4 5 6 7 8 9; do head -c 1000000 /dev/urandom > /root/big/$i; done",
    )
    .await;
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        call(
            &client,
            "sandbox_files_download_dir",
            json!({"sandbox_id": id, "path": "/root/big"}),
        ),
    )
    .await
    .expect("the result never reached the client");
    let structured = result.structured_content.clone().unwrap();
    assert_eq!(structured["files"], 9);
    let zip = structured["zip_base64"].as_str().unwrap();
    assert!(zip.len() > 12_000_000, "{}", zip.len());
    let copy = text(&result);
    assert!(
        copy.len() < 1024 * 1024,
        "the text copy repeats the zip: {} bytes",
        copy.len()
    );
    assert!(copy.contains("left out of this text copy"), "{copy}");
}
