//! Snapshots and forks: the issue's workspace (20,000 files, 100 MB) snapshotted, restored and
//! forked, on the btrfs store, with stacked layers (a plain store), and on the copy path.

use serde_json::{Value, json};

use crate::figures::{Figure, figure, ms, time};
use crate::servers::Engine;

/// The issue's workspace: 20,000 files of 5,000 bytes (100 MB) in 200 directories under
/// /root/ws, written in one exec.
const WORKSPACE: &str = r#"python3 -c '
import os
for d in range(200):
    p = "/root/ws/d%03d" % d
    os.makedirs(p)
    for f in range(100):
        with open("%s/f%03d" % (p, f), "wb") as o:
            o.write(os.urandom(5000))
'"#;

/// What a sample of the fork figures carries: 20,000 files, 100 MB.
const WORKSPACE_NOTE: &str = "workspace of 20,000 files / 100 MB in the sandbox";

pub(crate) fn fork_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Snapshots and forks\n\n";
    let engine = Engine::start();
    let method = match fork_path(&engine, 10, out, None) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("fork figures FAILED: {why}");
            return format!("{heading}Not (all) measured: {why}\n");
        }
    };
    drop(engine);
    let mut text = String::from(heading);
    text.push_str(
        "A snapshot, and each child of a fork, starts from the sandbox's own files only (its \
         overlay upper directory): the template's layers underneath are shared read-only by \
         every sandbox and are never copied. On the btrfs store the upper is snapshotted \
         copy-on-write, which copies none of the files' bytes. Without one (no root, no \
         btrfs-progs, or `SANDBOX_MCP_DISK_LIMITS=off`) a sandbox that runs nothing but its \
         agent has its upper renamed into a read-only layer (method `layers`): it and each copy \
         get a new empty upper above it, so nothing is copied either, and a sandbox that wrote \
         nothing since its last layer makes none. A sandbox with jobs or REPL contexts \
         running is stacked too where CRIU carries them: they are dumped, the sandbox is \
         stopped, stacked and started again, and they are restored into it (its hibernation \
         and wake: a fork returns after both, a snapshot once it is kept, before the wake, \
         which a call right after it waits for). One that would lose something that way (an open TCP \
         connection, which a restore closes; a finished job's output the agent holds; a \
         terminal or a desktop) is copied file by file instead (method `copy`). A fork's children start their \
         agents in parallel, and the call returns once all of them are running. Every figure is \
         the wall time of HTTP API calls, with the issue's workspace (20,000 files of 5,000 \
         bytes, 100 MB) in the sandbox.",
    );
    let plain = Engine::start_with(&[("SANDBOX_MCP_DISK_LIMITS", "off")]);
    if method != "btrfs" {
        text.push_str(&format!(
            " The btrfs store was not available on this machine (the default engine's snapshots \
             came back with method `{method}`), so its figures are missing."
        ));
    } else if let Err(why) = fork_path(&plain, 10, out, Some("layers")) {
        eprintln!("fork figures with stacked layers FAILED: {why}");
        text.push_str(&format!(" Stacked layers were not measured: {why}."));
    }
    if let Err(why) = busy_path(&plain, 10, out, false) {
        eprintln!("fork figures of a busy sandbox with stacked layers FAILED: {why}");
        text.push_str(&format!(
            " A busy sandbox's stacked layers were not measured: {why}."
        ));
    }
    if let Err(why) = busy_path(&plain, 3, out, true) {
        eprintln!("fork figures on the copy path FAILED: {why}");
        text.push_str(&format!(" The copy path was not measured: {why}."));
    }
    text.push('\n');
    text
}

/// A job holding a TCP connection open (a loopback one, inside the sandbox): a restore would
/// close it, so a sandbox running it is copied.
const CONNECTED: &str = "exec python3 -c 'import socket, time\ns = socket.socket()\ns.bind((\"127.0.0.1\", 0))\ns.listen()\nc = socket.create_connection(s.getsockname())\na, _ = s.accept()\ntime.sleep(3600)'";

/// A busy sandbox: the same workspace with a background job running. `connected`: the job holds
/// a TCP connection open, which keeps forks on the copy path; else its processes are carried
/// over the sandbox's restart and its files stacked (with CRIU), `expect`ed of every call.
fn busy_path(
    engine: &Engine,
    runs: usize,
    out: &mut Vec<Figure>,
    connected: bool,
) -> Result<(), String> {
    let id = workspace(engine)?;
    let command = if connected { CONNECTED } else { "sleep 3600" };
    let job = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": command, "background": true})),
    )?;
    if job["job_id"].is_null() {
        return Err(format!("no background job started: {job}"));
    }
    let (path, expect, what) = if connected {
        let wait = "until awk '$4 == \"01\"' /proc/net/tcp | grep -q .; do sleep 0.05; done";
        engine.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": wait, "timeout_ms": 60000})),
        )?;
        (
            "copy path",
            "copy",
            "a background job holding a TCP connection open",
        )
    } else {
        (
            "stacked layers, processes carried",
            "layers",
            "a background job running",
        )
    };
    let name = |what: &str| format!("Forks ({path}): {what}");
    let note = |how: &str| format!("HTTP API call wall time, {WORKSPACE_NOTE} and {what}; {how}");
    let fork = |count: u32| -> Result<f64, String> {
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{id}/fork"),
                Some(json!({"count": count, "memory": false})),
            )
        });
        let r = r?;
        if r["method"] != expect {
            return Err(format!(
                "a fork of a busy sandbox did not use `{expect}`: {r}"
            ));
        }
        for c in r["ids"].as_array().into_iter().flatten() {
            engine.kill(c.as_str().unwrap_or(""));
        }
        Ok(ms(d))
    };
    let counts: &[u32] = if connected { &[1] } else { &[1, 8] };
    for &count in counts {
        let samples = (0..runs)
            .map(|_| fork(count))
            .collect::<Result<Vec<_>, _>>()?;
        let target = match (connected, count) {
            (true, _) => None,
            (false, 1) => Some((100.0, "≤ 100 ms")),
            (false, _) => Some((300.0, "≤ 300 ms")),
        };
        out.push(figure(
            &name(&format!("fork n={count}, call → children running")),
            "ms",
            samples,
            target,
            &note(&format!(
                "POST /v1/sandboxes/{{id}}/fork `count: {count}`; the children are killed after, untimed"
            )),
        ));
    }
    let snapshots = format!("/v1/sandboxes/{id}/snapshots");
    let exec = format!("/v1/sandboxes/{id}/exec");
    // One snapshot, and an exec right after it when `then_exec`, timed together; the snapshot
    // is deleted after, untimed.
    let snapshot = |then_exec: bool| -> Result<f64, String> {
        let (d, r) = time(|| {
            let s = engine.call("POST", &snapshots, Some(json!({})))?;
            if then_exec {
                engine.call("POST", &exec, Some(json!({"command": "true"})))?;
            }
            Ok::<_, String>(s)
        });
        let s = r?;
        if s["method"] != expect {
            return Err(format!(
                "a snapshot of a busy sandbox did not use `{expect}`: {s}"
            ));
        }
        engine.call(
            "DELETE",
            &format!("{snapshots}/{}", s["id"].as_str().unwrap_or("")),
            None,
        )?;
        Ok(ms(d))
    };
    let snaps = (0..runs)
        .map(|_| snapshot(false))
        .collect::<Result<Vec<_>, _>>()?;
    out.push(figure(
        &name("snapshot create"),
        "ms",
        snaps,
        (!connected).then_some((50.0, "≤ 50 ms")),
        &note("POST /v1/sandboxes/{id}/snapshots; deleted after, untimed"),
    ));
    if !connected {
        // A stacked snapshot answers before the sandbox has started again: what a caller that
        // goes on at once waits for in all.
        let both = (0..runs)
            .map(|_| snapshot(true))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(figure(
            &name("snapshot create, then an exec `true` answered"),
            "ms",
            both,
            None,
            &note(
                "the snapshot call and an exec right after it, back to back: the exec waits for \
                 the sandbox's restart, which the snapshot no longer waits for; deleted after, untimed",
            ),
        ));
    }
    // The job lived through all of it.
    let status = engine.call(
        "GET",
        &format!(
            "/v1/sandboxes/{id}/jobs/{}",
            job["job_id"].as_str().unwrap_or("")
        ),
        None,
    )?;
    if status["status"] != "running" {
        return Err(format!("the job did not live through the forks: {status}"));
    }
    engine.kill(&id);
    Ok(())
}

/// A new sandbox holding the issue's workspace, written in one exec.
fn workspace(engine: &Engine) -> Result<String, String> {
    let id = engine.create();
    let built = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": WORKSPACE, "timeout_ms": 120000})),
    )?;
    if built["exit_code"] != 0 {
        return Err(format!("the workspace was not written: {built}"));
    }
    Ok(id)
}

/// The fork and snapshot figures of one engine, `runs` samples each; the copy method its
/// snapshots used (`expect`: the one it must use, or the figures are not taken).
fn fork_path(
    engine: &Engine,
    runs: usize,
    out: &mut Vec<Figure>,
    expect: Option<&str>,
) -> Result<String, String> {
    let id = workspace(engine)?;
    let snapshots = format!("/v1/sandboxes/{id}/snapshots");
    let snapshot = |engine: &Engine| engine.call("POST", &snapshots, Some(json!({})));
    // One untimed snapshot: which store this is, and what a snapshot holds.
    let first = snapshot(engine)?;
    let method = first["method"].as_str().unwrap_or("unknown").to_string();
    if expect.is_some_and(|m| m != method) {
        return Err(format!("its snapshots came back with method `{method}`"));
    }
    let held_mb = first["size_bytes"].as_u64().unwrap_or(0) as f64 / 1e6;
    let snap_id = first["id"].as_str().unwrap().to_string();
    let path = if method == "btrfs" {
        "btrfs"
    } else {
        "stacked layers"
    };
    let name = |what: &str| format!("Forks ({path}): {what}");
    // The targets of each store: btrfs's, and those of the plain store (stacked layers).
    let target =
        |btrfs: (f64, &'static str), layers: Option<(f64, &'static str)>| match method.as_str() {
            "btrfs" => Some(btrfs),
            "layers" => layers,
            _ => None,
        };
    let note = |what: &str| format!("HTTP API call wall time, {WORKSPACE_NOTE}; {what}");

    // A description of a sandbox with many files: its disk use is a walk of them, which a
    // description reuses while it is recent and a metrics call makes anew.
    for (what, path, runs, detail) in [
        (
            "sandbox_info (GET /v1/sandboxes/{id})",
            format!("/v1/sandboxes/{id}"),
            100,
            "back to back: disk use from a walk of the files reused while younger than 20 times what it took",
        ),
        (
            "sandbox_metrics (GET …/metrics)",
            format!("/v1/sandboxes/{id}/metrics"),
            10,
            "back to back: disk use walked anew each time",
        ),
    ] {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (d, r) = time(|| engine.call("GET", &path, None));
            r?;
            samples.push(ms(d));
        }
        out.push(figure(&name(what), "ms", samples, None, &note(detail)));
    }

    let fork = |count: u32| -> Result<(f64, Vec<String>), String> {
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{id}/fork"),
                Some(json!({"count": count, "memory": false})),
            )
        });
        let r = r?;
        if r["method"] != method.as_str() {
            return Err(format!(
                "a fork used another method than the snapshots: {r}"
            ));
        }
        let ids: Vec<String> = r["ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some(c.as_str()?.to_string()))
            .collect();
        Ok((ms(d), ids))
    };
    for count in [1, 8] {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (t, children) = fork(count)?;
            samples.push(t);
            for c in children {
                engine.kill(&c);
            }
        }
        out.push(figure(
            &name(&format!("fork n={count}, call → children running")),
            "ms",
            samples,
            if count == 1 {
                target((30.0, "≤ 30 ms"), Some((100.0, "≤ 100 ms")))
            } else {
                target((100.0, "≤ 100 ms"), Some((300.0, "≤ 300 ms")))
            },
            &note(&format!(
                "POST /v1/sandboxes/{{id}}/fork `count: {count}` until it returns with the \
                 children running; they are killed after each run, untimed"
            )),
        ));
    }

    // Time to usable: the fork, then the first command in the child.
    let mut usable = Vec::new();
    for _ in 0..runs {
        let (d, r) = time(|| -> Result<String, String> {
            let (_, children) = fork(1)?;
            let child = children.into_iter().next().ok_or("a fork with no child")?;
            let ran = engine.call(
                "POST",
                &format!("/v1/sandboxes/{child}/exec"),
                Some(json!({"command": "true", "timeout_ms": 120000})),
            )?;
            if ran["exit_code"] != 0 {
                return Err(format!("`true` in a child failed: {ran}"));
            }
            Ok(child)
        });
        usable.push(ms(d));
        engine.kill(&r?);
    }
    out.push(figure(
        &name("fork n=1 → first exec in the child (`true`)"),
        "ms",
        usable,
        None,
        &note("the fork call, then exec `true` in the child until it returns: time to usable"),
    ));

    let mut created = Vec::new();
    for _ in 0..runs {
        let (d, r) = time(|| snapshot(engine));
        created.push(ms(d));
        let s = r?;
        engine.call(
            "DELETE",
            &format!("{snapshots}/{}", s["id"].as_str().unwrap_or("")),
            None,
        )?;
    }
    out.push(figure(
        &name("snapshot create"),
        "ms",
        created,
        target((20.0, "≤ 20 ms"), Some((50.0, "≤ 50 ms"))),
        &note(&format!(
            "POST /v1/sandboxes/{{id}}/snapshots; its size_bytes: {held_mb:.0} MB (the \
             100 MB in 4 KiB blocks); each is deleted after its run, untimed"
        )),
    ));

    let mut restored = Vec::new();
    for _ in 0..runs {
        let (d, r) = time(|| engine.call("POST", &format!("{snapshots}/{snap_id}/restore"), None));
        r?;
        restored.push(ms(d));
    }
    out.push(figure(
        &name("restore"),
        "ms",
        restored,
        target((30.0, "≤ 30 ms"), None),
        &note(
            "POST …/snapshots/{snapshot_id}/restore of the same snapshot each run: the \
             processes stopped, the files put back and the sandbox restarted on them",
        ),
    ));

    // Two siblings, one with ten files changed.
    let (_, pair) = fork(2)?;
    let [a, b] = <[String; 2]>::try_from(pair).map_err(|p| format!("a fork of 2 made {p:?}"))?;
    let changed = engine.call(
        "POST",
        &format!("/v1/sandboxes/{a}/exec"),
        Some(json!({
            "command": "for d in 0 1 2 3 4 5 6 7 8 9; do echo changed >> /root/ws/d00$d/f000; done",
            "timeout_ms": 120000,
        })),
    )?;
    if changed["exit_code"] != 0 {
        return Err(format!("the child's files were not changed: {changed}"));
    }
    let mut diffs = Vec::new();
    let mut found = Value::Null;
    // A read on either path, and cheap: as many runs as the btrfs figures.
    for _ in 0..runs.max(10) {
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{a}/diff"),
                Some(json!({"against": b})),
            )
        });
        found = r?;
        diffs.push(ms(d));
    }
    if found["modified"].as_u64().unwrap_or(0) < 10 {
        return Err(format!("the diff missed the ten changed files: {found}"));
    }
    out.push(figure(
        &name("diff of two siblings (10 files changed in one)"),
        "ms",
        diffs,
        target((100.0, "≤ 100 ms"), None),
        &note(&format!(
            "POST /v1/sandboxes/{{a}}/diff `against: b`, two children of one fork; found \
             {} added, {} removed, {} modified",
            found["added"], found["removed"], found["modified"]
        )),
    ));
    for s in [&a, &b, &id] {
        engine.kill(s);
    }
    Ok(method)
}
