//! Named volumes and workspaces, through MCP as a model uses them: shared and persistent
//! volumes, read-only mounts, quotas, tenants; a workspace over a real git repository whose
//! folder never changes until the operator applies the sandbox's patch; and a sandbox that
//! tries to reach outside either.

mod hostile;
mod shared;
mod workspace;

use serde_json::{Value, json};

use crate::common::{McpClient, ok, sh};

/// Creates a sandbox mounting `volumes` (`[{"name", "path", "read_only"}]`); returns its id.
pub async fn create_with(client: &McpClient, volumes: Value) -> String {
    let s = ok(client, "sandbox_create", json!({ "volumes": volumes })).await;
    s["id"].as_str().unwrap().to_string()
}

/// Makes `count` snapshots of sandbox `id` that keep its volumes, once `ready` (a shell test,
/// polled for 20 s at most) holds in it: the copies must race what another sandbox does to the
/// volume, not that sandbox's start-up. Returns their ids.
pub async fn keep_volumes_once(
    client: &McpClient,
    id: &str,
    ready: &str,
    count: usize,
) -> Vec<String> {
    sh(
        client,
        id,
        &format!("for i in $(seq 2000); do {ready} && exit 0; sleep 0.01; done; exit 1"),
    )
    .await;
    let mut snaps = Vec::new();
    for _ in 0..count {
        let snap = ok(
            client,
            "sandbox_snapshot_create",
            json!({"sandbox_id": id, "volumes": true}),
        )
        .await;
        snaps.push(snap["id"].as_str().unwrap().to_string());
    }
    snaps
}
