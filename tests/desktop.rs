//! Computer use through MCP, against real desktops in real sandboxes: a Tk app (tests/fixtures/
//! desktop/app.py) logs every click, key, wheel click and drag it receives, and the tests check
//! that log against the actions sent; screenshots are decoded and their pixels checked (the app
//! is on screen, the pointer is drawn where it was moved). Then the hostile and unlucky cases:
//! coordinates off the screen, text too long, unknown keys, a sandbox that is not a desktop, a
//! paused desktop, a display server stopped behind the agent's back.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;

const APP: &str = include_str!("fixtures/desktop/app.py");

/// A decoded screenshot: RGB pixels.
struct Image {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Image {
    fn decode(png_bytes: &[u8]) -> Image {
        let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        let mut reader = decoder.read_info().expect("a PNG header");
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).expect("PNG data");
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        Image {
            width: info.width as usize,
            height: info.height as usize,
            rgb: buf,
        }
    }

    fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let at = (y * self.width + x) * 3;
        [self.rgb[at], self.rgb[at + 1], self.rgb[at + 2]]
    }

    /// Pixels in the box that are not `color`.
    fn differing(&self, x: usize, y: usize, w: usize, h: usize, color: [u8; 3]) -> usize {
        (y..(y + h).min(self.height))
            .flat_map(|py| (x..(x + w).min(self.width)).map(move |px| (px, py)))
            .filter(|&(px, py)| self.pixel(px, py) != color)
            .count()
    }
}

/// The image content of a result (asserting there is exactly one, a PNG).
fn image_of(result: &rmcp::model::CallToolResult) -> Image {
    let images: Vec<_> = result.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.len(), 1, "one image expected: {result:?}");
    assert_eq!(images[0].mime_type, "image/png");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&images[0].data)
        .unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    Image::decode(&bytes)
}

/// Skips (or fails, in CI) when the host cannot run desktops.
macro_rules! require_desktops {
    () => {
        require_sandboxes!();
        if !std::path::Path::new("/usr/bin/Xvfb").exists() {
            if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                panic!("desktops are required here but Xvfb is missing (apt-get install xvfb)");
            }
            eprintln!(
                "SKIPPED {}: needs Xvfb (apt-get install xvfb)",
                module_path!()
            );
            return;
        }
    };
}

/// A desktop with the probe app running on it; returns the sandbox id.
async fn desktop_with_app(client: &McpClient) -> String {
    let created = ok(client, "computer_create", json!({})).await;
    assert_eq!(created["template"], "desktop");
    assert_eq!(
        created["desktop"],
        json!({"width": 1280, "height": 800, "display": ":0"})
    );
    let id = created["id"].as_str().unwrap().to_string();
    ok(
        client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/app.py", "content": APP}),
    )
    .await;
    // DISPLAY is set for every command: the app needs nothing else to reach the screen.
    let out = sh(
        client,
        &id,
        "python3 /root/app.py /root/log.jsonl > /root/app.out 2>&1 &
         for i in $(seq 100); do grep -q ready /root/log.jsonl 2>/dev/null && break; sleep 0.1; done
         cat /root/log.jsonl /root/app.out",
    )
    .await;
    assert!(out.contains("\"ready\""), "the app did not start: {out}");
    id
}

/// The app's log so far, one event per line (read as a file: command output is capped, and
/// typing thousands of characters logs hundreds of KiB).
async fn events(client: &McpClient, id: &str) -> Vec<Value> {
    let file = ok(
        client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/root/log.jsonl"}),
    )
    .await;
    file["content"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (up to 10 s) until the log has an event matching `want`; returns the log.
async fn wait_for(client: &McpClient, id: &str, want: impl Fn(&Value) -> bool) -> Vec<Value> {
    let begun = Instant::now();
    loop {
        let log = events(client, id).await;
        if log.iter().any(&want) {
            return log;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(10),
            "the event never came; the log: {log:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn act(client: &McpClient, id: &str, args: Value) -> Value {
    let mut args = args;
    args["sandbox_id"] = json!(id);
    ok(client, "computer_action", args).await
}

/// The entry's text, as the app reports it when F5 is pressed.
async fn entry_text(client: &McpClient, id: &str) -> String {
    let texts = |log: &[Value]| -> Vec<String> {
        log.iter()
            .filter(|e| e["kind"] == "text")
            .map(|e| e["text"].as_str().unwrap().to_string())
            .collect()
    };
    let before = texts(&events(client, id).await).len();
    act(client, id, json!({"action": "key", "keys": "F5"})).await;
    let begun = Instant::now();
    loop {
        let now = texts(&events(client, id).await);
        if now.len() > before {
            return now[before].clone();
        }
        assert!(begun.elapsed() < Duration::from_secs(20), "F5 never came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_sees_the_desktop_clicks_types_and_sees_the_result() {
    require_desktops!();
    let engine = TestEngine::start().await;
    // What the model uses: the computer toolset. The test's own checks (writing the app,
    // reading its log) go through a client with every tool.
    let model = engine.mcp_with(Default::default(), "computer").await;
    let client = engine.mcp().await;
    let names: Vec<String> = model
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "sandbox_exec",
            "computer_create",
            "computer_screenshot",
            "computer_action",
            "computer_stop"
        ]
    );
    let id = desktop_with_app(&client).await;

    // The screen as an image: the size asked for, the app's red button where it put it.
    let shot = call(&model, "computer_screenshot", json!({"sandbox_id": id})).await;
    let meta = shot.structured_content.clone().unwrap();
    assert_eq!(meta["width"], 1280);
    assert_eq!(meta["screen_height"], 800);
    assert!(meta.get("png_base64").is_none(), "the image left the JSON");
    let image = image_of(&shot);
    assert_eq!((image.width, image.height), (1280, 800));
    assert_eq!(image.pixel(120, 110), [255, 0, 0], "the app's red button");
    assert_eq!(
        image.pixel(1200, 50),
        [255, 255, 255],
        "the app's background"
    );

    // Click the button: the app sees a click there, and the button's command runs.
    let done = act(&model, &id, json!({"action": "click", "x": 200, "y": 140})).await;
    assert_eq!(
        (done["cursor_x"].clone(), done["cursor_y"].clone()),
        (json!(200), json!(140))
    );
    wait_for(&client, &id, |e| e["kind"] == "button").await;
    let log = events(&client, &id).await;
    assert!(
        log.iter()
            .any(|e| e["kind"] == "click" && e["x"] == 200 && e["y"] == 140 && e["button"] == 1),
        "{log:#?}"
    );

    // Type ASCII and non-ASCII text into the entry, then see it on screen in the same call.
    act(&model, &id, json!({"action": "click", "x": 400, "y": 270})).await;
    let typed = "Hello, wörld! ✓ Жук €5 — 日本語 ß";
    let with_shot = call(
        &model,
        "computer_action",
        json!({"sandbox_id": id, "action": "type", "text": typed, "screenshot": true}),
    )
    .await;
    let after = image_of(&with_shot);
    assert_eq!(entry_text(&client, &id).await, typed);
    // The entry (100..900 × 250..290) was empty; now its left part holds dark glyphs.
    assert_eq!(image.differing(104, 255, 400, 30, [255, 255, 255]), 0);
    assert!(after.differing(104, 255, 400, 30, [255, 255, 255]) > 100);

    // A combination: Control held while `a` is pressed.
    act(&model, &id, json!({"action": "key", "keys": "ctrl+a"})).await;
    let log = wait_for(&client, &id, |e| {
        e["kind"] == "key" && e["keysym"] == "a" && e["state"].as_u64().unwrap() & 4 != 0
    })
    .await;
    assert!(log.iter().any(|e| e["keysym"] == "Control_L"));

    // Two wheel clicks down, over the canvas.
    act(
        &client,
        &id,
        json!({"action": "scroll", "direction": "down", "amount": 2, "x": 400, "y": 500}),
    )
    .await;
    let log = wait_for(&client, &id, |e| e["kind"] == "click" && e["button"] == 5).await;
    let wheel: Vec<_> = log
        .iter()
        .filter(|e| e["kind"] == "click" && e["button"] == 5)
        .collect();
    assert_eq!(wheel.len(), 2, "{log:#?}");
    assert_eq!(
        (wheel[0]["x"].clone(), wheel[0]["y"].clone()),
        (json!(400), json!(500))
    );

    // A drag across the canvas: pressed at one end, moved through, released at the other.
    act(
        &client,
        &id,
        json!({"action": "drag", "x": 150, "y": 400, "to_x": 500, "to_y": 600}),
    )
    .await;
    let log = wait_for(&client, &id, |e| e["kind"] == "drag_end").await;
    let start = log.iter().find(|e| e["kind"] == "drag_start").unwrap();
    let end = log.iter().find(|e| e["kind"] == "drag_end").unwrap();
    assert_eq!(
        (start["x"].clone(), start["y"].clone()),
        (json!(150), json!(400))
    );
    assert_eq!(
        (end["x"].clone(), end["y"].clone()),
        (json!(500), json!(600))
    );
    assert!(log.iter().filter(|e| e["kind"] == "drag_motion").count() >= 5);

    // Double, right and middle clicks are what they say.
    for (action, x) in [
        ("double_click", 1000),
        ("right_click", 1001),
        ("middle_click", 1002),
    ] {
        act(&model, &id, json!({"action": action, "x": x, "y": 700})).await;
    }
    let log = wait_for(&client, &id, |e| e["kind"] == "click" && e["button"] == 2).await;
    assert!(
        log.iter()
            .any(|e| e["kind"] == "click" && e["x"] == 1001 && e["button"] == 3)
    );
    assert!(
        log.iter()
            .any(|e| e["kind"] == "click" && e["x"] == 1002 && e["button"] == 2)
    );
    assert_eq!(
        log.iter()
            .filter(|e| e["kind"] == "click" && e["x"] == 1000 && e["button"] == 1)
            .count(),
        2
    );

    // A wait returns after its time.
    let begun = Instant::now();
    act(&model, &id, json!({"action": "wait", "amount": 1})).await;
    assert!(begun.elapsed() >= Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pointer_is_drawn_where_it_was_moved_and_screenshots_scale() {
    require_desktops!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = desktop_with_app(&client).await;
    let white = [255, 255, 255];

    act(&client, &id, json!({"action": "move", "x": 900, "y": 700})).await;
    let here = image_of(&call(&client, "computer_screenshot", json!({"sandbox_id": id})).await);
    act(&client, &id, json!({"action": "move", "x": 1100, "y": 120})).await;
    let there = image_of(&call(&client, "computer_screenshot", json!({"sandbox_id": id})).await);
    // The arrow's body lies below and right of its hot spot: drawn at the pointer, not elsewhere.
    assert!(here.differing(898, 698, 14, 20, white) > 10);
    assert_eq!(here.differing(1098, 118, 14, 20, white), 0);
    assert!(there.differing(1098, 118, 14, 20, white) > 10);
    assert_eq!(there.differing(898, 698, 14, 20, white), 0);

    // Half scale: half the pixels, the same screen.
    let half = call(
        &client,
        "computer_screenshot",
        json!({"sandbox_id": id, "scale": 0.5}),
    )
    .await;
    let meta = half.structured_content.clone().unwrap();
    assert_eq!(
        (meta["width"].clone(), meta["screen_width"].clone()),
        (json!(640), json!(1280))
    );
    let image = image_of(&half);
    assert_eq!((image.width, image.height), (640, 400));
    assert_eq!(
        image.pixel(60, 55),
        [255, 0, 0],
        "the red button, at half its place"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_text_arrives_whole() {
    require_desktops!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = desktop_with_app(&client).await;
    act(&client, &id, json!({"action": "click", "x": 400, "y": 270})).await;
    // 3 000 characters, 150 distinct ones outside the US layout (Cyrillic, Greek, Armenian,
    // CJK): each bound to a spare key once, two to a key.
    let alphabet: Vec<char> = ('А'..='я')
        .chain('α'..='ω')
        .chain('Ա'..='Ֆ')
        .chain("日本語中文字漢字東京大阪✓€£¥→←↑↓".chars())
        .collect();
    assert!(alphabet.len() >= 140);
    let text: String = (0..3000)
        .map(|i| match i % 7 {
            0 => ' ',
            1 => 'x',
            _ => alphabet[(i * 31) % alphabet.len()],
        })
        .collect();
    let begun = Instant::now();
    act(&client, &id, json!({"action": "type", "text": text})).await;
    let took = begun.elapsed();
    assert_eq!(entry_text(&client, &id).await, text, "typed in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_errors_that_say_what_to_do() {
    require_desktops!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let created = ok(&client, "computer_create", json!({"resolution": "800x600"})).await;
    let id = created["id"].as_str().unwrap();

    let e = err(
        &client,
        "computer_action",
        json!({"sandbox_id": id, "action": "click", "x": 800, "y": 10}),
    )
    .await;
    assert!(e.contains("(800, 10) is off the 800x600 screen"), "{e}");
    assert!(e.contains("x must be 0-799 and y 0-599"), "{e}");

    let e = err(
        &client,
        "computer_action",
        json!({"sandbox_id": id, "action": "key", "keys": "ctrl+hyperspace"}),
    )
    .await;
    assert!(e.contains("unknown key \"hyperspace\""), "{e}");

    // 100 KB of text: refused before anything is typed, by the tool's schema and by the engine.
    let huge = "a".repeat(100 * 1024);
    let e = err(
        &client,
        "computer_action",
        json!({"sandbox_id": id, "action": "type", "text": huge}),
    )
    .await;
    assert!(e.contains("text"), "{e}");
    let (status, body) = api(
        &engine.url,
        "POST",
        &format!("/v1/sandboxes/{id}/desktop/actions"),
        Some(json!({"action": "type", "text": huge})),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    let e = err(
        &client,
        "computer_action",
        json!({"sandbox_id": id, "action": "type"}),
    )
    .await;
    assert!(e.contains("action type needs text"), "{e}");

    let e = err(&client, "computer_create", json!({"resolution": "99999x1"})).await;
    assert!(e.contains("resolution"), "{e}");

    // A plain sandbox: the error names the tool that makes desktops.
    let plain = create(&client).await;
    let e = err(&client, "computer_screenshot", json!({"sandbox_id": plain})).await;
    assert!(
        e.contains("has no desktop") && e.contains("computer_create"),
        "{e}"
    );
    let e = err(
        &client,
        "computer_action",
        json!({"sandbox_id": plain, "action": "move", "x": 1, "y": 1}),
    )
    .await;
    assert!(e.contains("computer_create"), "{e}");

    // A template without Xvfb cannot be a desktop, and nothing is left behind.
    let before = ok(&client, "sandbox_list", json!({})).await["sandboxes"]
        .as_array()
        .unwrap()
        .len();
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "no-x", "steps": [{"run": "rm -f /usr/bin/Xvfb"}]}),
    )
    .await;
    let begun = Instant::now();
    while ok(&client, "sandbox_template_list", json!({})).await["templates"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "no-x" && t["status"] == "building")
    {
        assert!(begun.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let e = err(&client, "computer_create", json!({"template": "no-x"})).await;
    assert!(e.contains("has no Xvfb"), "{e}");
    // Any template with Xvfb can be a desktop: `base` has the host's.
    let on_base = ok(&client, "computer_create", json!({"template": "base"})).await;
    assert_eq!(on_base["template"], "base");
    let shot = call(
        &client,
        "computer_screenshot",
        json!({"sandbox_id": on_base["id"]}),
    )
    .await;
    assert_eq!(image_of(&shot).width, 1280);
    ok(
        &client,
        "sandbox_kill",
        json!({"sandbox_id": on_base["id"]}),
    )
    .await;
    let after = ok(&client, "sandbox_list", json!({})).await["sandboxes"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(after, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_or_emptied_desktop_comes_back_on_the_next_screenshot() {
    require_desktops!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = desktop_with_app(&client).await;

    // Pause: the next screenshot resumes it, with the app still on screen.
    let stopped = ok(&client, "computer_stop", json!({"sandbox_id": id})).await;
    assert_eq!(stopped["status"], "paused");
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "paused");
    let image = image_of(&call(&client, "computer_screenshot", json!({"sandbox_id": id})).await);
    assert_eq!(
        image.pixel(120, 110),
        [255, 0, 0],
        "the app survived the pause"
    );
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["status"], "running");

    // A restore stops every process, the display server too: the next call starts it again.
    snapshot_and_restore(&client, &id).await;
    let image = image_of(&call(&client, "computer_screenshot", json!({"sandbox_id": id})).await);
    assert_eq!((image.width, image.height), (1280, 800));
    act(&client, &id, json!({"action": "move", "x": 10, "y": 10})).await;

    // A fork is a desktop too: its display starts with its first desktop call.
    let fork = ok(&client, "sandbox_fork", json!({"sandbox_id": id})).await;
    let child = fork["ids"][0].as_str().unwrap();
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": child})).await;
    assert_eq!(info["desktop"]["width"], 1280, "{info}");
    let image = image_of(&call(&client, "computer_screenshot", json!({"sandbox_id": child})).await);
    assert_eq!((image.width, image.height), (1280, 800));
    assert_eq!(sh(&client, child, "echo $DISPLAY").await, ":0\n");

    // Kill: gone, and the error says how to get another.
    let killed = ok(
        &client,
        "computer_stop",
        json!({"sandbox_id": id, "kill": true}),
    )
    .await;
    assert_eq!(killed["status"], "killed");
    let e = err(&client, "computer_screenshot", json!({"sandbox_id": id})).await;
    assert!(e.contains("computer_create"), "{e}");
}
