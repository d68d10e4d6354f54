//! Warm pools of pods (`--warm TEMPLATE=N`): a create takes a running pod whose agent is
//! connected, every replica then sees the sandbox as its owner's, and a rolling restart of the
//! replica that keeps the pool hands out the same pods after it.

use std::collections::BTreeSet;
use std::time::Instant;

use serde_json::{Value, json};

use sandbox_mcp_testkit::kubernetes::{Namespace, Rig};

use crate::common::api;

use super::{KubeEngine, eventually, pod, rig};

/// The sandboxes whose pods run in the namespace, by sandbox id (pods being deleted left out).
fn running(rig: &Rig, ns: &Namespace) -> BTreeSet<String> {
    let out = rig.kubectl_ok(&["get", "pods", "-n", &ns.name, "-o", "json"]);
    let pods: Value = serde_json::from_str(&out).unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| p["metadata"]["name"].as_str())
        .map(|name| name.replacen('-', "_", 1))
        .collect()
}

/// Creates a sandbox through `url` and runs `true` in it: its id and the milliseconds taken.
async fn create_and_run(url: &str) -> (String, u128) {
    let started = Instant::now();
    let (status, made) = api(url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(run(url, &id, "true").await, "");
    (id, started.elapsed().as_millis())
}

/// Runs `command` in sandbox `id` through `url`, which must succeed: its stdout.
async fn run(url: &str, id: &str, command: &str) -> String {
    let path = format!("/v1/sandboxes/{id}/exec");
    let (status, ran) = api(url, "POST", &path, Some(json!({"command": command}))).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["exit_code"], 0, "{ran}");
    ran["stdout"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_pool_of_pods_serves_creates_at_once_and_survives_a_rolling_restart() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let warm = [("SANDBOX_MCP_WARM", "base=2")];
    let mut a = KubeEngine::start(rig, &ns, &warm).await;
    eventually("two pooled pods run", 120, || running(rig, &ns).len() == 2).await;
    let pooled = running(rig, &ns);
    // A second replica without a pool: it neither lists nor kills the first one's pool.
    let b = KubeEngine::start(rig, &ns, &[]).await;
    let (status, listed) = api(&b.url, "GET", "/v1/sandboxes", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["sandboxes"], json!([]), "{listed}");

    // A create through the replica with the pool takes a pooled pod: no pod is scheduled, no
    // container started.
    let (id, ms) = create_and_run(&a.url).await;
    assert!(
        pooled.contains(&id),
        "{id} is not one of the pooled pods {pooled:?}"
    );
    eprintln!("create → first exec from the pod pool: {ms} ms");
    // The other replica sees it as the caller's sandbox at once, and uses it.
    assert_eq!(run(&b.url, &id, "echo via-b").await, "via-b\n");
    // A pooled pod has no deadline of its own; a timeout given to it now is the kubelet's too.
    assert!(pod(rig, &ns, &id).unwrap()["spec"]["activeDeadlineSeconds"].is_null());
    let ask = json!({"timeout_seconds": 600});
    let (status, set) = api(&b.url, "PATCH", &format!("/v1/sandboxes/{id}"), Some(ask)).await;
    assert_eq!(status, 200, "{set}");
    let deadline = pod(rig, &ns, &id).unwrap()["spec"]["activeDeadlineSeconds"].as_i64();
    assert!(
        deadline.is_some_and(|d| (600..=900).contains(&d)),
        "activeDeadlineSeconds {deadline:?}"
    );
    let (_, listed) = api(&b.url, "GET", "/v1/sandboxes", None).await;
    assert_eq!(listed["sandboxes"][0]["id"], id.as_str(), "{listed}");
    eventually("the pool is refilled", 120, || running(rig, &ns).len() == 3).await;
    let pool: BTreeSet<String> = running(rig, &ns).into_iter().filter(|p| p != &id).collect();
    assert!(!b.log().contains("panicked"), "{}", b.log());

    // A rolling restart of the replica with the pool: its pods run on, and the new process
    // hands them out.
    a.restart(rig, &ns, &warm).await;
    assert_eq!(
        running(rig, &ns),
        pool.iter().cloned().chain([id.clone()]).collect(),
        "pods went or came with the restart"
    );
    // The kept pods are back in the pool once their agents answered.
    let mut handed = None;
    for _ in 0..100 {
        let (next, ms) = create_and_run(&a.url).await;
        if pool.contains(&next) {
            eprintln!("after the restart, from the kept pool: {ms} ms");
            handed = Some(next);
            break;
        }
        // Created cold while the kept pods were still being checked: not what is tested.
        let (status, gone) = api(&a.url, "DELETE", &format!("/v1/sandboxes/{next}"), None).await;
        assert!((200..300).contains(&status), "{gone}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let handed = handed.expect("a create after the restart took a kept pod");
    // Still the caller's, through either replica; the first sandbox is untouched.
    for (url, sandbox) in [(&a.url, &handed), (&b.url, &handed), (&a.url, &id)] {
        assert_eq!(run(url, sandbox, "echo ok").await, "ok\n");
    }
    assert!(!a.log().contains("panicked"), "{}", a.log());
}
