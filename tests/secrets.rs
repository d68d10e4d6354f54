//! Brokered secrets against the test internet: the sandbox holds a stand-in, the HTTPS upstream
//! (the test CA, given to the engine with `--egress-ca`) receives the real value, and the value
//! never reaches anything the sandbox can read.
//!
//! This file holds what the secrets suites share (the hostile ones in `secrets_hostile.rs` too);
//! the tests are by theme: [`swap`] (the stand-in swapped on the way out, and only there),
//! [`refusals`] (bad secrets, other tenants'), [`restarts`] (bindings survive, failures are
//! explained), [`http2`] (upstreams that speak HTTP/2) and [`cli`] (the `secrets` subcommand and
//! `--egress-ca`).

use serde_json::{Value, json};

use crate::common::*;
use crate::testnet::TestNet;

mod cli;
mod http2;
mod logs;
mod refusals;
mod restarts;
mod swap;

pub const VALUE: &str = "sk-live-0123456789-REAL-VALUE";

pub async fn engine_for(net: &TestNet) -> TestEngine {
    let (dns, allow, ca) = (net.dns, format!("{}/32", net.net_ip), net.ca_pem());
    TestEngine::start_with(move |c| {
        c.network.dns_upstream = vec![dns];
        c.network.egress_allow = vec![allow];
        c.network.egress_ca = vec![ca];
    })
    .await
}

/// Runs a Python script in the sandbox; returns its stdout (it must succeed).
pub async fn py_out(client: &McpClient, id: &str, code: &str) -> String {
    sh(client, id, &format!("python3 - <<'EOF'\n{code}\nEOF")).await
}

/// Sets a secret through the engine API (what `sandbox-mcp secrets set` does locally).
pub async fn set_secret(engine: &TestEngine, name: &str, body: Value) -> reqwest::Response {
    engine
        .http()
        .put(format!("{}/v1/secrets/{name}", engine.url))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Stores the secret `name` as `secret` says and creates a sandbox that binds it to `API_KEY`:
/// the engine's MCP client and the sandbox's id.
pub async fn bound_sandbox(engine: &TestEngine, name: &str, secret: Value) -> (McpClient, String) {
    let r = set_secret(engine, name, secret).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let client = engine.mcp().await;
    let sandbox = ok(
        &client,
        "sandbox_create",
        json!({"secrets": {"API_KEY": name}}),
    )
    .await;
    let id = sandbox["id"].as_str().unwrap().to_string();
    (client, id)
}

/// Stores the secret `example` (for api.example.test) and creates a sandbox that binds it to
/// `API_KEY`: the engine's MCP client and the sandbox's id.
async fn example_bound(engine: &TestEngine) -> (McpClient, String) {
    bound_sandbox(
        engine,
        "example",
        json!({"hosts": ["api.example.test"], "value": VALUE, "headers": ["Authorization", "X-Key"]}),
    )
    .await
}
