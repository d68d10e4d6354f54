//! The MCP layer over stdio: ours, and (in the same run, against the same engine) FastMCP serving
//! the same spec, side by side: start, tools/list, tools/call against the raw HTTP call.

use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::figures::{Figure, figure, median_p95, ms, time};
use crate::servers::{Engine, Mcp, bin};

/// Whether the peer (FastMCP) can run here; installs it from PyPI when it is missing.
fn fastmcp_version() -> Result<String, String> {
    let version = || {
        Command::new("python3")
            .args(["-c", "import fastmcp, httpx; print(fastmcp.__version__)"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(v) = version() {
        return Ok(v);
    }
    eprintln!("installing fastmcp from PyPI for the side-by-side figures");
    let _ = Command::new("python3")
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg("fastmcp>=2.12,<4")
        .status();
    version().ok_or_else(|| {
        "python3 with the `fastmcp` package is not available (`pip install fastmcp`)".into()
    })
}

/// One server's figures, for the side-by-side table.
#[derive(Default)]
pub(crate) struct Side {
    pub(crate) start: (f64, f64),
    pub(crate) list: (f64, f64),
    pub(crate) call: (f64, f64),
    /// Median of the raw HTTP calls interleaved with this server's.
    pub(crate) raw: f64,
    pub(crate) overhead: f64,
    pub(crate) rss_mib: f64,
    pub(crate) list_bytes: usize,
    pub(crate) tools: usize,
}

/// Spawn → the `initialize` response read. The server is stopped after the clock stops: killing
/// a process and waiting for it is not part of its start (it was, before 2026-11-27, which added
/// its teardown, about a millisecond, to this figure).
fn start_samples(runs: usize, spawn: impl Fn() -> Mcp) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let (d, (mcp, r)) = time(|| {
                let mut mcp = spawn();
                let r = mcp.initialize();
                (mcp, r)
            });
            drop(mcp);
            assert!(r["result"]["serverInfo"].is_object(), "{r}");
            ms(d)
        })
        .collect()
}

fn list_samples(mcp: &mut Mcp, runs: usize, side: &mut Side) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let (d, r) = time(|| mcp.request("tools/list", json!({})));
            side.tools = r["result"]["tools"].as_array().unwrap().len();
            side.list_bytes = serde_json::to_vec(&r["result"]).unwrap().len();
            ms(d)
        })
        .collect()
}

/// `runs` calls through `call`, interleaved with as many raw HTTP calls of the same operation.
fn call_samples(
    engine: &Engine,
    id: &str,
    runs: usize,
    mut call: impl FnMut(&str),
) -> (Vec<f64>, Vec<f64>) {
    let (mut via, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        via.push(ms(time(|| call(id)).0));
        raw.push(ms(time(|| {
            engine.get(&format!("/v1/sandboxes/{id}")).unwrap()
        })
        .0));
    }
    (via, raw)
}

/// The MCP layer: ours, and (in the same run, against the same engine) FastMCP serving the same
/// spec. Returns the side-by-side section of the report.
pub(crate) fn mcp_figures(engine: &Engine, out: &mut Vec<Figure>, with_peer: bool) -> String {
    let peer = if with_peer {
        fastmcp_version()
    } else {
        Err("not measured in A/B mode".into())
    };
    let mut ours = Side::default();
    let mut theirs = Side::default();

    // Floor for the start figure: running the same binary to print its version, which loads it
    // and exits before any runtime, registry or MCP work.
    let samples: Vec<f64> = (0..40)
        .map(|_| {
            let (d, s) = time(|| {
                Command::new(bin())
                    .arg("--version")
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
            });
            assert!(s.success());
            ms(d)
        })
        .collect();
    out.push(figure(
        "Floor: exec of `sandbox-mcp --version`",
        "ms",
        samples,
        None,
        "loading the binary alone; the figure below includes it",
    ));

    // Process start → initialize response.
    let samples = start_samples(40, || Mcp::spawn(&engine.url));
    ours.start = median_p95(&samples);
    out.push(figure(
        "MCP: process start → initialize response",
        "ms",
        samples,
        Some((5.0, "≤ 5 ms")),
        "stdio, release binary, remote engine",
    ));
    // What a client waits for before it can offer a tool: process start → initialize → the
    // first tools/list answered (the registry is read in the background meanwhile).
    let samples: Vec<f64> = (0..40)
        .map(|_| {
            let (d, (mcp, r)) = time(|| {
                let mut mcp = Mcp::spawn(&engine.url);
                mcp.initialize();
                let r = mcp.request("tools/list", json!({}));
                (mcp, r)
            });
            drop(mcp);
            assert!(r["result"]["tools"].is_array(), "{r}");
            ms(d)
        })
        .collect();
    out.push(figure(
        "MCP: process start → first tools/list answered",
        "ms",
        samples,
        None,
        "stdio, release binary, remote engine: initialize, then the full tools/list; what a client waits for before it can offer a tool",
    ));
    let mut mcp = Mcp::spawn(&engine.url);
    mcp.initialize();
    let samples = list_samples(&mut mcp, 300, &mut ours);
    // Every tool the binary has, not a toolset.
    if let Some(all) = tool_count() {
        assert_eq!(ours.tools, all, "tools/list lists every tool");
    }
    ours.list = median_p95(&samples);
    out.push(figure(
        "MCP: tools/list round trip",
        "ms",
        samples,
        Some((1.0, "≤ 1 ms")),
        &format!(
            "all tools ({}), the full tools/list JSON over stdio",
            ours.tools
        ),
    ));

    // Per-call overhead: tools/call of "get one sandbox" minus the raw HTTP call it makes,
    // interleaved so that both series see the same machine noise.
    let id = engine.create();
    let (via_mcp, raw) = call_samples(engine, &id, 400, |id| {
        mcp.call("sandbox_info", json!({"sandbox_id": id}));
    });
    ours.raw = median_p95(&raw).0;
    ours.call = median_p95(&via_mcp);
    ours.overhead = ours.call.0 - ours.raw;
    ours.rss_mib = mcp.rss_mib();
    out.push(figure(
        "MCP: tools/call sandbox_info (stdio, end to end)",
        "ms",
        via_mcp,
        None,
        "includes the HTTP call below",
    ));
    out.push(figure(
        "HTTP: GET /v1/sandboxes/{id} (raw reqwest)",
        "ms",
        raw,
        None,
        "the same engine call without MCP",
    ));
    out.push(Figure {
        name: "MCP layer overhead per call (median difference)".into(),
        unit: "ms",
        median: ours.overhead,
        p95: f64::NAN,
        target: Some((0.2, "≤ 0.2 ms")),
        note: "tools/call minus raw HTTP, medians of the two series above".into(),
    });
    out.push(Figure {
        name: "MCP server resident memory after the calls above".into(),
        unit: "MiB",
        median: ours.rss_mib,
        p95: f64::NAN,
        target: None,
        note: "VmRSS of the stdio server process (the engine is separate)".into(),
    });
    drop(mcp);

    // The peer, measured the same way once ours has exited, so neither steals the other's CPU.
    if peer.is_ok() {
        theirs.start = median_p95(&start_samples(10, || Mcp::fastmcp(&engine.url)));
        let mut fast = Mcp::fastmcp(&engine.url);
        fast.initialize();
        theirs.list = median_p95(&list_samples(&mut fast, 100, &mut theirs));
        let (via_peer, raw) = call_samples(engine, &id, 200, |id| {
            let r = fast.call("get_sandbox", json!({"sandbox_id": id}));
            assert!(r.to_string().contains(id), "{r}");
        });
        theirs.raw = median_p95(&raw).0;
        theirs.call = median_p95(&via_peer);
        theirs.overhead = theirs.call.0 - theirs.raw;
        theirs.rss_mib = fast.rss_mib();
    }
    engine.kill(&id);
    side_by_side(&peer, &ours, &theirs)
}

pub(crate) fn side_by_side(peer: &Result<String, String>, ours: &Side, theirs: &Side) -> String {
    let mut md = String::from("\n## Side by side: FastMCP serving the same spec\n\n");
    let version = match peer {
        Ok(v) => v,
        Err(why) => {
            md.push_str(&format!("Not measured in this run: {why}.\n"));
            eprintln!("side by side SKIPPED: {why}");
            return md;
        }
    };
    md.push_str(&format!(
        "The same `openapi/sandbox-mcp.json`, served as MCP tools by FastMCP {version}'s \
         `FastMCP.from_openapi` ([benches/fastmcp_server.py](../benches/fastmcp_server.py)), over \
         stdio, against the same engine, in the same run as the table above. Calls: our \
         `sandbox_info` and FastMCP's `get_sandbox`, both one `GET /v1/sandboxes/{{id}}`, \
         each interleaved with the raw HTTP call (measured one server after the other, so that neither \
         takes the other's CPU). Medians, p95 in brackets.\n\n"
    ));
    md.push_str(
        "| Figure | sandbox-mcp | FastMCP | FastMCP ÷ sandbox-mcp |\n|---|---:|---:|---:|\n",
    );
    type Row<'a> = (&'a str, (f64, f64), (f64, f64), &'a str);
    let rows: [Row; 3] = [
        (
            "Process start → initialize response",
            ours.start,
            theirs.start,
            "ms",
        ),
        ("tools/list round trip", ours.list, theirs.list, "ms"),
        ("tools/call, end to end", ours.call, theirs.call, "ms"),
    ];
    for (name, a, b, unit) in rows {
        md.push_str(&format!(
            "| {name} | {:.3} {unit} ({:.3}) | {:.3} {unit} ({:.3}) | {:.1}× |\n",
            a.0,
            a.1,
            b.0,
            b.1,
            b.0 / a.0
        ));
    }
    md.push_str(&format!(
        "| MCP layer overhead per call (tools/call − raw HTTP: {:.3} / {:.3} ms) | {:.3} ms | {:.3} ms | {:.1}× |\n",
        ours.raw,
        theirs.raw,
        ours.overhead,
        theirs.overhead,
        theirs.overhead / ours.overhead
    ));
    md.push_str(&format!(
        "| Server resident memory | {:.1} MiB | {:.1} MiB | {:.1}× |\n",
        ours.rss_mib,
        theirs.rss_mib,
        theirs.rss_mib / ours.rss_mib
    ));
    md.push_str(&format!(
        "| tools/list: tools, bytes | {}, {} B | {}, {} B | {:.1}× (bytes) |\n",
        ours.tools,
        ours.list_bytes,
        theirs.tools,
        theirs.list_bytes,
        theirs.list_bytes as f64 / ours.list_bytes as f64
    ));
    md.push_str(&format!(
        "\nWhat the numbers leave out: FastMCP turns every operation into a tool as the spec \
         states it; ours bind {} tools through tool-defs, with annotations, output caps, \
         model-facing descriptions and error messages, validated before any HTTP call.\n",
        ours.tools
    ));
    md
}

/// How many tools `sandbox-mcp tools --json` says the binary has (None: it cannot say).
fn tool_count() -> Option<usize> {
    let out = Command::new(bin())
        .args(["tools", "--json"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["tools"].as_array().map(Vec::len)
}
