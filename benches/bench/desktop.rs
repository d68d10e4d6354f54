//! Computer use: a desktop's start, screenshots, input, and what an idle one costs.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::figures::{Figure, figure, ms};
use crate::memory::cgroup_memory;
use crate::servers::{Engine, Mcp};

/// The Tk app the desktop tests drive: a real window with text on the screen.
const DESKTOP_APP: &str = include_str!("../../tests/fixtures/desktop/app.py");

pub(crate) fn desktop_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Computer use\n\n";
    if !Path::new("/usr/bin/Xvfb").exists() {
        return format!(
            "{heading}Not measured: this machine has no Xvfb (apt-get install xvfb).\n"
        );
    }
    let engine = Engine::start();
    match measure_desktop(&engine, out) {
        Ok(text) => format!("{heading}{text}\n"),
        Err(why) => {
            eprintln!("desktop figures FAILED: {why}");
            format!("{heading}Not (all) measured: {why}\n")
        }
    }
}

fn png_bytes(shot: &Value) -> Result<usize, String> {
    use base64::Engine as _;
    let data = shot["png_base64"]
        .as_str()
        .ok_or_else(|| format!("no image in {shot}"))?;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map(|b| b.len())
        .map_err(|e| e.to_string())
}

fn measure_desktop(engine: &Engine, out: &mut Vec<Figure>) -> Result<String, String> {
    // create → first screenshot, each on a new desktop.
    let mut first = Vec::new();
    for _ in 0..10 {
        let begun = Instant::now();
        let made = engine.call("POST", "/v1/computers", Some(json!({})))?;
        let id = made["id"].as_str().unwrap().to_string();
        engine.call(
            "GET",
            &format!("/v1/sandboxes/{id}/desktop/screenshot"),
            None,
        )?;
        first.push(ms(begun.elapsed()));
        engine.kill(&id);
    }
    out.push(figure(
        "Desktop: computer_create → first screenshot (1280×800)",
        "ms",
        first,
        None,
        "HTTP API: a new sandbox, its display server and window manager started, then one PNG",
    ));

    // An idle desktop's memory: display server, window manager and agent, nothing else.
    let idle = engine.call("POST", "/v1/computers", Some(json!({})))?;
    let idle_id = idle["id"].as_str().unwrap().to_string();
    engine.call(
        "GET",
        &format!("/v1/sandboxes/{idle_id}/desktop/screenshot"),
        None,
    )?;
    std::thread::sleep(Duration::from_secs(2));
    if let Some(bytes) = cgroup_memory(&idle_id) {
        out.push(figure(
            "Desktop: memory of an idle desktop sandbox",
            "MiB",
            vec![bytes as f64 / 1024.0 / 1024.0],
            None,
            "its memory cgroup after one screenshot: Xvfb, matchbox and the agent (page cache included)",
        ));
    }
    engine.kill(&idle_id);

    // One desktop with the app on screen for the rest.
    let made = engine.call("POST", "/v1/computers", Some(json!({})))?;
    let id = made["id"].as_str().unwrap().to_string();
    engine.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/app.py", "content": DESKTOP_APP})),
    )?;
    let started = engine.exec(
        &id,
        "python3 /root/app.py /root/log.jsonl > /root/app.out 2>&1 &
         for i in $(seq 100); do grep -q ready /root/log.jsonl 2>/dev/null && break; sleep 0.1; done
         grep -c ready /root/log.jsonl",
    );
    if started["stdout"].as_str().unwrap_or("").trim() != "1" {
        return Err(format!("the app did not start: {started}"));
    }
    let shot_path = format!("/v1/sandboxes/{id}/desktop/screenshot");
    let mut round = Vec::new();
    let mut sizes = Vec::new();
    for _ in 0..50 {
        let begun = Instant::now();
        let shot = engine.call("GET", &shot_path, None)?;
        round.push(ms(begun.elapsed()));
        sizes.push(png_bytes(&shot)? as f64 / 1024.0);
    }
    out.push(figure(
        "Desktop: screenshot round trip, 1280×800 PNG",
        "ms",
        round,
        Some((50.0, "≤ 50 ms p50")),
        "HTTP API: grab, pointer drawn in, PNG encoded in the sandbox's agent, base64 in JSON",
    ));
    out.push(figure(
        "Desktop: PNG size per screenshot, 1280×800, the test app on screen",
        "KiB",
        sizes,
        None,
        "a white window with a button, an entry and a canvas",
    ));
    let mut half = Vec::new();
    let mut half_sizes = Vec::new();
    for _ in 0..20 {
        let begun = Instant::now();
        let shot = engine.call("GET", &format!("{shot_path}?scale=0.5"), None)?;
        half.push(ms(begun.elapsed()));
        half_sizes.push(png_bytes(&shot)? as f64 / 1024.0);
    }
    out.push(figure(
        "Desktop: screenshot round trip at scale 0.5 (640×400)",
        "ms",
        half,
        None,
        "box-filtered before encoding",
    ));
    out.push(figure(
        "Desktop: PNG size at scale 0.5",
        "KiB",
        half_sizes,
        None,
        "the same screen",
    ));

    // Through MCP: the image content the model gets.
    let mut mcp = Mcp::spawn(&engine.url);
    mcp.initialize();
    let mut via_mcp = Vec::new();
    for _ in 0..20 {
        let begun = Instant::now();
        let r = mcp.call("computer_screenshot", json!({"sandbox_id": id}));
        via_mcp.push(ms(begun.elapsed()));
        if r["result"]["content"][1]["type"] != "image" {
            return Err(format!("no image content: {}", r["result"]));
        }
    }
    out.push(figure(
        "Desktop: computer_screenshot through MCP (stdio), 1280×800",
        "ms",
        via_mcp,
        None,
        "the MCP server's image content: the PNG once, as base64",
    ));

    let act = format!("/v1/sandboxes/{id}/desktop/actions");
    let mut clicks = Vec::new();
    for i in 0..50 {
        let begun = Instant::now();
        engine.call(
            "POST",
            &act,
            Some(json!({"action": "click", "x": 1000 + (i % 10), "y": 700})),
        )?;
        clicks.push(ms(begun.elapsed()));
    }
    out.push(figure(
        "Desktop: click round trip",
        "ms",
        clicks,
        None,
        "HTTP API: pointer moved, button pressed and released through XTEST, server synced",
    ));
    let mut clicked_shot = Vec::new();
    for i in 0..10 {
        let begun = Instant::now();
        engine.call(
            "POST",
            &act,
            Some(json!({"action": "click", "x": 1000 + i, "y": 700, "screenshot": true})),
        )?;
        clicked_shot.push(ms(begun.elapsed()));
    }
    out.push(figure(
        "Desktop: click with `screenshot: true`",
        "ms",
        clicked_shot,
        None,
        "the screenshot waits until two grabs 40 ms apart agree",
    ));
    engine.call(
        "POST",
        &act,
        Some(json!({"action": "click", "x": 400, "y": 270})),
    )?;
    let ascii: String =
        "The quick brown fox jumps over the lazy dog. ".repeat(23)[..1000].to_string();
    let other: String = ('А'..='я').chain('α'..='ω').cycle().take(1000).collect();
    for (label, text) in [("ASCII", &ascii), ("Cyrillic and Greek", &other)] {
        let mut typed = Vec::new();
        for _ in 0..5 {
            let begun = Instant::now();
            engine.call("POST", &act, Some(json!({"action": "type", "text": text})))?;
            typed.push(ms(begun.elapsed()));
            engine.call(
                "POST",
                &act,
                Some(json!({"action": "key", "keys": "ctrl+a"})),
            )?;
        }
        out.push(figure(
            &format!("Desktop: type 1,000 characters, {label}"),
            "ms",
            typed,
            None,
            "until the display server has taken every key event (the app reads them after)",
        ));
    }
    engine.kill(&id);
    Ok(
        "Desktops are sandboxes of the built-in `desktop` template running Xvfb and matchbox; \
         the agent in each is the X client that grabs the screen and sends input. Screenshots \
         and actions are timed through the HTTP API (one call each), and once through the MCP \
         server to show what the model's image content adds."
            .to_string(),
    )
}
