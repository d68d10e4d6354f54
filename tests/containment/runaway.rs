//! Runaway code: a fork bomb, a memory hog and a disk bomb hit their sandbox's limits, not the
//! engine or the host; processes that ignore SIGTERM or escape their group die at the timeout,
//! and background children do not hold a call open.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{TestEngine, create, err, exec, ok, sh};
use crate::{require_cgroups, require_sandboxes};

#[tokio::test]
async fn fork_bomb_hits_the_process_limit_and_others_are_unaffected() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let bomb = create(&client).await;
    let bystander = create(&client).await;
    let r = ok(
        &client,
        "sandbox_exec",
        // The bomb starts in a subshell: dash forks both halves of a background pipeline itself,
        // and a fork refused between the two is fatal to that shell, so the outer shell must not
        // fork once the bomb runs. The wait is a builtin loop for the same reason (`sleep` could
        // not be forked and the shell would exit early instead of timing out).
        json!({"sandbox_id": bomb, "command": "(f() { f | f & }; f); while :; do :; done", "timeout_ms": 3000}),
    )
    .await;
    assert_eq!(r["timed_out"], true, "{r}");
    let m = ok(&client, "sandbox_metrics", json!({"sandbox_id": bomb})).await;
    assert!(m["pids"].as_u64().unwrap() <= 512, "{m}");
    assert_eq!(sh(&client, &bystander, "echo fine").await, "fine\n");
    // The bomb's sandbox can be killed cleanly.
    ok(&client, "sandbox_kill", json!({"sandbox_id": bomb})).await;
}

#[tokio::test]
async fn memory_hog_is_oom_killed_not_the_engine() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let r = ok(&client, "sandbox_exec", json!({"sandbox_id": id, "command": "python3 -c 'x = bytearray(3 * 1024**3); print(len(x))'", "timeout_ms": 60000})).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    // The sandbox is still usable and the engine still answers.
    assert_eq!(sh(&client, &id, "echo alive").await, "alive\n");
}

#[tokio::test]
async fn timeouts_kill_processes_that_ignore_sigterm_and_escaped_children() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let started = Instant::now();
    let r = ok(&client, "sandbox_exec", json!({"sandbox_id": id, "command": "trap '' TERM INT HUP; setsid sleep 1000 & sleep 1000", "timeout_ms": 700})).await;
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["signal"], 9);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let ps = sh(&client, &id, "ps -eo args").await;
    assert!(!ps.contains("sleep 1000"), "{ps}");
}

#[tokio::test]
async fn background_children_do_not_hold_the_call_open() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let started = Instant::now();
    let r = exec(&client, &id, "sleep 30 & echo started").await;
    assert_eq!(r["stdout"], "started\n");
    assert!(started.elapsed() < Duration::from_secs(5));
    // It keeps running in the background.
    assert!(sh(&client, &id, "ps -eo args").await.contains("sleep 30"));
}

/// A template like `base` with a 64 MiB disk, added to a stopped engine's data dir.
fn add_small_disk_template(data: &std::path::Path) {
    let templates = data.join("templates");
    let mut file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(templates.join("base/template.json")).unwrap(),
    )
    .unwrap();
    file["name"] = json!("small-disk");
    file["shape"]["disk_mb"] = json!(64);
    std::fs::create_dir_all(templates.join("small-disk")).unwrap();
    let status = std::process::Command::new("cp")
        .args(["-a"])
        .arg(templates.join("base/rootfs"))
        .arg(templates.join("small-disk/rootfs"))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::write(templates.join("small-disk/template.json"), file.to_string()).unwrap();
}

#[tokio::test]
async fn disk_bomb_hits_the_sandbox_disk_limit_not_the_host() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    add_small_disk_template(&config.data_dir);
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let created = ok(&client, "sandbox_create", json!({"template": "small-disk"})).await;
    let bomb = created["id"].as_str().unwrap().to_string();
    let m = ok(&client, "sandbox_metrics", json!({"sandbox_id": bomb})).await;
    if m["disk_limit_enforced"] != true {
        if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
            panic!("disk limits are required here but not enforced: {m}");
        }
        eprintln!(
            "SKIPPED disk bomb: disk limits need root, btrfs in the kernel and mkfs.btrfs (btrfs-progs)"
        );
        return;
    }
    assert_eq!(m["disk_limit_bytes"], 64 * 1024 * 1024);
    let bystander = ok(&client, "sandbox_create", json!({"template": "small-disk"})).await["id"]
        .as_str()
        .unwrap()
        .to_string();

    let host_free = || {
        let s = nix::sys::statvfs::statvfs("/tmp").unwrap();
        s.blocks_available() as u64 * s.fragment_size() as u64
    };
    let before = host_free();
    // Far past the limit, with dd and with many files.
    let r = exec(
        &client,
        &bomb,
        "dd if=/dev/urandom of=/root/big bs=1M count=512 2>&1 | tail -1; for i in $(seq 1 100); do head -c 1048576 /dev/urandom > /tmp/f$i || break; done; du -sm /root/big /tmp | tail -2",
    )
    .await;
    let out = format!("{}{}", r["stdout"], r["stderr"]);
    assert!(out.contains("Disk quota exceeded"), "{r}");
    let big = sh(&client, &bomb, "stat -c %s /root/big").await;
    assert!(
        big.trim().parse::<u64>().unwrap() <= 64 * 1024 * 1024,
        "{big}"
    );
    let after = host_free();
    assert!(
        before.saturating_sub(after) < 200 * 1024 * 1024,
        "the host lost {} MiB",
        (before - after) >> 20
    );
    // The file tool says why a write fails.
    let message = err(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": bomb, "path": "more.txt", "content": "x".repeat(2 * 1024 * 1024)}),
    )
    .await;
    assert!(
        message.contains("disk is full") && message.contains("sandbox_files_delete"),
        "{message}"
    );
    // Others are unaffected; deleting files gives the space back.
    assert_eq!(
        sh(
            &client,
            &bystander,
            "head -c 10485760 /dev/zero > f && stat -c %s f"
        )
        .await,
        "10485760\n"
    );
    sh(&client, &bomb, "rm -f /root/big /tmp/f*; sync").await;
    assert_eq!(
        sh(
            &client,
            &bomb,
            "head -c 10485760 /dev/zero > g && stat -c %s g"
        )
        .await,
        "10485760\n"
    );
    ok(&client, "sandbox_kill", json!({"sandbox_id": bomb})).await;
    ok(&client, "sandbox_kill", json!({"sandbox_id": bystander})).await;
}
