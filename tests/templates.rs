//! Templates: builds from steps (cache, failures, limits), captures, shapes, delete rules,
//! restarts, the default template and warm pools — through the MCP tools a model uses.
//!
//! By theme: [`builds`] (steps, cache, failures, limits), [`lifecycle`] (captures, shapes,
//! restarts, the default template, warm pools), [`images`] (importing OCI images, by the API and
//! the CLI), [`hostile_images`] (broken and hostile images refused) and [`tenants`] (templates
//! belong to their tenant).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{McpClient, TestEngine, ok};

mod builds;
mod hostile_images;
mod images;
mod lifecycle;
mod tenants;

/// Polls sandbox_template_list until `name` is no longer building.
pub async fn wait_built(client: &McpClient, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = ok(client, "sandbox_template_list", json!({})).await;
        let t = list["templates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not listed: {list}"));
        if t["status"] != "building" {
            return t;
        }
        assert!(Instant::now() < deadline, "{name} still building: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn layers(engine: &TestEngine) -> usize {
    std::fs::read_dir(engine.data_dir().join("layers"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The sandboxes on disk, the engine's own (build, pool) included.
fn sandbox_dirs(engine: &TestEngine) -> Vec<String> {
    std::fs::read_dir(engine.data_dir().join("sandboxes"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with("sbx_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `check` holds of the sandboxes on disk.
async fn wait_dirs(engine: &TestEngine, what: &str, check: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check(&sandbox_dirs(engine)) {
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}",
            sandbox_dirs(engine)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn sandbox_from(client: &McpClient, template: &str) -> String {
    ok(client, "sandbox_create", json!({"template": template})).await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn import(engine: &TestEngine, name: &str, archive: Vec<u8>) -> (u16, Value) {
    let r = engine
        .http()
        .put(format!("{}/v1/templates/{name}/image", engine.url))
        .bearer_auth(crate::common::KEY)
        .header("content-type", "application/octet-stream")
        .body(archive)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The built-in templates (`base`, and `desktop` on a host with Xvfb), then `others`: how
/// template lists come, base first and the rest by name.
fn with_builtins(others: &[&str]) -> Vec<String> {
    let mut names = vec!["base".to_string()];
    let mut rest: Vec<String> = others.iter().map(|s| s.to_string()).collect();
    if std::path::Path::new("/usr/bin/Xvfb").exists() {
        rest.push("desktop".into());
    }
    rest.sort();
    names.extend(rest);
    names
}
