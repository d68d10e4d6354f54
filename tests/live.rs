//! Forks that carry running processes (CRIU): a child gets the parent's code contexts with their
//! variables, its background jobs and servers still running, and is a sandbox of its own —
//! restored processes are confined like the child's own commands. Without CRIU, forks copy files
//! and say why nothing more.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{TestEngine, api, create, err, ok, sh};
use crate::require_sandboxes;

mod hibernation;
mod limits;
mod pids;
mod snapshots;
mod stopped;

/// Whether this engine can carry processes; skips (naming CRIU) or, in CI, fails when not.
fn live(engine: &TestEngine) -> bool {
    let live = &engine.manager.driver().capabilities().live_state;
    if live.available {
        return true;
    }
    assert!(
        std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
        "CRIU 4.0 or later is required here (.ci/run builds it): {}",
        live.detail
    );
    eprintln!("SKIPPED: forks with memory need CRIU: {}", live.detail);
    false
}

/// An engine that can carry processes, and an MCP client of it; `None` (skipped, or failed in
/// CI) without CRIU.
async fn live_engine() -> Option<(TestEngine, crate::common::McpClient)> {
    let engine = TestEngine::start().await;
    if !live(&engine) {
        return None;
    }
    let client = engine.mcp().await;
    Some((engine, client))
}

async fn code(client: &crate::common::McpClient, id: &str, code: &str) -> Value {
    ok(
        client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": code, "language": "python"}),
    )
    .await
}

/// A counter job: one more in /tmp/count every 0.1 s, written whole (renamed into place: a
/// reader never sees the file truncated and not yet written).
const COUNTER: &str =
    "i=0; while :; do i=$((i+1)); echo $i > /tmp/next; mv /tmp/next /tmp/count; sleep 0.1; done";

async fn background(client: &crate::common::McpClient, id: &str, command: &str) {
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": command, "background": true}),
    )
    .await;
}

/// The counter's last value; it is waited for (10 s at most) when the counter, just started in
/// the background, has not written it yet.
async fn count(client: &crate::common::McpClient, id: &str) -> u64 {
    let read =
        "for i in $(seq 500); do [ -f /tmp/count ] && break; sleep 0.02; done; cat /tmp/count";
    sh(client, id, read).await.trim().parse().unwrap()
}

/// Waits (30 s at most) until sandbox `id`'s counter is more than `by` above what it reads
/// now; fails with `what` if it is not.
async fn counts_on(client: &crate::common::McpClient, id: &str, by: u64, what: &str) {
    let from = count(client, id).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while count(client, id).await <= from + by {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A GET through a preview URL (`http://{host}:{port}/?preview_token=…`), body returned.
async fn through_preview(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, query) = rest.split_once('/').unwrap();
    let port: u16 = host.rsplit_once(':').unwrap().1.parse().unwrap();
    let token = query
        .strip_prefix("?preview_token=")
        .unwrap_or("")
        .to_string();
    let host = host.to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let request = format!(
            "GET /index.html HTTP/1.1\r\nHost: {host}\r\nX-Preview-Token: {token}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(request.as_bytes()).unwrap();
        let mut data = Vec::new();
        let _ = s.read_to_end(&mut data);
        String::from_utf8_lossy(&data).to_string()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_fork_carries_the_parent_s_processes_into_each_child() {
    require_sandboxes!();
    let Some((_engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    // A context with a variable, 16 MiB of data and an open file; a counter; a web server.
    code(
        &client,
        &id,
        "x = 41\nbig = bytes(range(256)) * (64 * 1024)\nf = open('/tmp/held', 'w')\nf.write('held')\nf.flush()",
    )
    .await;
    for command in [
        COUNTER,
        "mkdir -p /srv && echo served-by-the-parent > /srv/index.html && exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv",
    ] {
        background(&client, &id, command).await;
    }
    sh(&client, &id, "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1").await;
    // A client holding a connection open to it: an established TCP connection, closed in the
    // children (its peer cannot be cloned), which must not keep the trees from being carried.
    background(&client, &id, "exec python3 -c 'import socket, time\nc = socket.create_connection((\"127.0.0.1\", 8000))\ntime.sleep(3600)'").await;
    sh(&client, &id, "for i in $(seq 100); do grep -q ':1F40 [0-9A-F]*:[0-9A-F]* 01 ' /proc/net/tcp && exit 0; sleep 0.05; done; exit 1").await;
    let parent_map = sh(&client, &id, "cat /proc/self/uid_map").await;
    let before = count(&client, &id).await;
    // A paused parent is carried too (thawed for the dump, paused again).
    ok(&client, "sandbox_pause", json!({"sandbox_id": id})).await;

    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "count": 3}),
    )
    .await;
    let parent = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(parent["status"], "paused", "{parent}");
    let memory = &forked["memory"];
    for what in ["code context python", "job job_1", "job job_2", "job job_3"] {
        assert!(
            memory["carried"].as_array().unwrap().contains(&json!(what)),
            "{what} was not carried: {forked}"
        );
    }
    assert_eq!(memory["skipped"], json!([]), "{forked}");
    let kids: Vec<String> = forked["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;

    for kid in &kids {
        // The context kept its variables, its data and its open file; each child's changes are
        // its own (every child starts from 41).
        let got = code(
            &client,
            kid,
            "x += 1\n(x, len(big), big[:3] == bytes(range(3)), f.closed)",
        )
        .await;
        assert_eq!(got["result"], "(42, 16777216, True, False)", "{got}");
        assert_eq!(code(&client, kid, "x").await["result"], "42");
        // The counter goes on from where the parent was.
        let first = count(&client, kid).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let second = count(&client, kid).await;
        assert!(
            first >= before && second > first,
            "{before} {first} {second}"
        );
        let job = ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": kid, "job_id": "job_1"}),
        )
        .await;
        assert_eq!(job["status"], "running", "{job}");
        // The server answers in the child, and through the child's own preview.
        let page = sh(&client, kid, "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:8000/index.html\").read().decode())'").await;
        assert_eq!(page.trim(), "served-by-the-parent");
        let preview = ok(
            &client,
            "sandbox_preview_create",
            json!({"sandbox_id": kid, "port": 8000}),
        )
        .await;
        let url = preview["url"].as_str().unwrap().to_string();
        assert!(url.contains(&kid.replace('_', "-")), "{preview}");
        let answer = through_preview(&url).await;
        assert!(answer.contains("served-by-the-parent"), "{answer}");

        // Restored, the interpreter is confined as the child's own commands are: its seccomp
        // filter and no_new_privs, the child's uid range and cgroup, and a Landlock domain that
        // cannot signal the agent.
        let status = code(&client, kid, "open('/proc/self/status').read()").await;
        let status = status["result"].as_str().unwrap();
        assert!(
            status.contains("Seccomp:\\t2") && status.contains("NoNewPrivs:\\t1"),
            "{status}"
        );
        let signal = code(
            &client,
            kid,
            "import os\ntry:\n    os.kill(1, 0)\n    r = 'reached the agent'\nexcept PermissionError:\n    r = 'refused'\nr",
        )
        .await;
        assert_eq!(signal["result"], "'refused'", "{signal}");
        // Nor read the agent's memory or environment, trace it, or move its OOM score.
        let takeover = code(
            &client,
            kid,
            r#"import ctypes, os
out = []
for path, mode in [('/proc/1/environ', 'r'), ('/proc/1/mem', 'r'), ('/proc/1/oom_score_adj', 'w')]:
    try:
        with open(path, mode) as f:
            f.write('-1000') if mode == 'w' else f.read(1)
        out.append('opened ' + path)
    except OSError:
        out.append('refused')
libc = ctypes.CDLL(None, use_errno=True)
out.append('traced' if libc.ptrace(16, 1, 0, 0) == 0 else 'refused')
out"#,
        )
        .await;
        assert_eq!(
            takeover["result"], "['refused', 'refused', 'refused', 'refused']",
            "{takeover}"
        );
        let restored_map = code(&client, kid, "open('/proc/self/uid_map').read()").await;
        let own_map = sh(&client, kid, "cat /proc/self/uid_map").await;
        assert_eq!(
            restored_map["result"].as_str().unwrap(),
            format!("{:?}", own_map).replace('"', "'"),
            "the restored process maps ids as the child's own commands"
        );
        assert_ne!(own_map, parent_map, "each child has its own uid range");
        let cgroup = code(&client, kid, "open('/proc/self/cgroup').read()").await;
        let own_cgroup = sh(&client, kid, "cat /proc/self/cgroup").await;
        assert_eq!(
            cgroup["result"].as_str().unwrap(),
            format!("{:?}", own_cgroup).replace('"', "'"),
        );
    }
    // The children's processes are theirs alone: killing one child's context leaves the others'.
    ok(
        &client,
        "sandbox_code_context_delete",
        json!({"sandbox_id": kids[0], "context_id": "python"}),
    )
    .await;
    assert_eq!(code(&client, &kids[1], "x").await["result"], "42");
    // And files still merge as before.
    ok(
        &client,
        "sandbox_merge_into",
        json!({"sandbox_id": kids[1], "source_id": kids[2]}),
    )
    .await;
}

#[tokio::test]
async fn without_criu_a_fork_copies_files_and_says_what_is_missing() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| {
        c.criu = sandbox_mcp_model::config::CriuSetting::Path("/nonexistent/criu".into())
    })
    .await;
    let (status, health) = api(&engine.url, "GET", "/v1/health", None).await;
    assert_eq!(status, 200);
    assert_eq!(health["live_state"]["available"], false, "{health}");
    let detail = health["live_state"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("/nonexistent/criu") && detail.contains("install CRIU"),
        "{detail}"
    );

    let client = engine.mcp().await;
    let id = create(&client).await;
    code(&client, &id, "x = 41").await;
    let refused = err(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "memory": true}),
    )
    .await;
    assert!(
        refused.contains("cannot carry processes")
            && refused.contains("install CRIU")
            && refused.contains("memory=false"),
        "{refused}"
    );
    let forked = ok(&client, "sandbox_fork", json!({"sandbox_id": id})).await;
    assert!(forked["memory"].is_null(), "{forked}");
    let kid = forked["ids"][0].as_str().unwrap();
    let fresh = code(&client, kid, "'x' in globals()").await;
    assert_eq!(fresh["result"], "False", "{fresh}");
}

/// Hostile trees: each either comes through a fork intact or is left out with why, and the
/// parent runs on as it was either way.
#[tokio::test]
async fn hostile_trees_come_through_a_fork_or_are_left_out_with_the_parent_untouched() {
    require_sandboxes!();
    let Some((engine, client)) = live_engine().await else {
        return;
    };
    let (status, made) = api(
        &engine.url,
        "POST",
        "/v1/sandboxes",
        Some(json!({"shape": {"memory_mb": 256}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let trees = [
        // A FIFO held open both ways.
        "mkfifo /tmp/fifo && exec 3<>/tmp/fifo && exec sleep 3600",
        // A file deleted while open, with data in it.
        "exec 3>/tmp/gone && echo kept >&3 && rm /tmp/gone && exec sleep 3600",
        // An inotify watch and a pty pair.
        "exec python3 -c 'import ctypes, os, time\nlibc = ctypes.CDLL(None)\nfd = libc.inotify_init()\nlibc.inotify_add_watch(fd, b\"/tmp\", 0xfff)\nm, s = os.openpty()\ntime.sleep(3600)'",
        // Threads racing: eight spinning and allocating while the dump runs.
        "exec python3 -c 'import threading, time\ndef spin():\n    while True:\n        x = [0] * 1000\nfor _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\ntime.sleep(3600)'",
        // A memory hog near its sandbox's limit (200 of 256 MB).
        "exec python3 -c 'import time\nhog = b\"x\" * (200 << 20)\ntime.sleep(3600)'",
    ];
    for command in trees {
        background(&client, &id, command).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let forked = ok(&client, "sandbox_fork", json!({"sandbox_id": id})).await;
    let memory = &forked["memory"];
    let (carried, skipped) = (
        memory["carried"].as_array().unwrap().clone(),
        memory["skipped"].as_array().unwrap().clone(),
    );
    assert_eq!(carried.len() + skipped.len(), trees.len(), "{forked}");
    for s in &skipped {
        assert!(
            s.as_str().unwrap().contains('('),
            "a skipped tree says why: {s}"
        );
    }
    // The parent runs on as it was: every job still running, commands work.
    for n in 1..=trees.len() {
        let job = ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": id, "job_id": format!("job_{n}")}),
        )
        .await;
        assert_eq!(job["status"], "running", "{job}");
    }
    assert_eq!(sh(&client, &id, "echo alive").await, "alive\n");
    // And what was carried runs in the child.
    let kid = forked["ids"][0].as_str().unwrap();
    for what in &carried {
        let job_id = what.as_str().unwrap().trim_start_matches("job ");
        let job = ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": kid, "job_id": job_id}),
        )
        .await;
        assert_eq!(job["status"], "running", "{what}: {job}");
    }
    // Hibernating it would lose what cannot be dumped: refused, and nothing is stopped.
    if !skipped.is_empty() {
        let refused = err(
            &client,
            "sandbox_pause",
            json!({"sandbox_id": id, "hibernate": true}),
        )
        .await;
        assert!(refused.contains("without losing"), "{refused}");
        for n in 1..=trees.len() {
            let job = ok(
                &client,
                "sandbox_job_status",
                json!({"sandbox_id": id, "job_id": format!("job_{n}")}),
            )
            .await;
            assert_eq!(job["status"], "running", "{job}");
        }
    }
    eprintln!("hostile trees: carried {carried:?}, skipped {skipped:?}");
}

/// A job that forks all the time is carried whole, every time: a child it forks while the rest
/// of the sandbox is being stopped for the dump is the job's, never stopped with the rest (it
/// would come back stopped and hang the job), in a hibernation and in a fork.
#[tokio::test]
async fn a_job_that_forks_all_the_time_goes_on_after_each_hibernation_and_in_forks() {
    require_sandboxes!();
    let Some((_engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    let forking = COUNTER.replace("; sleep 0.1", "");
    background(&client, &id, &forking).await;
    let goes_on = async |id: &str, when: &str| {
        counts_on(&client, id, 20, &format!("the job hangs {when}")).await;
    };
    for round in 1..=4 {
        let hibernate = json!({"sandbox_id": id, "hibernate": true});
        ok(&client, "sandbox_pause", hibernate).await;
        goes_on(&id, &format!("after hibernation {round}")).await;
    }
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "count": 2}),
    )
    .await;
    goes_on(&id, "in the parent after a fork").await;
    for child in forked["ids"].as_array().unwrap() {
        goes_on(child.as_str().unwrap(), &format!("in the fork {child}")).await;
    }
}

/// A process outside every job and code context (here a daemon whose job ended) cannot be
/// carried: a hibernation says so and stops nothing, and a fork names it among what it left.
#[tokio::test]
async fn a_process_outside_every_job_is_named_and_never_lost() {
    require_sandboxes!();
    let Some((_engine, client)) = live_engine().await else {
        return;
    };
    outsider_kept(&client, None, ("sleep 600 > /dev/null 2>&1 &", true)).await;
    // On the plain store a busy sandbox's files are stacked over a restart only when CRIU
    // carries everything that runs. Here no job or context is kept, only a daemon a command
    // left (a finished job would keep the copy path by itself): it is copied all the same, and
    // the daemon goes on.
    let plain = TestEngine::start_with(|c| {
        c.disk_limits = sandbox_mcp_model::config::DiskLimits::Off;
    })
    .await;
    let daemon = "setsid sleep 600 > /dev/null 2>&1 < /dev/null &";
    outsider_kept(&plain.mcp().await, Some("copy"), (daemon, false)).await;
}

/// A daemon left behind by `leave` (run as a job, or as a command): hibernation refuses
/// (naming it), a fork names it skipped (and is made by `method` when given), and it runs on.
async fn outsider_kept(
    client: &crate::common::McpClient,
    method: Option<&str>,
    (leave, as_job): (&str, bool),
) {
    let id = create(client).await;
    if as_job {
        background(client, &id, leave).await;
    } else {
        sh(client, &id, leave).await;
    }
    sh(client, &id, "until pgrep -x sleep; do sleep 0.05; done").await;
    let hibernate = json!({"sandbox_id": id, "hibernate": true});
    let refused = err(client, "sandbox_pause", hibernate).await;
    assert!(
        refused.contains("1 process(es) outside every job and code context"),
        "{refused}"
    );
    let info = ok(client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "running", "{info}");
    assert_eq!(sh(client, &id, "pgrep -cx sleep").await, "1\n");
    let forked = ok(client, "sandbox_fork", json!({"sandbox_id": id})).await;
    let skipped = forked["memory"]["skipped"].to_string();
    assert!(skipped.contains("outside every job"), "{forked}");
    if let Some(method) = method {
        assert_eq!(forked["method"], method, "{forked}");
    }
    assert_eq!(sh(client, &id, "pgrep -cx sleep").await, "1\n");
}
