//! Templates: starting from a built or imported template and from a warm pool, a cached rebuild,
//! importing an image, and the disk sandboxes of one template share.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use sandbox_mcp_testkit::images;

use crate::figures::{Figure, figure, ms, time};
use crate::servers::{Engine, KEY};

/// Polls the template until it is no longer building; its final state.
fn template_ready(engine: &Engine, name: &str) -> Value {
    loop {
        let t = engine.send("GET", &format!("/v1/templates/{name}"), None);
        if t["status"] != "building" {
            assert_eq!(t["status"], "ready", "{t}");
            return t;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A `docker save` archive: a static busybox userland, then `blobs` files of `blob_mib` MiB of
/// random bytes each (incompressible, as real layers' binaries mostly are).
fn bench_image(blobs: usize, blob_mib: usize) -> Vec<u8> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let blobs: Vec<(String, Vec<u8>)> = (0..blobs)
        .map(|i| {
            let data: Vec<u8> = (0..blob_mib << 17)
                .flat_map(|_| {
                    // xorshift: fast, and enough to defeat any compression.
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed.to_le_bytes()
                })
                .collect();
            (format!("data/blob{i}"), data)
        })
        .collect();
    let files: Vec<(&str, &[u8], u32)> = blobs
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice(), 0o644))
        .collect();
    images::docker_save(
        &[images::busybox_layer(), images::layer(&files, &[])],
        json!({"Env": ["PATH=/bin"]}),
    )
}

/// Bytes allocated under `dir` (`du`), the way a disk fills.
fn du_bytes(dir: &Path) -> u64 {
    let out = Command::new("du").arg("-sb").arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn template_figures(out: &mut Vec<Figure>) -> String {
    if !Path::new("/bin/busybox").exists() {
        return "\n## Templates\n\nNot measured: needs busybox-static (`/bin/busybox`).\n".into();
    }
    let engine = Engine::start();
    if engine.call("GET", "/v1/templates/base", None).is_err() {
        // An older build (A/B mode's baseline, say) that cannot make templates.
        return "\n## Templates\n\nNot measured: this build has no template API.\n".into();
    }
    let data = engine._dir.path().join("data");
    let build = |name: &str, steps: Value, warm: u32| {
        engine.send(
            "POST",
            "/v1/templates",
            Some(json!({"name": name, "steps": steps, "warm": warm})),
        );
        template_ready(&engine, name)
    };
    let steps = json!([{"run": "mkdir -p /opt/tool && head -c 1048576 /dev/urandom > /opt/tool/blob"}, {"env": {"TOOL": "1"}}]);
    let (first, _) = time(|| build("tool", steps.clone(), 0));

    // An unchanged rebuild: every step a cache hit.
    let mut cached = Vec::new();
    for i in 0..20 {
        let (d, _) = time(|| build(&format!("tool-{i}"), steps.clone(), 0));
        cached.push(ms(d));
    }
    out.push(figure(
        "Templates: rebuild with every step cached, create → ready",
        "ms",
        cached,
        None,
        &format!(
            "HTTP API, polled every 1 ms; the first build of the same steps took {:.0} ms",
            ms(first)
        ),
    ));

    // Import rate: a 200 MiB image through the API (streamed upload, digests, unpacking).
    let image = bench_image(20, 10);
    let mb = image.len() as f64 / 1e6;
    let mut rates = Vec::new();
    for i in 0..3 {
        let (d, r) = time(|| {
            Engine::http()
                .put(format!("{}/v1/templates/big-{i}/image", engine.url))
                .bearer_auth(KEY)
                .header("content-type", "application/octet-stream")
                .body(image.clone())
                .send()
                .unwrap()
        });
        assert_eq!(r.status().as_u16(), 201, "{:?}", r.text());
        rates.push(mb / d.as_secs_f64());
    }
    out.push(figure(
        &format!("Templates: import a {mb:.0} MB image (docker save, uncompressed layers)"),
        "MB/s",
        rates,
        None,
        "PUT /v1/templates/{name}/image from memory: upload to disk, SHA-256 of every layer, unpacking",
    ));

    // create → first exec: base, the built template and the imported image, in turns. The
    // sandboxes are killed afterwards, as in the engine figures: a kill's teardown (network
    // namespace, subvolume) would otherwise run under the next create.
    let mut alive = Vec::new();
    let mut start = |template: &str| {
        let (d, id) = time(|| {
            let id =
                engine.send("POST", "/v1/sandboxes", Some(json!({"template": template})))["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
            assert_eq!(engine.exec(&id, "true")["exit_code"], 0);
            id
        });
        alive.push(id);
        ms(d)
    };
    let (mut base, mut built, mut imported) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..40 {
        base.push(start("base"));
        built.push(start("tool"));
        imported.push(start("big-0"));
    }
    let diff = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<_>>();
    let (built_diff, imported_diff) = (diff(&built, &base), diff(&imported, &base));
    out.push(figure(
        "Templates: create → first exec, base (interleaved with the two below)",
        "ms",
        base,
        None,
        "HTTP API",
    ));
    out.push(figure(
        "Templates: create → first exec, built template (1 layer over base)",
        "ms",
        built,
        None,
        "HTTP API",
    ));
    out.push(figure(
        "Templates: create → first exec, imported image (3 layers, own userland)",
        "ms",
        imported,
        None,
        "HTTP API; busybox `true` from the image",
    ));
    out.push(figure(
        "Templates: built template − base, per pair of runs",
        "ms",
        built_diff,
        Some((2.0, "≤ 2 ms")),
        "difference of each round's two runs",
    ));
    out.push(figure(
        "Templates: imported image − base, per pair of runs",
        "ms",
        imported_diff,
        Some((2.0, "≤ 2 ms")),
        "difference of each round's two runs",
    ));

    // A warm pool: each create hands out a started sandbox. Back to back, as every other round
    // trip here is measured: a pool of 16, taken 15 at a time (the replacements start 200 ms
    // after each handover, so none runs meanwhile), then refilled, twice.
    build("burst", steps.clone(), 16);
    let mut burst = Vec::new();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_secs(5));
        for _ in 0..15 {
            burst.push(start("burst"));
        }
    }
    out.push(figure(
        "Templates: create → first exec from a warm pool",
        "ms",
        burst,
        Some((3.0, "≤ 3 ms")),
        "HTTP API, `warm: 16`, creates back to back (each followed by its first exec), 15 at a time from a full pool",
    ));
    // The same with the machine idle in between, as an agent's think time leaves it: each call
    // then also pays the idle CPUs' wake-up (see the exec round trip after idle below).
    build("pooled", steps.clone(), 2);
    let mut warm = Vec::new();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(300));
        warm.push(start("pooled"));
    }
    out.push(figure(
        "Templates: create → first exec from a warm pool, 300 ms idle before each",
        "ms",
        warm,
        None,
        "HTTP API, `warm: 2`, 300 ms between creates for the pool to refill",
    ));
    // The machine's own floor under any command: starting `sh -c true` on the host and waiting
    // for it, with no sandbox and no engine in between.
    let mut spawn = Vec::new();
    for _ in 0..100 {
        let (d, status) = time(|| {
            std::process::Command::new("/bin/sh")
                .args(["-c", "true"])
                .status()
                .unwrap()
        });
        assert!(status.success());
        spawn.push(ms(d));
    }
    out.push(figure(
        "Templates: host floor, `sh -c true` started and waited for (no sandbox, no engine)",
        "ms",
        spawn,
        None,
        "std::process::Command on the host; what every exec pays before anything of ours",
    ));
    // What of that is the exec itself: round trips in one of those sandboxes, in the same run.
    let id = alive.last().unwrap().clone();
    let mut rtt = Vec::new();
    for _ in 0..100 {
        let (d, _) = time(|| engine.exec(&id, "true"));
        rtt.push(ms(d));
    }
    out.push(figure(
        "Templates: exec round trip in a sandbox from the pool (`true`)",
        "ms",
        rtt,
        None,
        "HTTP API; the floor under the figures above",
    ));
    let mut idle = Vec::new();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(300));
        let (d, _) = time(|| engine.exec(&id, "true"));
        idle.push(ms(d));
    }
    out.push(figure(
        "Templates: the same round trip after 300 ms idle",
        "ms",
        idle,
        None,
        "HTTP API; what the idle pause adds to any call on this machine",
    ));
    for id in alive {
        engine.kill(&id);
    }

    // Disk: ten sandboxes of the imported image share its layers.
    let layer_bytes = du_bytes(&data.join("layers"));
    let sandboxes = data.join("sandboxes");
    let before = du_bytes(&sandboxes);
    let ids: Vec<String> = (0..10)
        .map(|_| {
            let id = engine.send("POST", "/v1/sandboxes", Some(json!({"template": "big-0"})))["id"]
                .as_str()
                .unwrap()
                .to_string();
            engine.exec(&id, "cat /data/blob0 > /dev/null");
            id
        })
        .collect();
    let per_sandbox = du_bytes(&sandboxes).saturating_sub(before) as f64 / 10.0 / 1024.0;
    for id in ids {
        engine.kill(&id);
    }
    out.push(Figure {
        name: format!("Templates: disk per sandbox, 10 from one {mb:.0} MB image"),
        unit: "KiB",
        median: per_sandbox,
        p95: f64::NAN,
        target: None,
        note: format!(
            "`du` of the sandbox store, delta / 10; the layers themselves: {:.0} MiB on disk once, whatever the count",
            layer_bytes as f64 / (1 << 20) as f64
        ),
    });
    String::new()
}
