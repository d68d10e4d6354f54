//! MCP servers hosted in sandboxes: a third-party server (`npx -y …`, `uvx …`, a binary) runs in
//! a sandbox of its own, with its stdio attached over the engine API (`attach_process`).
//!
//! [`run`] wraps one server for a client on this process's stdin/stdout (`sandbox-mcp run`);
//! [`http`] serves registered ones over Streamable HTTP, one sandbox per MCP session, through
//! [`relay`], which speaks JSON-RPC to the server's stdio.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub mod attach;
pub mod http;
pub mod mount;
pub mod relay;
pub mod run;
pub mod session;
pub mod sessions;
pub mod upstream;

/// Metadata label naming the hosted server a sandbox runs.
pub const SERVER_LABEL: &str = "sandbox-mcp.server";

/// How a server is started: what runs, in which template, with which network, secrets and
/// environment. The network is closed but for `allow_out`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerSpec {
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// Environment variable → secret name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A `ShapeRequest`: `vcpus`, `memory_mb`, `disk_mb`, `max_pids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The server speaks Streamable HTTP itself, on this port of its sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_port: Option<u16>,
    /// Its MCP path, with `http_port` (`/mcp` when omitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_path: Option<String>,
}

impl ServerSpec {
    /// The `CreateSandboxRequest` of a sandbox for server `name`: labelled with it, and with every
    /// address closed but `allow_out`.
    pub fn sandbox_request(&self, name: &str) -> Value {
        let mut request = json!({
            "metadata": {SERVER_LABEL: name},
            "network": {
                "allow_out": self.allow_out,
                "deny_out": ["0.0.0.0/0", "::/0"],
            },
        });
        if sandbox_name_ok(name) {
            request["name"] = json!(format!("mcp {name}"));
        }
        if let Some(t) = &self.template {
            request["template"] = json!(t);
        }
        if !self.secrets.is_empty() {
            request["secrets"] = json!(self.secrets);
        }
        if !self.env.is_empty() {
            request["env_vars"] = json!(self.env);
        }
        if let Some(shape) = &self.shape {
            request["shape"] = shape.clone();
        }
        request
    }

    /// Creates the sandbox server `name` runs in (see [`Self::sandbox_request`]); its id.
    pub async fn create_sandbox(
        &self,
        client: &sandbox_mcp_api::Client,
        name: &str,
    ) -> Result<String, String> {
        let request: sandbox_mcp_api::types::CreateSandboxRequest =
            serde_json::from_value(self.sandbox_request(name))
                .map_err(|e| format!("invalid server settings: {e}"))?;
        let sandbox = client
            .create_sandbox()
            .body(request)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "cannot create a sandbox for server {name}: {}",
                    crate::call::error_text(e)
                )
            })?;
        Ok(sandbox.into_inner().id.to_string())
    }

    /// The `AttachRequest` that starts the server.
    pub fn attach_request(&self) -> Value {
        let mut request = json!({ "command": self.command });
        if let Some(cwd) = &self.cwd {
            request["cwd"] = json!(cwd);
        }
        request
    }
}

/// Whether `mcp NAME` is a valid sandbox name.
fn sandbox_name_ok(name: &str) -> bool {
    name.len() <= 59
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '.' | '_' | '-'))
}

/// A name for a server from its command: the package or program, without version or scope
/// (`npx -y @modelcontextprotocol/server-memory@1` → `server-memory`).
pub fn name_from_command(command: &[String]) -> String {
    let runners = [
        "npx", "uvx", "pipx", "bunx", "node", "python", "python3", "deno",
    ];
    let word = command
        .iter()
        .skip_while(|w| runners.contains(&w.as_str()) || w.starts_with('-'))
        .find(|w| !w.starts_with('-'))
        .or(command.first())
        .map(String::as_str)
        .unwrap_or("server");
    let base = word.rsplit('/').next().unwrap_or(word);
    let base = base.split('@').find(|s| !s.is_empty()).unwrap_or(base);
    let cleaned: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    if cleaned.is_empty() {
        "server".into()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_package() {
        let n =
            |c: &[&str]| name_from_command(&c.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            n(&["npx", "-y", "@modelcontextprotocol/server-memory@1.2"]),
            "server-memory"
        );
        assert_eq!(n(&["uvx", "mcp-server-time"]), "mcp-server-time");
        assert_eq!(
            n(&["/usr/local/bin/mcp-server-fetch", "--x"]),
            "mcp-server-fetch"
        );
        assert_eq!(n(&["python3", "-m", "mod"]), "mod");
    }

    #[test]
    fn a_server_s_sandbox_is_closed_but_for_its_allowlist() {
        let spec = ServerSpec {
            command: vec!["x".into()],
            allow_out: vec!["api.github.com".into()],
            secrets: [("TOKEN".to_string(), "github".to_string())].into(),
            ..Default::default()
        };
        let r = spec.sandbox_request("github");
        assert_eq!(r["network"]["deny_out"], json!(["0.0.0.0/0", "::/0"]));
        assert_eq!(r["network"]["allow_out"], json!(["api.github.com"]));
        assert_eq!(r["secrets"]["TOKEN"], "github");
        assert_eq!(r["metadata"][SERVER_LABEL], "github");
    }
}
