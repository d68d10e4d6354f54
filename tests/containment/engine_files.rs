//! The engine's own files are its alone: every file of its data dir but the public CA
//! certificate is mode 0600, and neither another user of the host nor a sandbox's host uid can
//! open one, though the data dir (0711) lets them reach it by name. Nor can they list the
//! templates or the layers, or read what names a template's layers — which sandboxes still mount.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;

use crate::common::{TestEngine, create, ok, sh};

use super::proc_field;

/// Files of the data dir that anyone may read: the certificate sandboxes trust.
const PUBLIC: &[&str] = &["egress-ca.pem"];

#[tokio::test]
async fn the_engines_files_open_to_no_other_user() {
    require_own_ids!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "echo tenant-data > /root/f").await;
    // A template of the sandbox's files, in a layer of its own, and a sandbox made from it: the
    // sandboxes' host ids still reach the layers through the directories closed to the others.
    let made = ok(
        &client,
        "sandbox_template_create",
        serde_json::json!({"name": "captured", "from_sandbox": id}),
    )
    .await;
    assert_eq!(made["status"], "ready", "{made}");
    let from = ok(
        &client,
        "sandbox_create",
        serde_json::json!({"template": "captured"}),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(sh(&client, &from, "cat /root/f").await, "tenant-data\n");
    let data = engine.data_dir();
    // The test's own directory (0700) would stop the others before the data dir: opened to
    // traversal, as a data dir's parent usually is, so that only the data dir's modes decide.
    std::fs::set_permissions(engine.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o711);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&data).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if !meta.is_file() || PUBLIC.contains(&name.as_str()) {
            continue;
        }
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{name} is open to others: {:o}",
            meta.permissions().mode()
        );
        files.push(entry.path());
    }
    for expected in ["state.db", "network-log.db", "secrets.key", "egress-ca.key"] {
        assert!(
            files.iter().any(|f| f.ends_with(expected)),
            "{expected} not among {files:?}"
        );
    }
    // Another user, and the host uid of the sandbox's root: no file opens.
    let sandbox_root: u32 = proc_field(engine.agent_pid(&id), "status", "Uid:")
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let listing = [data.join("templates"), data.join("layers")];
    assert!(listing.iter().all(|d| d.is_dir()), "{listing:?}");
    let named = data
        .join("templates")
        .join("captured")
        .join("template.json");
    assert!(named.is_file());
    for uid in [65534, sandbox_root] {
        for dir in &listing {
            let out = std::process::Command::new("ls")
                .arg(dir)
                .uid(uid)
                .gid(uid)
                .output()
                .unwrap();
            assert!(
                !out.status.success(),
                "uid {uid} listed {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        for file in files.iter().chain([&named]) {
            let out = std::process::Command::new("head")
                .args(["-c", "1"])
                .arg(file)
                .uid(uid)
                .gid(uid)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && said.contains("Permission denied"),
                "uid {uid} opened {}: {said}",
                file.display()
            );
        }
    }
}
