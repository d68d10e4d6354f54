//! Forks with memory (CRIU): a Python context holding 200 MB, forked with its processes, beside
//! the file-only fork of the same sandbox in the same run.

use serde_json::{Value, json};

use crate::figures::{Figure, figure, ms, time};
use crate::servers::Engine;

/// A context holding 200 MB (resident: every page written) and a variable.
const HOLD: &str = "big = b'x' * (200 << 20)\nx = 41";
/// A ticker: one line of CLOCK_MONOTONIC every 5 ms, so the longest gap in it is how long the
/// parent's processes were stopped.
const TICKER: &str = "exec python3 -c 'import time\nwhile True:\n    print(time.monotonic(), flush=True)\n    time.sleep(0.005)' > /tmp/tick.log";
/// The longest gap between ticks in the last `window` seconds, in ms (each sample covers its own
/// fork only: the sandbox shares the host's monotonic clock).
fn longest_gap(window: f64) -> String {
    format!(
        "python3 -c 'import time\nt=[float(l) for l in open(\"/tmp/tick.log\").read().split()]\nnow=time.monotonic()\nt=[a for a in t if a > now - {window:.3}]\nprint(max((b - a for a, b in zip(t, t[1:])), default=0) * 1000)'"
    )
}

pub(crate) fn live_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Forks with memory\n\n";
    let engine = Engine::start();
    let live = engine.get("/v1/health").unwrap_or(Value::Null)["live_state"].clone();
    if live["available"] != true {
        return format!("{heading}Not measured: {}\n", live["detail"]);
    }
    if let Err(why) = measure(&engine, 5, out) {
        eprintln!("live figures FAILED: {why}");
        return format!("{heading}Not (all) measured: {why}\n");
    }
    for mb in [200u64, 1024] {
        if let Err(why) = hibernation(&engine, mb, 3, out) {
            eprintln!("hibernation figures FAILED: {why}");
            return format!("{heading}Hibernation not (all) measured: {why}\n");
        }
    }
    format!(
        "{heading}A fork with memory dumps each of the parent's process trees with CRIU ({}), \
         leaving them stopped while the parent's files are copied, then restores them into each \
         child in turn. Here the parent holds a Python context with 200 MB of resident data and a \
         ticker job; `parent stopped` is the longest gap in the ticker's output around a fork \
         (measured inside the sandbox). The file-only fork of the same sandbox (`memory: false`) \
         is measured in the same run. Hibernation writes a sandbox's processes to the engine's \
         data directory (ext4 here) and stops them; `wake` is the first `run_code` after it, which \
         restarts the sandbox and restores them; `memory after` is the sandbox's cgroup charge \
         once hibernated.\n",
        live["detail"].as_str().unwrap_or("criu")
    )
}

fn measure(engine: &Engine, runs: usize, out: &mut Vec<Figure>) -> Result<(), String> {
    let id = engine.create();
    let held = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/code"),
        Some(json!({"code": HOLD, "language": "python", "timeout_ms": 120000})),
    )?;
    if held["result"].is_string() || held["error"].is_object() {
        return Err(format!("the context did not take 200 MB: {held}"));
    }
    engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": TICKER, "background": true})),
    )?;
    let fork = |count: u32, memory: bool| -> Result<(f64, Vec<String>, Value), String> {
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{id}/fork"),
                Some(json!({"count": count, "memory": memory})),
            )
        });
        let r = r?;
        let ids = r["ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some(c.as_str()?.to_string()))
            .collect();
        Ok((ms(d), ids, r))
    };
    let note = "HTTP API call wall time until the children run; a Python context holding 200 MB \
                and a ticker job in the parent";
    for count in [1u32, 8] {
        let (mut with, mut without, mut stopped) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let started = std::time::Instant::now();
            let (t, kids, r) = fork(count, true)?;
            if r["memory"]["skipped"] != json!([]) {
                return Err(format!("a fork left processes behind: {r}"));
            }
            // The child really has the context: x is there.
            let child = kids.first().ok_or("a fork with no child")?;
            let seen = engine.call(
                "POST",
                &format!("/v1/sandboxes/{child}/code"),
                Some(json!({"code": "x", "language": "python"})),
            )?;
            if seen["result"] != "41" {
                return Err(format!("a child lost the context: {seen}"));
            }
            with.push(t);
            let gap = engine.exec(&id, &longest_gap(started.elapsed().as_secs_f64() + 0.2));
            let gap: f64 = gap["stdout"]
                .as_str()
                .unwrap_or("")
                .trim()
                .parse()
                .map_err(|_| format!("no ticker gap: {gap}"))?;
            stopped.push(gap);
            for k in kids {
                engine.kill(&k);
            }
            let (t, kids, _) = fork(count, false)?;
            without.push(t);
            for k in kids {
                engine.kill(&k);
            }
        }
        out.push(figure(
            &format!("Forks with memory: fork n={count}, 200 MB context"),
            "ms",
            with,
            Some(if count == 1 {
                (300.0, "≤ 300 ms")
            } else {
                (2400.0, "≤ 2,400 ms (8 × 300)")
            }),
            note,
        ));
        out.push(figure(
            &format!("Forks with memory: the parent stopped, n={count}"),
            "ms",
            stopped,
            Some((100.0, "≤ 100 ms")),
            "longest gap in a 5 ms ticker inside the parent, around each fork with memory",
        ));
        out.push(figure(
            &format!("Forks with memory: file-only fork n={count} of the same sandbox"),
            "ms",
            without,
            None,
            "the same fork with `memory: false`, same run",
        ));
    }
    engine.kill(&id);
    Ok(())
}

/// Hibernates a sandbox whose context holds `mb` MB, then wakes it with a call, `runs` times.
fn hibernation(engine: &Engine, mb: u64, runs: usize, out: &mut Vec<Figure>) -> Result<(), String> {
    // The base template's sandboxes get at most 1024 MB: a larger context needs a template
    // with a larger shape.
    let body = if mb + 256 > 1024 {
        let template = "bench-large";
        engine.call(
            "POST",
            "/v1/templates",
            Some(
                json!({"name": template, "steps": [{"run": "true"}], "shape": {"memory_mb": 2048}}),
            ),
        )?;
        let mut ready = false;
        for _ in 0..600 {
            let t = engine.call("GET", &format!("/v1/templates/{template}"), None)?;
            if t["status"] == "ready" {
                ready = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !ready {
            return Err("the large template was not built".into());
        }
        json!({"template": template})
    } else {
        json!({})
    };
    let made = engine.call("POST", "/v1/sandboxes", Some(body))?;
    let id = made["id"].as_str().ok_or("no sandbox id")?.to_string();
    let code = |code: &str| {
        engine.call(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(json!({"code": code, "language": "python", "timeout_ms": 120000})),
        )
    };
    code(&format!("big = b'x' * ({mb} << 20)\nx = 41"))?;
    let memory = || -> Result<f64, String> {
        let m = engine.call("GET", &format!("/v1/sandboxes/{id}/metrics"), None)?;
        Ok(m["memory_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64)
    };
    let (mut sleep, mut wake, mut before, mut after) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        before.push(memory()?);
        let (d, r) = time(|| {
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{id}/pause?hibernate=true"),
                None,
            )
        });
        r?;
        sleep.push(ms(d));
        after.push(memory()?);
        let (d, r) = time(|| code("x"));
        let r = r?;
        if r["result"] != "41" {
            return Err(format!("the context did not come back: {r}"));
        }
        wake.push(ms(d));
    }
    let per_gib = |t: f64| {
        (
            t,
            if mb >= 1024 {
                "≤ 2 s per GiB"
            } else {
                "≤ 1 s"
            },
        )
    };
    let (target_sleep, target_wake) = if mb >= 1024 {
        (per_gib(2000.0), per_gib(2000.0))
    } else {
        (per_gib(1000.0), per_gib(1000.0))
    };
    out.push(figure(
        &format!("Hibernation: {mb} MB context, hibernate"),
        "ms",
        sleep,
        Some(target_sleep),
        "POST /v1/sandboxes/{id}/pause?hibernate=true until it returns (dump written, processes stopped)",
    ));
    out.push(figure(
        &format!("Hibernation: {mb} MB context, wake (first run_code)"),
        "ms",
        wake,
        Some(target_wake),
        "run_code `x` on the hibernated sandbox until it answers: restart and restore included",
    ));
    out.push(figure(
        &format!("Hibernation: {mb} MB context, memory before"),
        "MiB",
        before,
        None,
        "the sandbox's cgroup memory charge before hibernating",
    ));
    out.push(figure(
        &format!("Hibernation: {mb} MB context, memory after"),
        "MiB",
        after,
        None,
        "the same once hibernated: what hibernation freed is the difference",
    ));
    engine.kill(&id);
    Ok(())
}
