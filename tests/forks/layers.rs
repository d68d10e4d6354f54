//! Stacked layers (the plain store: no btrfs): a fork or snapshot of a sandbox that runs nothing
//! but its agent makes its files a read-only layer it and its copies share, copying nothing (and
//! makes none when it wrote nothing since its last); so does one whose processes CRIU carries
//! over its restart; any other is copied instead and keeps what runs; chains stay within the depth limit; a template made from a stacked sandbox has all its files; layers go when nothing
//! stacks on them; and a crash between the two steps of stacking loses nothing.

use serde_json::json;

use crate::common::{McpClient, TestEngine, api, create, ok, sh, spawn_engine_process_env};
use crate::require_sandboxes;
use sandbox_mcp_linux::driver::MAX_STACK;
use sandbox_mcp_model::config::DiskLimits;

use super::{changes, ids};

async fn plain_engine() -> TestEngine {
    TestEngine::start_with(|c| c.disk_limits = DiskLimits::Off).await
}

fn layers_in(engine: &TestEngine) -> Vec<String> {
    let dir = engine.dir.path().join("data/sandboxes/.layers");
    std::fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Only a sandbox whose stop loses nothing is stacked: an idle one; one whose jobs and REPL
/// contexts CRIU carries over its restart. One with an open TCP connection, or whose agent keeps
/// a finished job's output, is copied and keeps them.
#[tokio::test]
async fn a_fork_stacks_layers_only_when_the_parent_loses_nothing() {
    require_sandboxes!();
    let engine = plain_engine().await;
    let client = engine.mcp().await;
    let parent = create(&client).await;
    sh(
        &client,
        &parent,
        "mkdir -p /root/w && head -c 5M /dev/urandom > /root/w/big && echo one > /root/w/f",
    )
    .await;
    let fork = |id: String| {
        let client = &client;
        async move {
            ok(
                client,
                "sandbox_fork",
                json!({"sandbox_id": id, "count": 2}),
            )
            .await
        }
    };
    let forked = fork(parent.clone()).await;
    assert_eq!(forked["method"], "layers", "{forked}");
    let kids = ids(&forked);
    assert_eq!(layers_in(&engine).len(), 1);
    // Nothing written since: a snapshot shares the same layer, and makes none.
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": parent}),
    )
    .await;
    assert_eq!(snap["method"], "layers", "{snap}");
    assert_eq!(layers_in(&engine).len(), 1);
    // The parent runs on, on top of the layer, as do its children; nothing leaks between them.
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": parent})).await;
    assert_eq!(info["status"], "running", "{info}");
    sh(&client, &parent, "echo parent > /root/w/f").await;
    sh(&client, &kids[0], "echo kid > /root/w/f && rm /root/w/big").await;
    assert_eq!(sh(&client, &kids[1], "cat /root/w/f").await, "one\n");
    assert_eq!(sh(&client, &parent, "cat /root/w/f").await, "parent\n");
    assert_eq!(
        sh(&client, &parent, "md5sum < /root/w/big").await,
        sh(&client, &kids[1], "md5sum < /root/w/big").await
    );
    assert_eq!(
        sh(&client, &kids[0], "ls /root/w").await,
        "f\n",
        "a file deleted above a layer stays deleted"
    );
    // Each counts the layer it stacks on against its own disk, as if it had the copy.
    let m = ok(&client, "sandbox_metrics", json!({"sandbox_id": kids[1]})).await;
    assert!(m["disk_bytes"].as_u64().unwrap() >= 5 << 20, "{m}");

    // A process running: with CRIU it is carried over the parent's restart, and the parent is
    // stacked all the same (its children get the job too); without, copied. Either way the
    // process is still there after.
    let carries = engine.manager.driver().capabilities().live_state.available;
    let busy = if carries { "layers" } else { "copy" };
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": parent, "command": "sleep 600", "background": true}),
    )
    .await;
    let forked = fork(parent.clone()).await;
    assert_eq!(forked["method"], busy, "{forked}");
    assert_eq!(sh(&client, &parent, "pgrep -c sleep").await, "1\n");
    if carries {
        assert_eq!(
            forked["memory"]["carried"],
            json!(["job job_1"]),
            "{forked}"
        );
        for kid in ids(&forked) {
            assert_eq!(sh(&client, &kid, "pgrep -c sleep").await, "1\n");
        }
    }
    // An open TCP connection would be cut by a restore (its peer cannot be carried): copied,
    // and the connection lives on.
    hold_a_connection(&client, &parent, "AF_INET", "127.0.0.1", "tcp").await;
    let forked = fork(parent.clone()).await;
    assert_eq!(forked["method"], "copy", "{forked}");
    let open = sh(&client, &parent, "awk '$4 == \"01\"' /proc/net/tcp | wc -l").await;
    assert_eq!(open, "2\n", "both ends of the connection are still open");
    sh(&client, &parent, "pkill sleep; pkill python3; true").await;
    // A finished job's output is the agent's to keep: copied still.
    let forked = fork(parent.clone()).await;
    assert_eq!(forked["method"], "copy", "{forked}");
    // A REPL context's state: carried over the restart with CRIU, else copied.
    let c = ok(
        &client,
        "sandbox_code_context_create",
        json!({"sandbox_id": kids[1], "language": "python"}),
    )
    .await;
    ok(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": kids[1], "code": "x = 41", "context_id": c["id"]}),
    )
    .await;
    let forked = fork(kids[1].clone()).await;
    assert_eq!(forked["method"], busy, "{forked}");
    let r = ok(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": kids[1], "code": "print(x + 1)", "context_id": c["id"]}),
    )
    .await;
    assert!(r.to_string().contains("42"), "{r}");
    // A snapshot of the idle child stacks too, and restores.
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": kids[0]}),
    )
    .await;
    assert_eq!(snap["method"], "layers", "{snap}");
    sh(&client, &kids[0], "rm -rf /root/w").await;
    ok(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": kids[0], "snapshot_id": snap["id"]}),
    )
    .await;
    assert_eq!(sh(&client, &kids[0], "cat /root/w/f").await, "kid\n");
    // An IPv6 connection (the namespace's other table) keeps a fork on the copy path too.
    hold_a_connection(&client, &kids[0], "AF_INET6", "::1", "tcp6").await;
    let forked = fork(kids[0].clone()).await;
    assert_eq!(forked["method"], "copy", "{forked}");
    let open = sh(
        &client,
        &kids[0],
        "awk '$4 == \"01\"' /proc/net/tcp6 | wc -l",
    )
    .await;
    assert_eq!(
        open, "2\n",
        "both ends of the IPv6 connection are still open"
    );
}

/// Starts a job in `id` holding a TCP connection to itself over `address` (of socket `family`),
/// and waits until `/proc/net/{table}` shows it established.
async fn hold_a_connection(client: &McpClient, id: &str, family: &str, address: &str, table: &str) {
    let held = format!(
        "exec python3 -c 'import socket, time\ns = socket.socket(socket.{family})\ns.bind((\"{address}\", 7000))\ns.listen()\nc = socket.create_connection((\"{address}\", 7000))\na, _ = s.accept()\ntime.sleep(600)'"
    );
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": held, "background": true}),
    )
    .await;
    sh(
        client,
        id,
        &format!("until awk '$4 == \"01\"' /proc/net/{table} | grep -q .; do sleep 0.05; done"),
    )
    .await;
}

/// A chain of forks, each of the last child, stacks layers up to the depth limit, then merges
/// the latest changes into the top layer (which keeps the depth); the deepest child sees every
/// generation's changes, deletions included, a diff and a template made from it see them too,
/// and once every sandbox is gone so are the layers.
#[tokio::test]
async fn a_chain_of_forks_stays_within_the_depth_limit_and_its_layers_go_with_it() {
    require_sandboxes!();
    let engine = plain_engine().await;
    let client = engine.mcp().await;
    let first = create(&client).await;
    let mut chain = vec![first.clone()];
    for generation in 0..=MAX_STACK {
        let cur = chain.last().unwrap().clone();
        sh(
            &client,
            &cur,
            &format!(
                "echo {generation} >> /root/log && touch /root/g{generation} && rm -f /root/g{}",
                generation.wrapping_sub(1)
            ),
        )
        .await;
        let forked = ok(&client, "sandbox_fork", json!({"sandbox_id": cur})).await;
        assert_eq!(
            forked["method"], "layers",
            "generation {generation}: {forked}"
        );
        chain.push(ids(&forked)[0].clone());
    }
    let last = chain.last().unwrap().clone();
    // Past the limit the latest changes were merged into the top layer: the depth stays.
    let stack = std::fs::read_to_string(
        engine
            .dir
            .path()
            .join("data/sandboxes")
            .join(&last)
            .join("stack"),
    )
    .unwrap();
    assert_eq!(stack.lines().count(), MAX_STACK, "{stack}");
    let lines: String = (0..=MAX_STACK).map(|g| format!("{g}\n")).collect();
    assert_eq!(sh(&client, &last, "cat /root/log").await, lines);
    assert_eq!(
        sh(&client, &last, "ls /root | grep '^g'").await,
        format!("g{MAX_STACK}\n")
    );
    // Against the first sandbox (one layer), exactly what the generations changed.
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": last, "against": first}),
    )
    .await;
    assert_eq!(
        changes(&d),
        vec![
            ("/root/g0".into(), "removed".into(), json!([])),
            (format!("/root/g{MAX_STACK}"), "added".into(), json!([])),
            ("/root/log".into(), "modified".into(), json!(["content"])),
        ],
        "{d}"
    );
    // A template of a sandbox on stacked layers holds all its files, as one layer.
    let t = ok(
        &client,
        "sandbox_template_create",
        json!({"name": "stacked", "from_sandbox": chain[MAX_STACK - 1]}),
    )
    .await;
    assert_eq!(t["status"], "ready", "{t}");
    let from_template = ok(&client, "sandbox_create", json!({"template": "stacked"})).await;
    let id = from_template["id"].as_str().unwrap();
    let lines: String = (0..MAX_STACK).map(|g| format!("{g}\n")).collect();
    assert_eq!(
        sh(&client, id, "cat /root/log; ls /root | grep '^g'").await,
        format!("{lines}g{}\n", MAX_STACK - 1)
    );
    assert!(!layers_in(&engine).is_empty());
    for sbx in chain.iter().map(String::as_str).chain([id]) {
        ok(&client, "sandbox_kill", json!({"sandbox_id": sbx})).await;
    }
    assert_eq!(layers_in(&engine), Vec::<String>::new());
}

/// `kill -9` of the engine between writing a sandbox's new stack and moving its files into the
/// layer it names: the next start finishes the move, and the sandbox and its children have all
/// their files.
#[tokio::test]
async fn a_crash_between_the_two_steps_of_stacking_loses_nothing() {
    require_sandboxes!();
    let data = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let data = data.path().join("data");
    let off = [("SANDBOX_MCP_DISK_LIMITS", "off")];
    let (mut engine, url) = spawn_engine_process_env(&data, &off).await;
    let (_, made) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let id = made["id"].as_str().unwrap().to_string();
    let exec = |url: String, id: String, cmd: &str| {
        let body = json!({"command": cmd});
        async move {
            let (status, r) = api(
                &url,
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(body),
            )
            .await;
            assert_eq!(status, 200, "{r}");
            r["stdout"].as_str().unwrap().to_string()
        }
    };
    exec(url.clone(), id.clone(), "echo kept > /root/marker").await;
    let (status, forked) = api(
        &url,
        "POST",
        &format!("/v1/sandboxes/{id}/fork"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{forked}");
    assert_eq!(forked["method"], "layers", "{forked}");
    let child = forked["ids"][0].as_str().unwrap().to_string();
    exec(url.clone(), child.clone(), "echo mine > /root/own").await;
    engine.kill().unwrap();
    engine.wait().unwrap();
    crate::common::stop_left_behind(&data);
    // Put the files back where they were before the move: the stack names a layer not made.
    let store = data.join("sandboxes");
    let stack = std::fs::read_to_string(store.join(&id).join("stack")).unwrap();
    let layer = store.join(".layers").join(stack.lines().next().unwrap());
    std::fs::remove_dir_all(store.join(&id).join("upper")).unwrap();
    std::fs::rename(&layer, store.join(&id).join("upper")).unwrap();
    let (again, url) = spawn_engine_process_env(&data, &off).await;
    engine = again;
    assert!(layer.join("root/root/marker").exists());
    // The child names the same layer over its own upper: that stays its own.
    for (sbx, own) in [(&id, "none\n"), (&child, "mine\n")] {
        assert_eq!(
            exec(
                url.clone(),
                sbx.clone(),
                "cat /root/marker; cat /root/own 2>/dev/null || echo none"
            )
            .await,
            format!("kept\n{own}"),
            "{sbx}"
        );
    }
    engine.kill().unwrap();
    engine.wait().unwrap();
    crate::common::kill_left_behind(&data);
}
