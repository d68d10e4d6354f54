//! Sandbox lifecycles: pause and resume, kill, timers, metrics, restarts.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{BIN, KEY, TestEngine, create, exec, exec_streamed, ok, sh};
use crate::{require_cgroups, require_sandboxes};

mod usage;

#[tokio::test]
async fn pause_freezes_and_exec_resumes_transparently() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    // A background counter: it must not advance while paused, and must continue after. Written
    // whole (renamed into place), so a read never finds it empty.
    sh(&client, &id, "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done' >/dev/null 2>&1 &").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ok(&client, "sandbox_pause", json!({"sandbox_id": id})).await;
    let cg = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&id);
    assert!(cg.is_frozen());
    let listed = ok(&client, "sandbox_list", json!({"status": "paused"})).await;
    assert_eq!(listed["sandboxes"][0]["id"], id.as_str());
    let up = engine
        .data_dir()
        .join("sandboxes")
        .join(&id)
        .join("upper/root/tmp/n");
    let before = std::fs::read_to_string(&up).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        std::fs::read_to_string(&up).unwrap(),
        before,
        "a paused sandbox ran"
    );
    // exec resumes it, and the background process is still there.
    let n1: u64 = sh(&client, &id, "cat /tmp/n").await.trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n2: u64 = sh(&client, &id, "cat /tmp/n").await.trim().parse().unwrap();
    assert!(
        n2 > n1,
        "the background process did not resume ({n1} → {n2})"
    );
    // Resume of a running sandbox is a no-op.
    let r = ok(&client, "sandbox_resume", json!({"sandbox_id": id})).await;
    assert_eq!(r["status"], "running");
}

#[tokio::test]
async fn kill_removes_processes_files_and_cgroups() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "sleep 1000 >/dev/null 2>&1 & echo started").await;
    let dir = engine.data_dir().join("sandboxes").join(&id);
    assert!(dir.exists());
    let cg = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&id);
    let pids = cg.pids();
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(!dir.exists(), "the sandbox's files are still on disk");
    for pid in pids {
        // Gone, or a zombie waiting for the host's init to reap it: never running.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            .is_some_and(|s| s != "Z");
        assert!(!running, "process {pid} survived the kill: {state}");
    }
    for d in cg.dirs() {
        assert!(!d.exists(), "{} survived the kill", d.display());
    }
    let listed = ok(&client, "sandbox_list", json!({})).await;
    assert!(listed["sandboxes"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn idle_sandboxes_pause_and_timed_ones_die() {
    require_cgroups!();
    let engine = TestEngine::start_with(|c| c.idle_pause = Some(Duration::from_millis(500))).await;
    let client = engine.mcp().await;
    let idle = create(&client).await;
    let timed = ok(&client, "sandbox_create", json!({"timeout_seconds": 1})).await;
    let timed = timed["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = ok(&client, "sandbox_info", json!({"sandbox_id": idle})).await;
        let gone = crate::common::call(&client, "sandbox_info", json!({"sandbox_id": timed}))
            .await
            .is_error
            == Some(true);
        if info["status"] == "paused" && gone {
            break;
        }
        assert!(Instant::now() < deadline, "timers did not fire: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A long-running exec is not paused under its feet.
    let r = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": idle, "command": "sleep 1.5; echo done"}),
    )
    .await;
    assert_eq!(r["stdout"], "done\n");
}

#[tokio::test]
async fn clean_restart_keeps_every_sandbox_paused_with_its_files() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let a = create(&client).await;
    let b = create(&client).await;
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": a, "path": "state.txt", "content": "kept"}),
    )
    .await;
    sh(&client, &b, "nohup sleep 600 >/dev/null 2>&1 &").await;
    drop(client);
    let dir = engine.stop().await;

    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let listed = ok(&client, "sandbox_list", json!({})).await;
    let statuses: Vec<_> = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].clone())
        .collect();
    assert_eq!(statuses, vec![json!("paused"), json!("paused")]);
    assert_eq!(sh(&client, &a, "cat /root/state.txt").await, "kept");
    // The frozen process survived the clean restart and runs again.
    assert!(sh(&client, &b, "ps -eo args").await.contains("sleep 600"));
}

#[tokio::test]
async fn kill_9_of_the_engine_loses_nothing_acknowledged() {
    require_cgroups!();
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(BIN)
        .args(["engine", "--listen", &format!("127.0.0.1:{port}")])
        .env("SANDBOX_MCP_DATA_DIR", &data)
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let backend =
        sandbox_mcp_server::backend::Backend::remote(&url, Some(sandbox_mcp_api::ApiKey::new(KEY)))
            .unwrap();
    let client = crate::common::mcp_for(backend, Default::default(), "all").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::common::call(&client, "sandbox_list", json!({}))
        .await
        .is_error
        == Some(true)
    {
        assert!(Instant::now() < deadline, "engine did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = create(&client).await;
        ok(
            &client,
            "sandbox_files_write",
            json!({"sandbox_id": id, "path": "n", "content": format!("{i}")}),
        )
        .await;
        ids.push(id);
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    drop(client);

    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let listed = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 3);
    for (i, id) in ids.iter().enumerate() {
        let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
        assert_eq!(info["status"], "paused");
        assert_eq!(sh(&client, id, "cat /root/n").await, format!("{i}"));
    }
}

/// A call made as soon as the agent is killed restarts it and is answered, the crash unseen:
/// while the agent dies its socket may still be open, and a connection made then is reset with
/// the request unread, which the engine sends again to the new agent. A plain call, a streamed
/// one and a file read, each right after a crash, three times over.
#[tokio::test]
async fn a_dead_agent_restarts_on_next_use() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let api = engine.client();
    let id = create(&client).await;
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "keep", "content": "yes"}),
    )
    .await;
    for round in 0..3 {
        // Killed from the host, as a crash would.
        engine.crash_agent(&id);
        let answer = exec(&client, &id, "cat /root/keep").await;
        assert_eq!(answer["stdout"], "yes", "round {round}: {answer}");

        engine.crash_agent(&id);
        let lines = exec_streamed(&api, &id, "cat /root/keep").await;
        let last = lines.last().unwrap();
        assert_eq!(last["result"]["stdout"], "yes", "round {round}: {lines:?}");

        engine.crash_agent(&id);
        let read = ok(
            &client,
            "sandbox_files_read",
            json!({"sandbox_id": id, "path": "keep"}),
        )
        .await;
        assert!(read.to_string().contains("yes"), "round {round}: {read}");
    }
}

#[tokio::test]
async fn the_v1_freezer_pauses_too() {
    require_cgroups!();
    use sandbox_mcp_linux::cgroups::{FreezeMethod, Layout};
    let layout = Layout::detect();
    if !matches!(
        &layout,
        Layout::Hybrid {
            freezer: Some(_),
            ..
        }
    ) {
        eprintln!(
            "SKIPPED the_v1_freezer_pauses_too: needs the cgroup v1 freezer controller (hybrid hierarchy)"
        );
        return;
    }
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done' >/dev/null 2>&1 &").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v1 = layout.sandbox_with(&id, FreezeMethod::V1);
    v1.freeze().unwrap();
    assert!(v1.is_frozen());
    let up = engine
        .data_dir()
        .join("sandboxes")
        .join(&id)
        .join("upper/root/tmp/n");
    let before = std::fs::read_to_string(&up).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        std::fs::read_to_string(&up).unwrap(),
        before,
        "frozen by the v1 freezer, yet it ran"
    );
    v1.thaw().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_ne!(std::fs::read_to_string(&up).unwrap(), before);
}

/// Everything the engine acknowledged: sandbox ids, and files written with their content.
#[derive(Default)]
struct Acked {
    sandboxes: Vec<String>,
    files: Vec<(String, String, String)>,
}

/// `kill -9` of the engine in the middle of a burst of creates and file writes, over and over:
/// after each restart every acknowledged sandbox is listed and every acknowledged file is there
/// with its exact content. Bounded: five rounds, or fewer past 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_burst_of_creates_and_writes_loses_nothing_acknowledged() {
    require_sandboxes!();
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let http = sandbox_mcp_api::http_builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Acked::default()));
    let started = Instant::now();
    let mut rounds = 0;
    while rounds < 5 && (rounds < 1 || started.elapsed() < Duration::from_secs(60)) {
        rounds += 1;
        let (mut engine, url) = crate::common::spawn_engine_process(&data).await;
        let mut workers = Vec::new();
        for w in 0..4 {
            let (http, url, acked) = (http.clone(), url.clone(), acked.clone());
            workers.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                for seq in 0.. {
                    // Up to four sandboxes per worker and round, then writes into them.
                    if mine.len() < 4 && seq % 3 == 0 {
                        let Ok(r) = http
                            .post(format!("{url}/v1/sandboxes"))
                            .bearer_auth(KEY)
                            .json(&json!({"metadata": {"worker": w.to_string()}}))
                            .send()
                            .await
                        else {
                            return;
                        };
                        if r.status() != 201 {
                            return;
                        }
                        let Ok(v) = r.json::<serde_json::Value>().await else {
                            return;
                        };
                        let id = v["id"].as_str().unwrap().to_string();
                        acked.lock().unwrap().sandboxes.push(id.clone());
                        mine.push(id);
                        continue;
                    }
                    let Some(id) = mine.get(seq % mine.len().max(1)).cloned() else {
                        continue;
                    };
                    let path = format!("/root/r{rounds}-w{w}-{seq}.txt");
                    let content = format!("{id} {seq} {}", "x".repeat(seq * 37 % 4000));
                    let Ok(r) = http
                        .put(format!("{url}/v1/sandboxes/{id}/files"))
                        .bearer_auth(KEY)
                        .json(&json!({"path": path, "content": content}))
                        .send()
                        .await
                    else {
                        return;
                    };
                    if !r.status().is_success() {
                        return;
                    }
                    // Acknowledged only once the whole response arrived.
                    if r.bytes().await.is_err() {
                        return;
                    }
                    acked.lock().unwrap().files.push((id, path, content));
                }
            }));
        }
        // Kill mid-burst: once this round has acknowledged a good number of operations.
        let (s0, f0) = {
            let a = acked.lock().unwrap();
            (a.sandboxes.len(), a.files.len())
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (s, f) = {
                let a = acked.lock().unwrap();
                (a.sandboxes.len(), a.files.len())
            };
            if s >= s0 + 8 && f >= f0 + 40 {
                break;
            }
            assert!(Instant::now() < deadline, "the burst made no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        engine.kill().unwrap(); // SIGKILL, while the workers are still sending
        engine.wait().unwrap();
        for w in workers {
            let _ = w.await;
        }

        // Restart and check everything acknowledged so far, across every crash.
        let (mut engine, url) = crate::common::spawn_engine_process(&data).await;
        let listed = crate::common::api(&url, "GET", "/v1/sandboxes", None)
            .await
            .1
            .to_string();
        let (sandboxes, files) = {
            let a = acked.lock().unwrap();
            (a.sandboxes.clone(), a.files.clone())
        };
        for id in &sandboxes {
            assert!(
                listed.contains(id.as_str()),
                "round {rounds}: acknowledged sandbox {id} is gone"
            );
        }
        for (id, path, content) in &files {
            let r = http
                .get(format!("{url}/v1/sandboxes/{id}/files"))
                .bearer_auth(KEY)
                .query(&[("path", path)])
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body: serde_json::Value = r.json().await.unwrap();
            assert!(
                status.is_success(),
                "round {rounds}: {id}:{path}: {status} {body}"
            );
            assert_eq!(
                body["content"].as_str(),
                Some(content.as_str()),
                "round {rounds}: {id}:{path} changed"
            );
        }
        eprintln!(
            "round {rounds}: {} sandboxes and {} files acknowledged, all intact after kill -9",
            sandboxes.len(),
            files.len()
        );
        engine.kill().unwrap();
        engine.wait().unwrap();
    }
    // Clean up every sandbox, acknowledged or not.
    let (mut engine, url) = crate::common::spawn_engine_process(&data).await;
    let listed: serde_json::Value = http
        .get(format!("{url}/v1/sandboxes"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for s in listed["sandboxes"].as_array().unwrap() {
        let id = s["id"].as_str().unwrap();
        http.delete(format!("{url}/v1/sandboxes/{id}"))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(engine.id() as i32),
        nix::sys::signal::SIGTERM,
    );
    engine.wait().unwrap();
}

/// A data dir under a directory only root may search (`/root/...`, a `mktemp -d`): the sandbox's
/// root, an unprivileged host uid, never needs to traverse it.
#[tokio::test]
async fn a_data_dir_under_a_private_directory_works() {
    require_sandboxes!();
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    assert_eq!(
        sh(&client, &id, "echo fine; ls / | grep -c usr").await,
        "fine\n1\n"
    );
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
}

/// The host's cgroup2 mount: its mount point, its own options and its hierarchy's options.
fn cgroup2_mount() -> Option<(String, String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = sandbox_mcp_sys::mounts::mounts(&info).find(|m| m.fstype == "cgroup2")?;
    Some((
        mount.point.to_string(),
        mount.options.to_string(),
        mount.super_options.to_string(),
    ))
}

/// As root, the engine turns on the cgroup2 hierarchy's `favordynmods` (a launcher then joins
/// its sandbox's cgroups without waiting for an RCU grace period) and keeps every other option
/// of the mount; with `SANDBOX_MCP_FAVORDYNMODS=off` it leaves the mount alone. (Other tests'
/// engines may turn the option on meanwhile: the `off` case is judged by its engine's log.)
#[tokio::test]
async fn the_engine_turns_on_favordynmods_keeping_the_mounts_other_options() {
    require_cgroups!();
    let Some((target, own, hierarchy)) = cgroup2_mount() else {
        eprintln!("SKIPPED: needs a cgroup2 mount (the kernel's unified hierarchy)");
        return;
    };
    let without = |options: &str| -> Vec<String> {
        options
            .split(',')
            .filter(|o| *o != "favordynmods")
            .map(str::to_string)
            .collect()
    };
    let (own, hierarchy) = (without(&own), without(&hierarchy));
    // Off, as a host that never had it.
    let options = [own.clone(), hierarchy.clone()].concat().join(",");
    let off = Command::new("mount")
        .args(["-o", &format!("remount,{options}"), "cgroup2", &target])
        .status()
        .unwrap();
    assert!(off.success(), "cannot remount {target} with {options}");

    let run = |env: &'static [(&'static str, &'static str)]| async move {
        let data = crate::common::TempData::new();
        let log = data.data().with_extension("log");
        let (mut child, _url) = crate::common::spawn_engine_logged(
            &data.data(),
            env,
            std::fs::File::create(&log).unwrap().into(),
        )
        .await;
        child.kill().unwrap();
        child.wait().unwrap();
        crate::common::kill_left_behind(&data.data());
        std::fs::read_to_string(&log).unwrap()
    };
    let log = run(&[("RUST_LOG", "info"), ("SANDBOX_MCP_FAVORDYNMODS", "off")]).await;
    assert!(
        !log.contains("favordynmods"),
        "with the option off the engine changed the mount: {log}"
    );
    let log = run(&[("RUST_LOG", "info")]).await;
    let (_, own_after, hierarchy_after) = cgroup2_mount().unwrap();
    assert!(
        hierarchy_after.split(',').any(|o| o == "favordynmods"),
        "favordynmods is not on after an engine start: {hierarchy_after}; log: {log}"
    );
    assert_eq!(without(&own_after), own, "the mount's own flags changed");
    assert_eq!(
        without(&hierarchy_after),
        hierarchy,
        "the hierarchy's other options changed"
    );
}
