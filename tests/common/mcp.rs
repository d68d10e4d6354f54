//! An rmcp client and the real MCP server in this process, over an in-memory pipe; and tool
//! calls through it (results, errors, sandboxes, commands, snapshots).

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::{SandboxMcp, ServerSettings};
use sandbox_mcp_server::tooldefs::registry;

pub type McpClient = RunningService<RoleClient, ()>;

/// An `initialize` request as one JSON-RPC line (without its newline), for a server on stdio.
pub const INITIALIZE_LINE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

/// An rmcp client and our server connected through an in-memory duplex pipe.
pub async fn mcp_for(backend: Backend, settings: ServerSettings, tools: &str) -> McpClient {
    mcp_with_handler(backend, settings, tools, ()).await
}

/// Like [`mcp_for`], with a client handler that sees notifications (progress, say).
pub async fn mcp_with_handler<H: rmcp::ClientHandler>(
    backend: Backend,
    settings: ServerSettings,
    tools: &str,
    handler: H,
) -> RunningService<RoleClient, H> {
    let server = SandboxMcp::new(backend, registry().select(tools).unwrap(), settings);
    let (client_io, server_io) = tokio::io::duplex(16 * 1024 * 1024);
    tokio::spawn(async move {
        let (r, w) = tokio::io::split(server_io);
        if let Ok(running) = server.serve((r, w)).await {
            let _ = running.waiting().await;
        }
    });
    let (r, w) = tokio::io::split(client_io);
    handler.serve((r, w)).await.unwrap()
}

/// Calls a tool and returns the result (tool errors included; protocol errors panic).
pub async fn call(client: &McpClient, name: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("arguments must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(map))
        .await
        .unwrap_or_else(|e| panic!("{name} failed at the protocol level: {e}"))
}

/// The structured content of a successful call.
pub async fn ok(client: &McpClient, name: &str, args: Value) -> Value {
    let result = call(client, name, args.clone()).await;
    assert_ne!(
        result.is_error,
        Some(true),
        "{name}({args}) failed: {}",
        text(&result)
    );
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// The text of an error result (asserting it is one).
pub async fn err(client: &McpClient, name: &str, args: Value) -> String {
    let result = call(client, name, args.clone()).await;
    assert_eq!(
        result.is_error,
        Some(true),
        "{name}({args}) should have failed: {}",
        text(&result)
    );
    text(&result)
}

pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| match c {
            rmcp::model::ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Creates a sandbox through MCP and returns its id.
pub async fn create(client: &McpClient) -> String {
    let sandbox = ok(client, "sandbox_create", json!({})).await;
    sandbox["id"].as_str().unwrap().to_string()
}

/// Runs a command through MCP and returns the exec result.
pub async fn exec(client: &McpClient, id: &str, command: &str) -> Value {
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": command}),
    )
    .await
}

/// Snapshots a sandbox and restores that snapshot at once (every process stops).
pub async fn snapshot_and_restore(client: &McpClient, id: &str) {
    let snap = ok(client, "sandbox_snapshot_create", json!({"sandbox_id": id})).await;
    ok(
        client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id, "snapshot_id": snap["id"]}),
    )
    .await;
}

/// stdout of a command that must succeed.
pub async fn sh(client: &McpClient, id: &str, command: &str) -> String {
    let r = exec(client, id, command).await;
    assert_eq!(r["exit_code"], 0, "`{command}` failed: {r}");
    r["stdout"].as_str().unwrap().to_string()
}
