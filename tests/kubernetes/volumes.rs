//! Named volumes on the cluster: PersistentVolumeClaims of the operator's storage class, mounted
//! into the pods of every sandbox that asks, shared at once and kept past them; workspaces (host
//! folders) are refused there with the reason.

use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};

use sandbox_mcp_testkit::kubernetes::Namespace;

use crate::common::{McpClient, err, exec, ok, sh};

use super::{KubeEngine, eventually, rig};

async fn create_with(client: &McpClient, volumes: Value) -> String {
    let s = ok(client, "sandbox_create", json!({ "volumes": volumes })).await;
    s["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn named_volumes_are_claims_that_pods_share() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    // A storage class without a provisioner, and one volume of the rig's node for its claim to
    // bind: a directory of this machine (the rig is one node).
    let class = format!("{}-class", ns.name);
    let host = tempfile::Builder::new()
        .prefix("smcp-pv")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let manifest = host.path().with_extension("yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: {class}}}\n\
             provisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: Immediate\n---\n\
             apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {class}-pv}}\nspec:\n  \
             storageClassName: {class}\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteMany]\n  \
             persistentVolumeReclaimPolicy: Retain\n  hostPath: {{path: {}, type: Directory}}\n",
            host.path().display()
        ),
    )
    .unwrap();
    rig.kubectl_ok(&["apply", "-f", &manifest.to_string_lossy()]);
    let folder = tempfile::tempdir().unwrap();
    let workspace = format!("repo={}", folder.path().display());
    let engine = KubeEngine::start(
        rig,
        &ns,
        &[
            ("SANDBOX_MCP_K8S_STORAGE_CLASS", &class),
            ("SANDBOX_MCP_WORKSPACES", &workspace),
        ],
    )
    .await;
    let client = engine.mcp().await;
    let made = ok(
        &client,
        "volume_create",
        json!({"name": "data", "size_mb": 100}),
    )
    .await;
    assert_eq!(made["quota_bytes"], 100 << 20, "{made}");
    // One claim, of the class and the size asked for.
    let claims: Value = serde_json::from_str(&rig.kubectl_ok(&[
        "get",
        "pvc",
        "-n",
        &ns.name,
        "-l",
        "sandbox-mcp/volume",
        "-o",
        "json",
    ]))
    .unwrap();
    let claim = &claims["items"][0];
    assert_eq!(claim["spec"]["storageClassName"], json!(class), "{claims}");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "100Mi");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));

    let a = create_with(&client, json!([{"name": "data", "path": "/data"}])).await;
    let b = create_with(
        &client,
        json!([{"name": "data", "path": "/data", "read_only": true}]),
    )
    .await;
    sh(&client, &a, "echo from-a > /data/f").await;
    assert_eq!(sh(&client, &b, "cat /data/f").await, "from-a\n");
    let r = exec(&client, &b, "echo x > /data/g").await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("Read-only"), "{r}");
    // The claim's volume holds it (on this machine: the rig's node).
    assert_eq!(
        std::fs::read_to_string(host.path().join("f")).unwrap(),
        "from-a\n"
    );
    let refused = err(&client, "volume_delete", json!({"name": "data"})).await;
    assert!(refused.contains("is mounted by"), "{refused}");
    for id in [&a, &b] {
        ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    }
    // Both pods gone, a new one reads what the first wrote.
    let c = create_with(&client, json!([{"name": "data", "path": "/mnt/d"}])).await;
    assert_eq!(sh(&client, &c, "cat /mnt/d/f").await, "from-a\n");
    ok(&client, "sandbox_kill", json!({"sandbox_id": c})).await;
    let deleted = ok(&client, "volume_delete", json!({"name": "data"})).await;
    assert_eq!(deleted["deleted"], true);
    eventually("the claim is deleted", 60, || {
        let out = rig.kubectl_ok(&["get", "pvc", "-n", &ns.name, "-o", "name"]);
        out.trim().is_empty()
    })
    .await;

    // A workspace is a folder of the engine's host: refused here, and not listed.
    let said = err(
        &client,
        "sandbox_create",
        json!({"volumes": [{"name": "repo", "path": "/repo"}]}),
    )
    .await;
    assert!(said.contains("folders of the engine's host"), "{said}");
    let list = ok(&client, "volume_list", json!({})).await;
    assert_eq!(list["volumes"], json!([]), "{list}");
    rig.kubectl(&["delete", "-f", &manifest.to_string_lossy(), "--wait=false"]);
}
