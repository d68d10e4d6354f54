//! E2B's SDK against the engine (`--e2b-listen`): `Sandbox.create()` → first
//! `commands.run("true")`, beside the same through the engine's own MCP server and HTTP API, in
//! the same run on the same engine.

use std::process::Command;

use serde_json::json;

use crate::figures::{Figure, figure, ms, time};
use crate::servers::{Engine, KEY, Mcp};

const RUNS: usize = 20;

pub(crate) fn e2b_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## E2B SDKs\n\n";
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let engine = Engine::start_with(&[("SANDBOX_MCP_E2B_LISTEN", addr.as_str())]);
    let probe = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/e2b_probe.py");
    let ran = Command::new("/usr/bin/python3")
        .args([probe, &RUNS.to_string()])
        .env("E2B_API_URL", format!("http://{addr}"))
        .env("E2B_SANDBOX_URL", format!("http://{addr}"))
        .env("E2B_API_KEY", KEY)
        .output();
    let sdk: Vec<f64> = match ran {
        Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout).unwrap_or_default(),
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            eprintln!("E2B SDK figures FAILED: {why}");
            return format!(
                "{heading}Not measured: the SDK probe failed ({}).\n",
                why.lines().last().unwrap_or("")
            );
        }
        Err(e) => return format!("{heading}Not measured: cannot run python3 ({e}).\n"),
    };
    if sdk.is_empty() {
        return format!("{heading}Not measured: the SDK probe printed no samples.\n");
    }
    let note = "wall time in the client, base template; each sandbox killed after, untimed";
    out.push(figure(
        "E2B SDK (Python): Sandbox.create() → first commands.run(\"true\")",
        "ms",
        sdk,
        None,
        &format!("PyPI `e2b` over the engine's E2B listener (HTTP/2), {note}"),
    ));
    let mut mcp = Mcp::spawn(&engine.url);
    mcp.initialize();
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        let (d, id) = time(|| {
            let made = mcp.call("sandbox_create", json!({}));
            let id = made["result"]["structuredContent"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            mcp.call("sandbox_exec", json!({"sandbox_id": id, "command": "true"}));
            id
        });
        samples.push(ms(d));
        mcp.call("sandbox_kill", json!({"sandbox_id": id}));
    }
    out.push(figure(
        "E2B SDK section, our MCP server: sandbox_create → first sandbox_exec (`true`)",
        "ms",
        samples,
        None,
        &format!("the real binary over stdio, the same engine, {note}"),
    ));
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        let (d, id) = time(|| {
            let id = engine.create();
            engine.exec(&id, "true");
            id
        });
        samples.push(ms(d));
        engine.kill(&id);
    }
    out.push(figure(
        "E2B SDK section, the engine's HTTP API: create → first exec (`true`)",
        "ms",
        samples,
        None,
        &format!("the same engine, {note}"),
    ));
    format!(
        "{heading}E2B's Python SDK, unmodified, against `sandbox-mcp engine --e2b-listen`: a program \
         configured by `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` only. The rows beside \
         it do the same through the engine's MCP server and its own HTTP API, in the same run on \
         the same engine; the SDK's rows include its Python client's own time.\n"
    )
}
