//! Hostile paths and input: path tricks resolve inside the sandbox, writes where it may not write
//! fail clearly, zips never follow symlinks, and a missing cwd or a bad environment is a clear
//! error.

use base64::Engine as _;
use serde_json::json;

use crate::common::{TestEngine, create, err, ok, sh};
use crate::require_sandboxes;

#[tokio::test]
async fn path_tricks_resolve_inside_the_sandbox() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(
        &client,
        &id,
        "ln -s / /root/rootlink; ln -s /etc/passwd /root/pw; mkdir -p /root/d",
    )
    .await;
    for path in [
        "../../../../etc/hostname",
        "/proc/self/root/etc/hostname",
        "/root/rootlink/etc/hostname",
        "/proc/1/root/etc/hostname",
    ] {
        let r = ok(
            &client,
            "sandbox_files_read",
            json!({"sandbox_id": id, "path": path}),
        )
        .await;
        assert_eq!(r["content"], "sandbox\n", "{path}");
    }
    let pw = ok(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "pw"}),
    )
    .await;
    assert!(
        pw["content"].as_str().unwrap().contains("user:x:1000"),
        "the sandbox's own passwd"
    );
    // Writing through a symlink to / lands in the sandbox's root, not the host's.
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/rootlink/tmp/through-link", "content": "x"}),
    )
    .await;
    assert_eq!(sh(&client, &id, "cat /tmp/through-link").await, "x");
    assert!(!std::path::Path::new("/tmp/through-link").exists());
    // Deleting a symlink deletes the link only.
    ok(
        &client,
        "sandbox_files_delete",
        json!({"sandbox_id": id, "path": "/root/rootlink"}),
    )
    .await;
    assert_eq!(sh(&client, &id, "cat /etc/hostname").await, "sandbox\n");
    // NUL bytes and absurd names are refused with clear messages.
    let m = err(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/etc/pass\u{0}wd"}),
    )
    .await;
    assert!(m.contains("NUL"), "{m}");
    let m = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "x".repeat(10_000), "content": ""}),
    )
    .await;
    assert!(m.contains("limit is 4096"), "{m}");
    let m = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": format!("/root/{}", "n".repeat(300)), "content": ""}),
    )
    .await;
    assert!(m.contains("too long"), "{m}");
    // Not a directory / is a directory.
    let m = err(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/root/d"}),
    )
    .await;
    assert!(m.contains("is a directory"), "{m}");
    let m = err(
        &client,
        "sandbox_files_delete",
        json!({"sandbox_id": id, "path": "/"}),
    )
    .await;
    assert!(m.contains("sandbox_kill"), "{m}");
}

#[tokio::test]
async fn writes_where_the_sandbox_may_not_fail_clearly() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let m = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/proc/sys/kernel/hostname", "content": "pwned"}),
    )
    .await;
    assert!(
        m.to_lowercase().contains("permission") || m.contains("read-only"),
        "{m}"
    );
    let m = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/dev/evil", "content": "x"}),
    )
    .await;
    assert!(
        m.contains("read-only") || m.to_lowercase().contains("permission"),
        "{m}"
    );
    // A file read from a FIFO must not hang the agent.
    sh(&client, &id, "mkfifo /root/fifo").await;
    let m = err(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/root/fifo"}),
    )
    .await;
    assert!(m.contains("not a regular file"), "{m}");
    // /usr is copy-on-write: writable in the sandbox, untouched on the host.
    sh(&client, &id, "echo mine > /usr/local/sandbox-cow-test").await;
    assert!(!std::path::Path::new("/usr/local/sandbox-cow-test").exists());
}

#[tokio::test]
async fn zip_skips_symlinks_and_never_follows_them() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "mkdir -p /root/out/sub && echo a > /root/out/a.txt && echo b > /root/out/sub/b.txt && ln -s /etc/shadow /root/out/shadow && ln -s / /root/out/root && mkfifo /root/out/pipe").await;
    let r = ok(
        &client,
        "sandbox_files_download_dir",
        json!({"sandbox_id": id, "path": "/root/out"}),
    )
    .await;
    assert_eq!(r["files"], 2);
    let skipped: Vec<&str> = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for s in ["shadow", "root", "pipe"] {
        assert!(skipped.contains(&s), "{skipped:?}");
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r["zip_base64"].as_str().unwrap())
        .unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut names: Vec<String> = (0..archive.len())
        .map(|i| archive.by_index(i).unwrap().name().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "sub/", "sub/b.txt"]);
    for n in &names {
        assert!(
            !n.contains("..") && !n.starts_with('/'),
            "zip-slip entry {n}"
        );
    }
    // Over the limit: an actionable error, not a huge result.
    sh(
        &client,
        &id,
        "head -c 12000000 /dev/urandom > /root/out/big",
    )
    .await;
    let m = err(
        &client,
        "sandbox_files_download_dir",
        json!({"sandbox_id": id, "path": "/root/out"}),
    )
    .await;
    assert!(
        m.contains("exceeds") && m.contains("smaller directory"),
        "{m}"
    );
}

#[tokio::test]
async fn missing_cwd_and_bad_env_are_clear_errors() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let m = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "pwd", "cwd": "/nope"}),
    )
    .await;
    // The reason first, then the path: a long path clipped never hides why.
    assert!(
        m.contains("cwd does not exist") && m.contains("/nope"),
        "{m}"
    );
    let m = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "pwd", "env": {"A=B": "x"}}),
    )
    .await;
    assert!(m.contains("environment variable name"), "{m}");
    let r = ok(&client, "sandbox_exec", json!({"sandbox_id": id, "command": "echo $GREETING; pwd", "cwd": "/tmp", "env": {"GREETING": "hi"}})).await;
    assert_eq!(r["stdout"], "hi\n/tmp\n");
}
