//! Sandbox networking against a test internet (`testnet`): real DNS, HTTP, HTTPS and TCP on
//! addresses of a namespace the test makes, through the real engine and the real MCP server.
//! The engine asks the test internet's resolver and the operator opens only its server's
//! address (`--egress-allow`), so the host end of the veth stays "this host's own address".
//!
//! By theme: [`egress`] (open egress, allowlists, pip from the test index), [`forbidden`] (what no
//! rule opens, and root in the sandbox that cannot change it), [`rules`] (bad rules and flags are
//! refused with what to write), [`load`] (a connection flood, throughput) and [`unprivileged`]
//! (an unprivileged engine filters the same way).

use serde_json::{Value, json};

use crate::common::*;
use crate::testnet::TestNet;

mod egress;
mod forbidden;
mod load;
mod rules;
mod unprivileged;

/// An engine whose sandboxes resolve through `net` and may reach its server.
async fn engine_for(
    net: &TestNet,
    adjust: impl FnOnce(&mut sandbox_mcp_model::config::EngineConfig),
) -> TestEngine {
    let dns = net.dns;
    let allow = format!("{}/32", net.net_ip);
    TestEngine::start_with(move |c| {
        c.network.dns_upstream = vec![dns];
        c.network.egress_allow = vec![allow];
        adjust(c);
    })
    .await
}

/// Runs Python in the sandbox; returns stdout (the script may fail: its output says how).
async fn py(client: &McpClient, id: &str, code: &str) -> String {
    let r = ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": format!("python3 - <<'EOF'\n{code}\nEOF"), "timeout_ms": 60000}),
    )
    .await;
    format!(
        "{}{}",
        r["stdout"].as_str().unwrap_or(""),
        r["stderr"].as_str().unwrap_or("")
    )
}

/// A fetch from inside the sandbox: `STATUS BODY` or `ERROR why`.
const FETCH: &str = r#"
import sys, urllib.request, urllib.error
def fetch(url, host=None):
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return f"{r.status} {r.read().decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode(errors='replace')}"
    except Exception as e:
        return f"ERROR {e}"
"#;

/// A strict allowlist: pypi.test and nothing else.
fn pypi_only() -> Value {
    json!({"allow_out": ["pypi.test"], "deny_out": ["0.0.0.0/0"]})
}

/// Puts the test internet's CA in the sandbox as /root/ca.pem.
async fn put_ca(client: &McpClient, id: &str, net: &TestNet) {
    let pem = std::fs::read_to_string(net.ca_pem()).unwrap();
    ok(
        client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/ca.pem", "content": pem}),
    )
    .await;
}

/// Creates a sandbox with these egress rules; returns its id.
async fn create_with(client: &McpClient, network: Value) -> String {
    let sandbox = ok(client, "sandbox_create", json!({"network": network})).await;
    sandbox["id"].as_str().unwrap().to_string()
}

async fn log(client: &McpClient, id: &str, extra: Value) -> Vec<Value> {
    let mut args = json!({"sandbox_id": id, "limit": 200});
    args.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let page = ok(client, "sandbox_network_log", args).await;
    page["entries"].as_array().unwrap().clone()
}
