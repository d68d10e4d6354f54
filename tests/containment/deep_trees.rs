//! Deep trees: no walk of a sandbox's tree (a delete, a snapshot, a diff) may crash the engine,
//! on a plain store or a btrfs one.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{McpClient, TestEngine, create, err, ok, sh};
use crate::{require_cgroups, require_sandboxes};
use sandbox_mcp_model::config::DiskLimits;

use super::sandbox_dir;

/// Builds /root/deep, 15 000 directories deep (far past PATH_MAX), with files along the way.
async fn deep_tree(client: &McpClient, id: &str) {
    // Minutes, not the default minute: on a machine busy with other builds this walk of 15 000
    // mkdir/chdir pairs has taken longer.
    let code = "import os\nos.mkdir('/root/deep'); os.chdir('/root/deep')\n\
         for i in range(15000):\n    os.mkdir('d'); os.chdir('d')\n    \
         if i % 1000 == 0: open('f', 'w').write('x'); os.symlink('/etc', 'l')\n\
         print(i + 1)";
    let r = ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": format!("python3 - <<'EOF'\n{code}\nEOF"),
               "timeout_ms": 300_000}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "15000\n", "{r}");
}

async fn deep_trees_survive_every_delete(disk: DiskLimits) {
    let engine = TestEngine::start_with(|c| c.disk_limits = disk).await;
    let client = engine.mcp().await;

    // The agent deletes one on request, and goes on answering.
    let a = create(&client).await;
    if disk == DiskLimits::Auto {
        // The btrfs store must really be in use, or this is the plain-store test again.
        let m = ok(&client, "sandbox_metrics", json!({"sandbox_id": a})).await;
        assert_eq!(
            m["disk_limit_enforced"], true,
            "the btrfs store was not set up (loop devices and btrfs are needed): {m}"
        );
    }
    deep_tree(&client, &a).await;
    // Capturing it as a template is refused with words the caller can act on (no host path),
    // and the sandbox goes on.
    let refused = err(
        &client,
        "sandbox_template_create",
        json!({"name": "deep", "from_sandbox": a}),
    )
    .await;
    assert!(
        refused.contains("/root/deep/d/d") && refused.contains("nested too deep"),
        "{refused}"
    );
    assert!(
        !refused.contains(&engine.data_dir().display().to_string()),
        "{refused}"
    );
    assert_eq!(sh(&client, &a, "echo alive").await, "alive\n");
    ok(
        &client,
        "sandbox_files_delete",
        json!({"sandbox_id": a, "path": "deep", "recursive": true}),
    )
    .await;
    assert_eq!(
        sh(&client, &a, "test -e /root/deep || echo gone").await,
        "gone\n"
    );

    // sandbox_kill deletes the sandbox's files (on a plain store, file by file).
    deep_tree(&client, &a).await;
    ok(&client, "sandbox_kill", json!({"sandbox_id": a})).await;
    assert!(!sandbox_dir(&engine, &a).exists());

    // Expiry runs the same delete. The tree takes seconds to build, and over a minute on a
    // machine busy with other builds: leave it two.
    let b = ok(&client, "sandbox_create", json!({"timeout_seconds": 120})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    deep_tree(&client, &b).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    while sandbox_dir(&engine, &b).exists() {
        assert!(
            Instant::now() < deadline,
            "the expired sandbox was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Recovery after a restart finishes an interrupted kill, and the engine comes up; a deep
    // sandbox that lives on through the restart is killed afterwards like any other.
    let c = create(&client).await;
    deep_tree(&client, &c).await;
    let d = create(&client).await;
    deep_tree(&client, &d).await;
    drop(client);
    let dir = engine.stop().await;
    let config = {
        let mut c = TestEngine::config_for(dir.path());
        c.disk_limits = disk;
        c
    };
    sandbox_mcp_engine::state::Store::open(&config.state_db())
        .unwrap()
        .set_status(&c, sandbox_mcp_engine::state::Status::Killing)
        .unwrap();
    let engine = TestEngine::start_on(dir, config).await;
    assert!(!sandbox_dir(&engine, &c).exists());
    let client = engine.mcp().await;
    let listed = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["sandboxes"][0]["id"], d.as_str(), "{listed}");
    ok(&client, "sandbox_kill", json!({"sandbox_id": d})).await;
    assert!(!sandbox_dir(&engine, &d).exists());
    assert!(create(&client).await.starts_with("sbx_"));
}

#[tokio::test]
async fn a_tree_15000_deep_cannot_crash_a_plain_store() {
    require_sandboxes!();
    deep_trees_survive_every_delete(DiskLimits::Off).await;
}

#[tokio::test]
async fn a_tree_15000_deep_cannot_crash_the_btrfs_store() {
    require_cgroups!();
    if !std::path::Path::new("/usr/sbin/mkfs.btrfs").exists() {
        if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
            panic!("mkfs.btrfs (btrfs-progs) is required here");
        }
        eprintln!("SKIPPED a_tree_15000_deep_cannot_crash_the_btrfs_store: needs mkfs.btrfs");
        return;
    }
    deep_trees_survive_every_delete(DiskLimits::Auto).await;
}
