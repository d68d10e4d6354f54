//! Previews: a request through the engine's preview listener against the same request made in
//! the sandbox.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::figures::{Figure, figure, median_p95, ms};
use crate::probe::{interleaved, probe_host, probe_inside, probe_ms};
use crate::servers::{Engine, networking};

pub(crate) const PREVIEW_HEADING: &str =
    "\n## Previews: through the preview URL against inside the sandbox\n\n";

/// The port of the sandbox's app.
const APP_PORT: u16 = 8080;

/// The sandbox's app: one request per connection, answered `200 ok`, then close; one at a time,
/// so that it costs the same whoever asks.
const APP: &str = include_str!("../preview_app.py");

/// The preview figures: the same client (the probe's `http` mode: connect, one `GET`, read to
/// the end) from the host through a private preview of the app, and in the sandbox straight to
/// the app; interleaved. Returns what the report says about how.
pub(crate) fn preview_figures(
    engine: &Engine,
    id: &str,
    out: &mut Vec<Figure>,
) -> Result<String, String> {
    let (label, how) = networking(engine, id);
    if label != "networking on" {
        return Err(format!(
            "the engine's sandboxes have no network namespace here ({how})"
        ));
    }
    engine.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/bench_app.py", "content": APP})),
    )?;
    engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": format!("/usr/bin/python3 /root/bench_app.py {APP_PORT}"), "background": true})),
    )?;
    let inside = format!("http 127.0.0.1 {APP_PORT} localhost:{APP_PORT} /");
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(why) = probe_inside(engine, id, &format!("{inside} 1")) {
        if Instant::now() > deadline {
            return Err(format!("the sandbox's app did not answer: {why}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let preview = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/previews"),
        Some(json!({"port": APP_PORT})),
    )?;
    let url = preview["url"].as_str().unwrap_or_default();
    let token = preview["token"]
        .as_str()
        .ok_or(format!("a private preview without a token: {preview}"))?;
    // http://{port}-{id}.localhost:{listen port}/?preview_token=…
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .ok_or(format!("a preview URL of an unknown form: {url}"))?;
    let (host, listen) = authority
        .rsplit_once(':')
        .ok_or(format!("a preview URL without a port: {url}"))?;
    // The token in its header, as non-browser clients send it (a browser trades the query
    // parameter for a cookie once, then sends that).
    let via = format!("http 127.0.0.1 {listen} {host} / ");
    let token_header = format!("X-Preview-Token:{token}");
    probe_host(&format!("{via} 1 {token_header}"))?;

    let (direct, proxied) = interleaved(10, |in_sandbox| {
        probe_ms(&if in_sandbox {
            probe_inside(engine, id, &format!("{inside} 50"))?
        } else {
            probe_host(&format!("{via} 50 {token_header}"))?
        })
    })?;
    let (direct, proxied) = (direct.concat(), proxied.concat());
    let added = median_p95(&proxied).0 - median_p95(&direct).0;

    // What the proxy does for each connection before it can connect: start a thread that enters
    // the sandbox's network namespace and makes the socket there. The same, here, against the
    // same without entering (a thread and a socket), in alternating blocks.
    let ns = netns_of(engine, id)?;
    let (mut entering, mut staying) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        for _ in 0..50 {
            entering.push(namespace_thread(&ns, true)?);
        }
        for _ in 0..50 {
            staying.push(namespace_thread(&ns, false)?);
        }
    }
    let thread = median_p95(&entering).0;
    let without_setns = median_p95(&staying).0;

    out.push(figure(
        "Preview: GET in the sandbox, straight to the app",
        "ms",
        direct,
        None,
        "new connection to 127.0.0.1:8080 in the sandbox, GET /, read to the end (the app \
         closes)",
    ));
    out.push(figure(
        "Preview: the same GET from the host, through the preview URL",
        "ms",
        proxied,
        None,
        "new connection to the preview listener, Host: {port}-{id}.localhost, X-Preview-Token; \
         same client, blocks of 50 alternating with the above",
    ));
    out.push(Figure {
        name: "Preview: latency the preview proxy adds (p50 difference)".into(),
        unit: "ms",
        median: added,
        p95: f64::NAN,
        target: Some((0.5, "≤ 0.5 ms")),
        note: "medians of the two series above".into(),
    });
    out.push(figure(
        "Preview: of which, a thread entering the sandbox's network namespace",
        "ms",
        entering,
        None,
        &format!(
            "what the proxy does per connection, done by the bench: spawn a thread, setns into \
             the sandbox's namespace, make the socket, hand it back; without the setns: \
             {without_setns:.3} ms"
        ),
    ));
    let verdict = if added <= 0.5 {
        format!("The target (≤ 0.5 ms) is met: the proxy adds {added:.3} ms.")
    } else {
        format!(
            "The target (≤ 0.5 ms) is missed by {:.3} ms: the proxy adds {added:.3} ms, of which \
             the thread that enters the sandbox's namespace accounts for about {thread:.3} ms \
             ({:.0}%; {without_setns:.3} ms of it without the setns).",
            added - 0.5,
            thread / added * 100.0
        )
    };
    Ok(format!(
        "The engine serves previews on 127.0.0.1 (`--preview-listen 127.0.0.1:0`, a free port). \
         In the sandbox (the one of the figures above), a one-connection-at-a-time Python app on \
         127.0.0.1:{APP_PORT} answers `200 ok` and closes; it has a private preview. The probe's \
         `http` mode (a new connection, one GET, read to the end; Python, the same script) runs \
         in the sandbox to the app directly, and on the host through the preview URL with the \
         token in the `X-Preview-Token` header, in alternating blocks of 50. The proxy's own \
         path per connection: hyper reads the request, the token is checked, a thread enters the \
         sandbox's network namespace to make the socket, the connection to the app is made and \
         the request relayed. {verdict}\n"
    ))
}

/// The sandbox's network namespace, opened from the process of the host that is in it.
fn netns_of(engine: &Engine, id: &str) -> Result<std::fs::File, String> {
    let r = engine.exec(id, "readlink /proc/self/ns/net");
    let want = r["stdout"].as_str().unwrap_or_default().trim().to_string();
    let own = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
    if !want.starts_with("net:[") || Path::new(&want) == own {
        return Err(format!(
            "the sandbox's network namespace is not one of its own: {r}"
        ));
    }
    for entry in std::fs::read_dir("/proc")
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let path = entry.path().join("ns/net");
        if std::fs::read_link(&path).is_ok_and(|l| l == Path::new(&want)) {
            return std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()));
        }
    }
    Err(format!("no process of the host is in {want}"))
}

/// The preview proxy's step before connecting: a thread that enters `ns` (when `enter`), makes a
/// non-blocking TCP socket there and hands it back; its ms from spawn to the socket in hand.
fn namespace_thread(ns: &std::fs::File, enter: bool) -> Result<f64, String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let ns = ns.try_clone().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("preview-connect".into())
        .spawn(move || {
            let made = if enter {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            } else {
                Ok(())
            }
            .and_then(|()| {
                socket(
                    AddressFamily::Inet,
                    SockType::Stream,
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    None,
                )
            });
            let _ = tx.send(made);
        })
        .map_err(|e| e.to_string())?;
    let socket = rx
        .recv()
        .map_err(|_| "the namespace thread died".to_string())?
        .map_err(|e| format!("setns or socket: {e}"))?;
    let took = ms(started.elapsed());
    drop(socket);
    Ok(took)
}
