//! Network: the egress path against the direct one, on the bench's test internet; then the
//! previews and secrets sections, on the same engine.

use crate::figures::{Figure, figure, median_p95};
use crate::previews::{PREVIEW_HEADING, preview_figures};
use crate::probe::{interleaved, probe_host, probe_inside, probe_ms, transfer_secs};
use crate::secrets::{SECRETS_HEADING, secrets_figures};
use crate::servers::{Engine, networking};
use crate::testnet::{BYTES_PORT, BenchNet, ECHO_PORT, GIB};

/// The egress path against the direct one: a sandbox's download and connections through the
/// engine's relay, and the host's own to the same servers with the same client, interleaved.
/// Returns the section of the report that says how (or why nothing was measured).
pub(crate) fn network_figures(out: &mut Vec<Figure>) -> String {
    let mut md = String::from("\n## Network: the egress path against the direct one\n\n");
    let net = match BenchNet::start() {
        Ok(net) => net,
        Err(why) => {
            eprintln!("network figures SKIPPED: {why}");
            for heading in ["", PREVIEW_HEADING, SECRETS_HEADING] {
                md.push_str(&format!("{heading}Not measured in this run: {why}.\n"));
            }
            return md;
        }
    };
    // Only the namespace's address is opened, as an operator opens a private server; previews
    // on a port of their own; the HTTPS server's CA trusted upstream of the secrets swap.
    let allow = format!("{}/32", net.net_ip);
    let ca_path = net
        .https
        .as_ref()
        .map(|h| h.ca_file.path().to_string_lossy().into_owned());
    let mut env = vec![
        ("SANDBOX_MCP_EGRESS_ALLOW", allow.as_str()),
        ("SANDBOX_MCP_PREVIEW_LISTEN", "127.0.0.1:0"),
    ];
    if let Ok(path) = &ca_path {
        env.push(("SANDBOX_MCP_EGRESS_CA", path));
    }
    let engine = Engine::start_with(&env);
    let id = engine.create();
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string()
    };
    let load_before = load();
    match measure_network(&engine, &id, &net, out) {
        Ok(()) => md.push_str(&format!(
            "A test internet of the bench's own: a network namespace joined to the host by a veth \
             pair ({allow} at its end, TEST-NET-2: nothing leaves this machine), serving `GET \
             /bytes/N` and a TCP echo from threads of the bench. The engine runs with \
             `--egress-allow {allow}`. The same client, a Python script run by the system's \
             Python, talks to the same servers from a sandbox, through the engine's relay (the \
             sandbox's nf_tables rules redirect the connection to the engine's listener in its \
             namespace; the engine connects out from the host's namespace and copies both ways), \
             and from the host, directly, in alternating order. The sandbox has the base \
             template's shape (1 vCPU); the host's client has no limit. Load average (1 min) \
             of this shared machine: {load_before} before, {} after.\n",
            load()
        )),
        Err(why) => {
            eprintln!("network figures FAILED: {why}");
            md.push_str(&format!("Not measured in this run: {why}.\n"));
        }
    }
    md.push_str(PREVIEW_HEADING);
    match preview_figures(&engine, &id, out) {
        Ok(how) => md.push_str(&how),
        Err(why) => {
            eprintln!("preview figures FAILED: {why}");
            md.push_str(&format!("Not measured in this run: {why}.\n"));
        }
    }
    engine.kill(&id);
    md.push_str(SECRETS_HEADING);
    match secrets_figures(&engine, &net, out) {
        Ok(how) => md.push_str(&how),
        Err(why) => {
            eprintln!("secrets figures FAILED: {why}");
            md.push_str(&format!("Not measured in this run: {why}.\n"));
        }
    }
    drop(engine);
    drop(net);
    md
}

fn measure_network(
    engine: &Engine,
    id: &str,
    net: &BenchNet,
    out: &mut Vec<Figure>,
) -> Result<(), String> {
    let (label, how) = networking(engine, id);
    if label != "networking on" {
        return Err(format!(
            "the engine's sandboxes have no network here ({how})"
        ));
    }

    // 1 GiB on each side per round; the share compares each round's pair, so drift cancels.
    const ROUNDS: usize = 5;
    let args = format!("bytes {} {BYTES_PORT} {GIB}", net.net_ip);
    let (relay, direct) = interleaved(ROUNDS, |in_sandbox| {
        let got = if in_sandbox {
            probe_inside(engine, id, &args)?
        } else {
            probe_host(&args)?
        };
        let secs = transfer_secs(&got, GIB).map_err(|e| format!("a download {e}"))?;
        Ok(GIB as f64 / secs / 1e9)
    })?;
    let shares: Vec<f64> = relay
        .iter()
        .zip(&direct)
        .map(|(r, d)| r / d * 100.0)
        .collect();
    for (round, (r, d)) in relay.iter().zip(&direct).enumerate() {
        eprintln!("1 GiB, round {round}: relay {r:.3} GB/s, direct {d:.3} GB/s");
    }
    out.push(figure(
        "Network: 1 GiB download in a sandbox, through the egress relay",
        "GB/s",
        relay,
        Some((1.0, "≥ 1 GB/s")),
        "GET /bytes/1073741824 from the test internet; connect to last byte; 1 GB = 10⁹ bytes",
    ));
    out.push(figure(
        "Network: the same download on the host, direct",
        "GB/s",
        direct,
        None,
        "same server, same client, rounds alternating with the above",
    ));
    out.push(figure(
        "Network: egress relay ÷ direct, 1 GiB download",
        "%",
        shares,
        Some((85.0, "≥ 85% of direct")),
        "relay rate ÷ direct rate of each round's pair of downloads",
    ));

    // A new connection and its first round trip: what an application waits for before its
    // first answer. The relay's work (accept, decide, connect out) happens after the sandbox's
    // connect() returns, so the round trip is what shows it.
    let args = format!("tcp {} {ECHO_PORT} 50", net.net_ip);
    let (relay, direct) = interleaved(10, |in_sandbox| {
        probe_ms(&if in_sandbox {
            probe_inside(engine, id, &args)?
        } else {
            probe_host(&args)?
        })
    })?;
    let (relay, direct) = (relay.concat(), direct.concat());
    let added = median_p95(&relay).0 - median_p95(&direct).0;
    out.push(figure(
        "Network: connect + 1-byte round trip from a sandbox, through the relay",
        "ms",
        relay,
        None,
        "to the test internet's TCP echo; connect, send, read the echo (then close)",
    ));
    out.push(figure(
        "Network: the same from the host, direct",
        "ms",
        direct,
        None,
        "same server, same client, blocks of 50 alternating with the above",
    ));
    out.push(Figure {
        name: "Network: latency the engine adds to a new connection (p50 difference)".into(),
        unit: "ms",
        median: added,
        p95: f64::NAN,
        target: Some((0.3, "≤ 0.3 ms")),
        note: "medians of the two series above".into(),
    });
    Ok(())
}
