//! Everything the model sees, pinned: a change to the spec or a tool-def shows up here as a
//! reviewed diff (`cargo insta review`), and CI (CI=true) fails on an unreviewed one. Each tool
//! has a snapshot of its own (`snapshots/tools/<name>.snap`), so a diff names the tool that
//! changed; `tools_list.snap` pins the order.

use crate::common::TestEngine;

const SNAPSHOTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots");

pub fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(SNAPSHOTS);
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings
}

/// One snapshot per tool in `snapshots/<dir>/`, every difference reported (not only the first),
/// and no snapshot left over for a tool that is gone.
fn assert_each_tool(dir: &str, tools: &[serde_json::Value]) {
    let path = format!("{SNAPSHOTS}/{dir}");
    let mut settings = settings();
    settings.set_snapshot_path(&path);
    let mut changed = Vec::new();
    for tool in tools {
        let name = tool["name"].as_str().unwrap().to_string();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            settings.bind(|| insta::assert_json_snapshot!(name.clone(), tool));
        }));
        if outcome.is_err() {
            changed.push(name);
        }
    }
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    let stale: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let tool = file.strip_suffix(".snap")?.to_string();
            (!names.contains(&tool.as_str())).then_some(file)
        })
        .collect();
    assert!(
        changed.is_empty(),
        "{dir}: these tools changed: {changed:?} (review with cargo insta review)"
    );
    assert!(
        stale.is_empty(),
        "{dir}: snapshots of tools that no longer exist: {stale:?}; delete them"
    );
}

#[tokio::test]
async fn tools_list_as_the_model_receives_it() {
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let tools = client.list_all_tools().await.unwrap();
    let tools: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    assert_each_tool("tools", &tools);
    let order: Vec<&serde_json::Value> = tools.iter().map(|t| &t["name"]).collect();
    settings().bind(|| insta::assert_json_snapshot!("tools_list", order));
}

/// `core` as the model receives it: the same tools, minus the arguments `core` hides
/// (`hide_in`) — `sandbox_create` without `name`, `env_vars`, `shape`, `volumes`.
#[tokio::test]
async fn tools_list_of_the_core_toolset() {
    let engine = TestEngine::start().await;
    let client = engine
        .mcp_with(
            sandbox_mcp_server::server::ServerSettings::default(),
            "core",
        )
        .await;
    let tools = client.list_all_tools().await.unwrap();
    let tools: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    let create = tools
        .iter()
        .find(|t| t["name"] == "sandbox_create")
        .unwrap();
    for hidden in ["name", "env_vars", "shape", "volumes"] {
        assert!(
            create["inputSchema"]["properties"].get(hidden).is_none(),
            "{hidden}"
        );
    }
    let full = sandbox_mcp_server::tooldefs::registry()
        .tool("sandbox_create")
        .unwrap();
    for shown in ["name", "env_vars", "shape", "volumes"] {
        assert!(
            full.input_schema["properties"].get(shown).is_some(),
            "{shown}"
        );
    }
    assert_each_tool("tools_core", &tools);
    // Sent anyway, a hidden argument is refused as unknown, as the model was told.
    let refused = crate::common::call(
        &client,
        "sandbox_create",
        serde_json::json!({"volumes": [{"name": "x", "path": "/x"}]}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        crate::common::text(&refused).contains("volumes"),
        "{refused:?}"
    );
}

#[test]
fn operation_inventory() {
    let registry = sandbox_mcp_server::tooldefs::registry();
    let value = serde_json::json!({
        "api": format!("{} {}", registry.api_title, registry.api_version),
        "operations": registry.inventory,
        "toolsets": registry.toolsets,
    });
    settings().bind(|| insta::assert_json_snapshot!("operation_inventory", value));
}

#[test]
fn output_caps_per_tool() {
    let registry = sandbox_mcp_server::tooldefs::registry();
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

/// The `session` profile (`--session-sandbox`): the same tools minus sandbox lifecycle, with
/// sandbox_id filled in by the server.
#[test]
fn tools_list_of_the_session_profile() {
    let registry = sandbox_mcp_server::tooldefs::registry();
    let tools: Vec<serde_json::Value> = registry
        .select_in(Some("session"), "all")
        .unwrap()
        .into_iter()
        .map(|t| serde_json::to_value(sandbox_mcp_server::server::to_mcp_tool(t)).unwrap())
        .collect();
    assert_each_tool("tools_session", &tools);
    let profile = &registry.profiles["session"];
    let value = serde_json::json!({
        "description": profile.description,
        "session_arg": profile.session_arg,
        "tools": tools.iter().map(|t| &t["name"]).collect::<Vec<_>>(),
    });
    settings().bind(|| insta::assert_json_snapshot!("tools_list_session", value));
}

/// What each toolset costs in context: the whole tools/list, and the part most clients put in
/// front of the model (name, description, input schema; output schemas are for validating
/// results). Tokens are estimated as bytes / 4. README.md quotes these figures.
#[test]
fn toolset_context_cost() {
    let registry = sandbox_mcp_server::tooldefs::registry();
    let mut costs = serde_json::Map::new();
    let mut sets: Vec<String> = vec!["all".into()];
    sets.extend(registry.toolsets.keys().cloned());
    for set in sets {
        let tools: Vec<_> = registry
            .select(&set)
            .unwrap()
            .into_iter()
            .map(sandbox_mcp_server::server::to_mcp_tool)
            .collect();
        let bytes = serde_json::to_vec(&serde_json::json!({"tools": tools}))
            .unwrap()
            .len();
        let prompt: Vec<_> = tools
            .iter()
            .map(|t| serde_json::json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        let prompt_bytes = serde_json::to_vec(&prompt).unwrap().len();
        costs.insert(
            set,
            serde_json::json!({
                "tools": tools.len(),
                "tools_list_bytes": bytes,
                "tools_list_tokens": bytes / 4,
                "model_facing_bytes": prompt_bytes,
                "model_facing_tokens": prompt_bytes / 4,
            }),
        );
    }
    // The budgets every feature must fit in: what the model carries in its context all session.
    for (set, budget) in [("core", 1_500), ("all", 8_000)] {
        let tokens = costs[set]["model_facing_tokens"].as_u64().unwrap();
        assert!(
            tokens <= budget,
            "the `{set}` toolset costs {tokens} model-facing tokens, over its budget of {budget}: shorten descriptions or hide arguments in tool-defs/"
        );
    }
    settings().bind(|| insta::assert_json_snapshot!("toolset_costs", costs));
}
