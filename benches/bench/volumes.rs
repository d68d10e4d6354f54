//! Volumes and workspaces: what mounting a 20,000-file workspace adds to create → first exec,
//! beside a plain create in the same run; and reading a file through a named volume against the
//! sandbox's own layer.

use serde_json::{Value, json};

use crate::figures::{Figure, figure, ms, time};
use crate::servers::Engine;

/// Files in the benchmark's workspace, in directories of 100.
const FILES: usize = 20_000;
/// Size of the file read through each path, MiB.
const READ_MIB: u64 = 256;

pub(crate) fn volume_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Volumes and workspaces\n\n";
    let folder = tempfile::Builder::new()
        .prefix("smcpb-ws")
        .tempdir_in("/tmp")
        .unwrap();
    for i in 0..FILES {
        let dir = folder.path().join(format!("d{}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir(&dir).unwrap();
        }
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let spec = format!("repo={}", folder.path().display());
    let engine = Engine::start_with(&[("SANDBOX_MCP_WORKSPACES", &spec)]);
    if let Err(why) = measure(&engine, 15, out) {
        eprintln!("volume figures FAILED: {why}");
        return format!("{heading}Not (all) measured: {why}\n");
    }
    format!(
        "{heading}`create → first exec` is one HTTP `create_sandbox` and one `exec_command` \
         (`true`) through the engine's API, alternating a plain create with one that mounts a \
         workspace of {FILES} files (a host folder as an overlay's lower layer: nothing of it is \
         read or copied at create). Reads are `cat FILE > /dev/null` of a {READ_MIB} MiB file \
         timed inside the sandbox (warm page cache), through a named volume (a bind of a \
         directory of the engine's store) and in the sandbox's own layer (its overlay's upper, \
         in the same store).\n"
    )
}

fn measure(engine: &Engine, runs: usize, out: &mut Vec<Figure>) -> Result<(), String> {
    let create = |body: Value| -> Result<(f64, String), String> {
        let (d, r) = time(|| -> Result<String, String> {
            let s = engine.call("POST", "/v1/sandboxes", Some(body))?;
            let id = s["id"].as_str().ok_or("no id")?.to_string();
            engine.call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": "true"})),
            )?;
            Ok(id)
        });
        Ok((ms(d), r?))
    };
    let (mut plain, mut with, mut delta) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (a, id) = create(json!({}))?;
        engine.kill(&id);
        let (b, id) = create(json!({"volumes": [{"name": "repo", "path": "/root/repo"}]}))?;
        let seen = engine.exec(&id, "ls /root/repo | wc -l");
        if seen["stdout"].as_str().map(str::trim) != Some("200") {
            return Err(format!("the workspace is not mounted: {seen}"));
        }
        engine.kill(&id);
        plain.push(a);
        with.push(b);
        delta.push(b - a);
    }
    let note = "HTTP create_sandbox + exec `true`, plain and with the workspace alternating";
    out.push(figure(
        "Create → first exec, plain",
        "ms",
        plain,
        None,
        note,
    ));
    out.push(figure(
        &format!("Create → first exec, with a {FILES}-file workspace"),
        "ms",
        with,
        None,
        note,
    ));
    out.push(figure(
        "Workspace mount: added to create → first exec",
        "ms",
        delta,
        Some((2.0, "≤ 2 ms over a plain create")),
        "each run's workspace create minus the plain create just before it",
    ));
    engine.call("POST", "/v1/volumes", Some(json!({"name": "bench"})))?;
    let s = engine.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"volumes": [{"name": "bench", "path": "/vol"}]})),
    )?;
    let id = s["id"].as_str().ok_or("no id")?.to_string();
    let made = engine.exec(
        &id,
        &format!(
            "dd if=/dev/urandom of=/vol/f bs=1M count={READ_MIB} 2>/dev/null && cp /vol/f /root/f && echo ok"
        ),
    );
    if made["stdout"].as_str().map(str::trim) != Some("ok") {
        return Err(format!("cannot write the files: {made}"));
    }
    let rate = |path: &str| -> Result<f64, String> {
        let r = engine.exec(
            &id,
            &format!(
                "python3 -c 'import time,subprocess\nt=time.monotonic()\nsubprocess.run([\"cat\",\"{path}\"],stdout=subprocess.DEVNULL,check=True)\nprint({READ_MIB}/(time.monotonic()-t))'"
            ),
        );
        r["stdout"]
            .as_str()
            .unwrap_or("")
            .trim()
            .parse()
            .map_err(|_| format!("no rate: {r}"))
    };
    let (mut volume, mut own) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        volume.push(rate("/vol/f")?);
        own.push(rate("/root/f")?);
    }
    let note = format!("cat of a {READ_MIB} MiB file, warm cache, alternating");
    out.push(figure(
        "Read through a named volume",
        "MiB/s",
        volume,
        None,
        &note,
    ));
    out.push(figure(
        "Read in the sandbox's own layer",
        "MiB/s",
        own,
        None,
        &note,
    ));
    engine.kill(&id);
    Ok(())
}
