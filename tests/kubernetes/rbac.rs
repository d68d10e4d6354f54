//! RBAC: the engine runs with only the documented role, through a service account's token.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use sandbox_mcp_testkit::kubernetes::{Namespace, Rig};

use crate::common::{BIN, KEY, ok, sh};

use super::{KubeEngine, eventually, pod, rig};

#[tokio::test(flavor = "multi_thread")]
async fn the_engine_runs_with_only_the_documented_rbac() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    rig.kubectl_ok(&[
        "apply",
        "-n",
        &ns.name,
        "-f",
        &deploy.join("rbac.yaml").to_string_lossy(),
    ]);
    // The engine's Deployment, Service and NetworkPolicy are valid for this API server (a dry
    // run: on this rig pods cannot reach the API server's address, so the engine runs outside).
    let applied = rig.kubectl_ok(&[
        "apply",
        "-n",
        &ns.name,
        "--dry-run=server",
        "-f",
        &deploy.join("engine.yaml").to_string_lossy(),
    ]);
    for kind in ["deployment", "service", "networkpolicy"] {
        assert!(applied.contains(kind), "{applied}");
    }

    // The service account may do what the engine needs, and nothing else.
    let who = format!("system:serviceaccount:{}:sandbox-mcp-engine", ns.name);
    // `RESOURCE/SUB` as kubectl's `--subresource` (its `pods/exec` form checks `pods` alone).
    let can = |verb: &str, what: &str| {
        let (resource, sub) = what.split_once('/').unwrap_or((what, ""));
        let sub = format!("--subresource={sub}");
        let mut args = vec![
            "auth", "can-i", verb, resource, "-n", &ns.name, "--as", &who,
        ];
        if what.contains('/') {
            args.push(&sub);
        }
        let out = rig.kubectl(&args);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    for (verb, what) in [
        ("create", "pods"),
        ("get", "pods"),
        ("list", "pods"),
        ("watch", "pods"),
        ("patch", "pods"),
        ("delete", "pods"),
        ("create", "pods/exec"),
        ("create", "persistentvolumeclaims"),
        ("delete", "persistentvolumeclaims"),
    ] {
        assert!(can(verb, what), "{verb} {what} must be allowed");
    }
    for (verb, what) in [
        ("get", "secrets"),
        ("update", "pods"),
        ("create", "pods/portforward"),
        ("create", "pods/attach"),
        ("create", "deployments"),
        ("list", "configmaps"),
        ("create", "persistentvolumes"),
        ("patch", "persistentvolumeclaims"),
    ] {
        assert!(!can(verb, what), "{verb} {what} must not be allowed");
    }
    let elsewhere = rig.kubectl(&[
        "auth", "can-i", "list", "pods", "-n", "default", "--as", &who,
    ]);
    assert_eq!(String::from_utf8_lossy(&elsewhere.stdout).trim(), "no");

    // The engine with that service account's own token: the full loop works.
    let token = sa_token(rig, &ns, "sandbox-mcp-engine").await;
    let kubeconfig = token_kubeconfig(rig, &token, &ns);
    let kc = kubeconfig.path().to_string_lossy().into_owned();
    let engine = KubeEngine::start(rig, &ns, &[("KUBECONFIG", &kc)]).await;
    let client = engine.mcp().await;
    let made = ok(&client, "sandbox_create", json!({})).await;
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(sh(&client, &id, "echo with-rbac").await, "with-rbac\n");
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    eventually("the pod is deleted", 30, || pod(rig, &ns, &id).is_none()).await;

    // A service account with no role: the engine refuses to start, naming what it lacks.
    rig.kubectl_ok(&["create", "serviceaccount", "-n", &ns.name, "nobody"]);
    let token = sa_token(rig, &ns, "nobody").await;
    let kubeconfig = token_kubeconfig(rig, &token, &ns);
    // An engine that stops at its start has mounted its sandbox store by then: it goes with
    // the directory.
    let data = crate::common::TempData::new();
    let env = rig.engine_env(&ns.name);
    let out = Command::new(BIN)
        .args(["engine", "--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", kubeconfig.path())
        .env("SANDBOX_MCP_DATA_DIR", data.data())
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("list") && stderr.contains("pods") && stderr.contains("rbac.yaml"),
        "{stderr}"
    );
}

/// A token for a service account, from the TokenRequest API (what a pod's projected token is;
/// the rig runs no controller that would make the older token secrets).
async fn sa_token(rig: &Rig, ns: &Namespace, account: &str) -> String {
    let request = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        request.path(),
        r#"{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}"#,
    )
    .unwrap();
    let path = format!(
        "/api/v1/namespaces/{}/serviceaccounts/{account}/token",
        ns.name
    );
    let out = rig.kubectl_ok(&[
        "create",
        "--raw",
        &path,
        "-f",
        &request.path().to_string_lossy(),
    ]);
    let answer: Value = serde_json::from_str(&out).unwrap();
    answer["status"]["token"].as_str().unwrap().to_string()
}

/// A kubeconfig for the rig's API server with `token` as its only credential.
fn token_kubeconfig(rig: &Rig, token: &str, ns: &Namespace) -> tempfile::NamedTempFile {
    let server = rig.kubectl_ok(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: c, cluster: {{server: \"{server}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: \"{token}\"}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u, namespace: {}}}}}]\n\
             current-context: c\n",
            ns.name
        ),
    )
    .unwrap();
    file
}
