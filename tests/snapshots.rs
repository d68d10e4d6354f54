//! Everything the model sees, pinned: a change to the spec or a tool-def shows up here as a
//! reviewed diff (`cargo insta review`), and CI (CI=true) fails on an unreviewed one.

use crate::common::TestEngine;

pub fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings
}

#[tokio::test]
async fn tools_list_as_the_model_receives_it() {
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let tools = client.list_all_tools().await.unwrap();
    let value = serde_json::json!({ "tools": tools });
    settings().bind(|| insta::assert_json_snapshot!("tools_list", value));
}

#[test]
fn operation_inventory() {
    let registry = sandbox_mcp::tooldefs::registry();
    let value = serde_json::json!({
        "api": format!("{} {}", registry.api_title, registry.api_version),
        "operations": registry.inventory,
        "toolsets": registry.toolsets,
    });
    settings().bind(|| insta::assert_json_snapshot!("operation_inventory", value));
}

#[test]
fn output_caps_per_tool() {
    let registry = sandbox_mcp::tooldefs::registry();
    let caps: std::collections::BTreeMap<_, _> = registry
        .tools
        .iter()
        .filter(|t| !t.caps.is_empty() || t.timeout_arg_ms.is_some())
        .map(|t| {
            (
                t.name.clone(),
                serde_json::json!({"caps": t.caps, "timeout_arg_ms": t.timeout_arg_ms}),
            )
        })
        .collect();
    settings().bind(|| insta::assert_json_snapshot!("output_caps", caps));
}
