//! Named volumes and workspaces, through MCP as a model uses them: shared and persistent
//! volumes, read-only mounts, quotas, tenants; a workspace over a real git repository whose
//! folder never changes until the operator applies the sandbox's patch; and a sandbox that
//! tries to reach outside either.

mod hostile;
mod shared;
mod workspace;

use serde_json::{Value, json};

use crate::common::{McpClient, ok};

/// Creates a sandbox mounting `volumes` (`[{"name", "path", "read_only"}]`); returns its id.
pub async fn create_with(client: &McpClient, volumes: Value) -> String {
    let s = ok(client, "sandbox_create", json!({ "volumes": volumes })).await;
    s["id"].as_str().unwrap().to_string()
}
