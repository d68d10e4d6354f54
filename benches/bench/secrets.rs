//! Secrets: requests through the swap against TLS passthrough, from the same sandbox.

use serde_json::json;

use crate::figures::{Figure, figure, median_p95};
use crate::probe::{interleaved, probe_inside, probe_ms, transfer_secs};
use crate::servers::{Engine, networking};
use crate::testnet::{BenchNet, HTTPS_PORT, Https};

pub(crate) const SECRETS_HEADING: &str = "\n## Secrets: the swap against TLS passthrough\n\n";

/// The secret's value: as long as a stand-in, so that both paths send requests of one size.
const SECRET_VALUE: &str = "sk-bench-REAL-VALUE-0123456789abcdefghijkl";

/// One upload's size.
const UPLOAD: u64 = 100 << 20;

/// The secrets figures, on a sandbox of their own with the secret bound. Returns what the report
/// says about how.
pub(crate) fn secrets_figures(
    engine: &Engine,
    net: &BenchNet,
    out: &mut Vec<Figure>,
) -> Result<String, String> {
    let https = net
        .https
        .as_ref()
        .map_err(|why| format!("the test internet has no HTTPS server: {why}"))?;
    engine.call(
        "PUT",
        "/v1/secrets/bench",
        Some(json!({"hosts": ["*.bench.test"], "value": SECRET_VALUE})),
    )?;
    let created = engine.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"secrets": {"API_KEY": "bench"}})),
    )?;
    let id = created["id"]
        .as_str()
        .ok_or(format!("create answered {created}"))?
        .to_string();
    let measured = measure_secrets(engine, &id, net, https, out);
    let _ = engine.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    measured
}

fn measure_secrets(
    engine: &Engine,
    id: &str,
    net: &BenchNet,
    https: &Https,
    out: &mut Vec<Figure>,
) -> Result<String, String> {
    let (label, how) = networking(engine, id);
    if label != "networking on" {
        return Err(format!(
            "the engine's sandboxes have no network here ({how})"
        ));
    }
    // One bundle for both paths: the engine's CA (the swap's certificates) and the bench's
    // (passthrough: the server's own), so that both clients do the same work.
    engine.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/bench-ca.pem", "content": https.ca_pem})),
    )?;
    let r = engine.exec(
        id,
        "cat /etc/ssl/certs/sandbox-mcp-egress-ca.pem /root/bench-ca.pem > /root/trust.pem \
         && printf %s \"$API_KEY\"",
    );
    let standin = r["stdout"].as_str().unwrap_or_default().to_string();
    if r["exit_code"] != 0 || !standin.starts_with("sbxsecret_") {
        return Err(format!("the sandbox has no stand-in or no engine CA: {r}"));
    }
    let ip = net.net_ip;
    let tls = |mode: &str, name: &str, n: u64| {
        probe_inside(
            engine,
            id,
            &format!(
                "{mode} {ip} {HTTPS_PORT} {name} /root/trust.pem {n} \"Authorization:Bearer $API_KEY\""
            ),
        )
    };
    let seen = |name: &str| https.seen.lock().unwrap().get(name).cloned();
    // Once, untimed: the swap delivers the value, passthrough the stand-in.
    let (swapped, passed) = ("api.bench.test", "plain.other.test");
    tls("tls", swapped, 1)?;
    tls("tls", passed, 1)?;
    let value = format!("Bearer {SECRET_VALUE}");
    if seen(swapped).as_deref() != Some(value.as_str()) {
        return Err(format!(
            "through the swap, the server received Authorization {:?}, not the secret's value",
            seen(swapped)
        ));
    }
    if seen(passed) != Some(format!("Bearer {standin}")) {
        return Err(format!(
            "through passthrough, the server received Authorization {:?}, not the stand-in",
            seen(passed)
        ));
    }

    // A warm connection each: request and answer.
    let (swap, pass) = interleaved(10, |swap| {
        probe_ms(&tls("tls", if swap { swapped } else { passed }, 50)?)
    })?;
    let (swap, pass) = (swap.concat(), pass.concat());
    let warm_added = median_p95(&swap).0 - median_p95(&pass).0;
    out.push(figure(
        "Secrets: request on a warm connection, through the swap",
        "ms",
        swap,
        None,
        "GET with Authorization: Bearer $API_KEY to api.bench.test (a bound secret's host) on \
         a kept-alive TLS connection; send to the whole answer",
    ));
    out.push(figure(
        "Secrets: the same request on a warm TLS passthrough connection",
        "ms",
        pass,
        None,
        "to plain.other.test (no secret names it), same sandbox, same client; blocks of 50 \
         alternating with the above",
    ));
    out.push(Figure {
        name: "Secrets: latency the swap adds on a warm connection (p50 difference)".into(),
        unit: "ms",
        median: warm_added,
        p95: f64::NAN,
        target: Some((1.0, "≤ 1 ms")),
        note: "medians of the two series above".into(),
    });

    // A new connection to a host name not seen before: the swap mints its certificate.
    let mut round = 0;
    let (swap, pass) = interleaved(10, |swap| {
        round += 1;
        let names = if swap {
            format!("n{round}-@.bench.test")
        } else {
            format!("p{round}-@.other.test")
        };
        probe_ms(&tls("tlsnew", &names, 20)?)
    })?;
    if seen("n1-1.bench.test").as_deref() != Some(value.as_str()) {
        return Err("a new host's first request did not get the secret's value".into());
    }
    let (swap, pass) = (swap.concat(), pass.concat());
    let first_added = median_p95(&swap).0 - median_p95(&pass).0;
    out.push(figure(
        "Secrets: first connection to a new host, through the swap (certificate minted)",
        "ms",
        swap,
        None,
        "connect, TLS handshake, one GET with the stand-in, answer; a new name under \
         *.bench.test each time; the engine connects and handshakes upstream and mints a \
         certificate for the name before it answers the sandbox's handshake",
    ));
    out.push(figure(
        "Secrets: first connection through TLS passthrough",
        "ms",
        pass,
        None,
        "the same, a new name under *.other.test each time; blocks of 20 alternating with the \
         above",
    ));
    out.push(Figure {
        name: "Secrets: what the swap adds to a first connection (p50 difference)".into(),
        unit: "ms",
        median: first_added,
        p95: f64::NAN,
        target: None,
        note: "medians of the two series above".into(),
    });

    // 100 MiB up, on a warm connection.
    let (swap, pass) = interleaved(9, |swap| {
        let got = tls("tlsup", if swap { swapped } else { passed }, UPLOAD)?;
        let secs = transfer_secs(&got, UPLOAD).map_err(|e| format!("an upload {e}"))?;
        Ok(UPLOAD as f64 / secs / 1e6)
    })?;
    let shares: Vec<f64> = swap.iter().zip(&pass).map(|(s, p)| s / p * 100.0).collect();
    for (round, (s, p)) in swap.iter().zip(&pass).enumerate() {
        eprintln!("100 MiB up, round {round}: swap {s:.0} MB/s, passthrough {p:.0} MB/s");
    }
    out.push(figure(
        "Secrets: 100 MiB upload through the swap",
        "MB/s",
        swap,
        None,
        "POST of 104857600 bytes with the stand-in in Authorization, on a warm connection; \
         first byte sent to the answer; the engine scans the body for stand-ins on the way; \
         1 MB = 10⁶ bytes",
    ));
    out.push(figure(
        "Secrets: the same upload through TLS passthrough",
        "MB/s",
        pass,
        None,
        "same client, same server; rounds alternating with the above",
    ));
    out.push(figure(
        "Secrets: swap ÷ passthrough, 100 MiB upload",
        "%",
        shares,
        None,
        "swap rate ÷ passthrough rate of each round's pair of uploads",
    ));

    Ok(format!(
        "The test internet above also serves HTTPS/1.1 with keep-alive on port {HTTPS_PORT} (a \
         Rust server of the bench's: rustls, a certificate for `*.bench.test` and `*.other.test` \
         from a CA made for the run, given to the engine with `--egress-ca`), reading each \
         request's body and answering `200 ok`. The operator's secret `bench` (hosts \
         `*.bench.test`) is bound to a sandbox of its own as `API_KEY`. In it, the probe's TLS \
         modes (Python's `ssl`, trusting the engine's CA and the bench's from one file) connect \
         to the server's address with a server name: under `*.bench.test` the engine decrypts, \
         swaps the stand-in for the value and talks TLS to the server itself; under \
         `*.other.test` the connection passes through the relay untouched. Both send \
         `Authorization: Bearer $API_KEY` (checked once, untimed: the server received the value \
         through the swap and the stand-in through passthrough). Both paths go through the \
         relay, which reads the first bytes of every connection of a sandbox with a secret \
         bound. Passthrough is the baseline: the difference is the swap's own cost.\n"
    ))
}
