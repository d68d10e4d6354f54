//! The engine's own paths through its HTTP API: create, exec, files, pause and resume, kill, and
//! the engine process's memory, against the host's floor for each.

use std::process::Command;

use serde_json::json;

use crate::figures::{Figure, figure, ms, time};
use crate::servers::{Engine, networking};

pub(crate) fn engine_figures(engine: &Engine, out: &mut Vec<Figure>) {
    // Floor: a bare fork+exec of `true` on the host.
    let mut samples = Vec::new();
    for _ in 0..200 {
        let (d, s) = time(|| Command::new("/bin/true").status().unwrap());
        assert!(s.success());
        samples.push(ms(d));
    }
    out.push(figure(
        "Floor: fork+exec of /bin/true on the host",
        "ms",
        samples,
        None,
        "std::process::Command",
    ));

    // create → first exec result.
    let mut samples = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..40 {
        let (d, id) = time(|| {
            let id = engine.create();
            let r = engine.exec(&id, "true");
            assert_eq!(r["exit_code"], 0);
            id
        });
        samples.push(ms(d));
        ids.push(id);
    }
    let (label, how) = networking(engine, &ids[0]);
    out.push(figure(
        &format!("Engine: create → first exec result (`true`), {label}"),
        "ms",
        samples,
        Some((15.0, "≤ 15 ms")),
        &format!("HTTP API, base template; {how}"),
    ));
    for id in ids.drain(..) {
        engine.kill(&id);
    }

    let id = engine.create();
    let mut samples = Vec::new();
    for _ in 0..300 {
        let (d, _) = time(|| engine.exec(&id, "true"));
        samples.push(ms(d));
    }
    out.push(figure(
        "Engine: exec round trip in a warm sandbox (`true`)",
        "ms",
        samples,
        Some((2.0, "≤ 2 ms")),
        "HTTP API",
    ));

    // run_code: warm round trip of `1+1` in the default Python context.
    let code = |c: &str| {
        engine.send(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(json!({"code": c})),
        )
    };
    assert_eq!(code("1+1")["result"], "2");
    let mut samples = Vec::new();
    for _ in 0..300 {
        let (d, r) = time(|| code("1+1"));
        assert_eq!(r["result"], "2");
        samples.push(ms(d));
    }
    out.push(figure(
        "Engine: run_code `1+1`, warm Python context",
        "ms",
        samples,
        Some((5.0, "≤ 5 ms")),
        "HTTP API",
    ));
    let node = |c: &str| {
        engine.send(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(json!({"code": c, "language": "node"})),
        )
    };
    assert_eq!(node("1+1")["result"], "2");
    let mut samples = Vec::new();
    for _ in 0..300 {
        let (d, _) = time(|| node("1+1"));
        samples.push(ms(d));
    }
    out.push(figure(
        "Engine: run_code `1+1`, warm Node.js context",
        "ms",
        samples,
        None,
        "HTTP API",
    ));

    let (mut pause, mut resume) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let (d, _) = time(|| engine.send("POST", &format!("/v1/sandboxes/{id}/pause"), None));
        pause.push(ms(d));
        let (d, _) = time(|| engine.send("POST", &format!("/v1/sandboxes/{id}/resume"), None));
        resume.push(ms(d));
    }
    out.push(figure(
        "Engine: pause (freeze) round trip",
        "ms",
        pause,
        Some((1.0, "≤ 1 ms")),
        "HTTP API, includes the state commit",
    ));
    out.push(figure(
        "Engine: resume (thaw) round trip",
        "ms",
        resume,
        Some((1.0, "≤ 1 ms")),
        "HTTP API, includes the state commit",
    ));

    // 1 GiB of stdout: drain rate and the engine's peak RSS.
    let before = engine.status_kib("VmHWM:");
    let mut rates = Vec::new();
    for _ in 0..3 {
        let (d, r) = time(|| engine.exec(&id, "yes | head -c 1073741824"));
        assert_eq!(r["stdout_bytes"], 1_073_741_824u64);
        rates.push(1024.0 / d.as_secs_f64());
    }
    let peak = engine.status_kib("VmHWM:");
    out.push(figure(
        "Engine: 1 GiB of stdout through exec, drain rate",
        "MiB/s",
        rates,
        None,
        "yes | head -c 1G, capped to 32 KiB",
    ));
    out.push(Figure {
        name: "Engine: peak RSS after draining 3 × 1 GiB".into(),
        unit: "MiB",
        median: peak as f64 / 1024.0,
        p95: f64::NAN,
        target: Some((50.0, "≤ 50 MiB")),
        note: format!("VmHWM of the engine process ({} MiB before)", before / 1024),
    });
    engine.kill(&id);
}
