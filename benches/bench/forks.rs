//! Snapshots and forks: the issue's workspace (20,000 files, 100 MB) snapshotted, restored and
//! forked, on the btrfs store and on the copy path.

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
        "A snapshot, and each child of a fork, starts as a copy of the sandbox's own files only \
         (its overlay upper directory): the template's layers underneath are shared read-only by \
         every sandbox and are never copied. On the btrfs store that copy is a copy-on-write \
         subvolume snapshot, which copies none of the files' bytes; on the copy path (a plain \
         store: no root, no btrfs, or `SANDBOX_MCP_DISK_LIMITS=off`) the sandbox's own files \
         are copied, here all 100 MB of them for each snapshot, restore or child. A fork's \
         children are copied side by side, then start their agents in parallel, and the \
         call returns once all of them are running. Every figure is the wall time of HTTP API \
         calls, with the issue's workspace (20,000 files of 5,000 bytes, 100 MB) in the sandbox.",
    );
    if method == "btrfs" {
        let copy = Engine::start_with(&[("SANDBOX_MCP_DISK_LIMITS", "off")]);
        if let Err(why) = fork_path(&copy, 3, out, Some("copy")) {
            eprintln!("fork figures on the copy path FAILED: {why}");
            text.push_str(&format!(" The copy path was not measured: {why}."));
        }
    } else {
        text.push_str(&format!(
            " The btrfs store was not available on this machine (the default engine's snapshots \
             came back with method `{method}`), so only the copy path was measured."
        ));
    }
    text.push('\n');
    text
}

/// The fork and snapshot figures of one engine, `runs` samples each; the copy method its
/// snapshots used (`expect`: the one it must use, or the figures are not taken).
fn fork_path(
    engine: &Engine,
    runs: usize,
    out: &mut Vec<Figure>,
    expect: Option<&str>,
) -> Result<String, String> {
    let id = engine.create();
    let built = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": WORKSPACE, "timeout_ms": 120000})),
    )?;
    if built["exit_code"] != 0 {
        return Err(format!("the workspace was not written: {built}"));
    }
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
        "copy path"
    };
    let name = |what: &str| format!("Forks ({path}): {what}");
    // The issue's targets are for the btrfs store; the copy path's figures stand beside them.
    let btrfs_target = |t: (f64, &'static str)| (method == "btrfs").then_some(t);
    let note = |what: &str| format!("HTTP API call wall time, {WORKSPACE_NOTE}; {what}");

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
            btrfs_target(if count == 1 {
                (30.0, "≤ 30 ms")
            } else {
                (100.0, "≤ 100 ms")
            }),
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
        btrfs_target((20.0, "≤ 20 ms")),
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
        btrfs_target((30.0, "≤ 30 ms")),
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
        btrfs_target((100.0, "≤ 100 ms")),
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
