//! Restarts: bindings survive an engine restart, and a binding that cannot work is explained.

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::{VALUE, engine_for, example_bound};

/// Bindings survive an engine restart; a deleted secret makes the next request fail with the
/// reason in the log; an upstream whose certificate does not verify is refused, and logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_survive_a_restart_and_failures_are_explained() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net).await;
    let (client, id) = example_bound(&engine).await;
    drop(client);
    let dir = engine.stop().await;
    let config = {
        let mut c = TestEngine::config_for(dir.path());
        c.network.dns_upstream = vec![net.dns];
        c.network.egress_allow = vec![format!("{}/32", net.net_ip)];
        c.network.egress_ca = vec![net.ca_pem()];
        c
    };
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let curl = "curl -sS -H \"Authorization: Bearer $API_KEY\" https://api.example.test/record";
    assert_eq!(sh(&client, &id, curl).await, "recorded\n");
    assert_eq!(
        net.recorded().last().unwrap()["headers"]["authorization"],
        format!("Bearer {VALUE}")
    );
    // Deleted: the request fails, and says why.
    let r = engine
        .http()
        .delete(format!("{}/v1/secrets/example", engine.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let out = exec(&client, &id, curl).await;
    assert!(
        out["stdout"].as_str().unwrap().contains("no longer exists"),
        "{out}"
    );
    let log = ok(&client, "sandbox_network_log", json!({"sandbox_id": id})).await;
    assert!(log.to_string().contains("no longer exists"), "{log:#}");

    // An engine that does not trust the test CA: the upstream's certificate does not verify,
    // so the sandbox's connection fails, and the log says why.
    let strict = TestEngine::start_with({
        let (dns, allow) = (net.dns, format!("{}/32", net.net_ip));
        move |c| {
            c.network.dns_upstream = vec![dns];
            c.network.egress_allow = vec![allow];
        }
    })
    .await;
    let (client, id) = example_bound(&strict).await;
    let id = id.as_str();
    let out = exec(&client, id, curl).await;
    assert_ne!(out["exit_code"], 0, "{out}");
    let log = ok(
        &client,
        "sandbox_network_log",
        json!({"sandbox_id": id, "verdict": "failed"}),
    )
    .await;
    assert!(
        log.to_string().contains("certificate"),
        "the log names the certificate problem: {log:#}"
    );
}
