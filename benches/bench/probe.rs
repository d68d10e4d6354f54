//! The client of every network figure (`benches/probe.py`), run the same on the host and in a
//! sandbox, and what its output says.

use std::process::Command;

use crate::servers::Engine;

/// The client of every network figure, run with the system's Python as the same script on the
/// host and in a sandbox (which sees the host's /usr), timing itself; its modes are described at
/// its top.
const PROBE: &str = include_str!("../probe.py");

/// Runs [`PROBE`] with `args` in sandbox `id`: its stdout, or why it failed.
pub(crate) fn probe_inside(engine: &Engine, id: &str, args: &str) -> Result<String, String> {
    let r = engine.exec(
        id,
        &format!("/usr/bin/python3 - {args} <<'EOF'\n{PROBE}\nEOF"),
    );
    if r["exit_code"] != 0 {
        return Err(format!("in the sandbox, probe {args}: {r}"));
    }
    Ok(r["stdout"].as_str().unwrap_or_default().to_string())
}

/// Runs [`PROBE`] with `args` on the host: its stdout, or why it failed.
pub(crate) fn probe_host(args: &str) -> Result<String, String> {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(PROBE)
        .args(args.split_whitespace())
        .output()
        .map_err(|e| format!("/usr/bin/python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "on the host, probe {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Samples of a `tcp`/`http` probe's output, in ms.
pub(crate) fn probe_ms(out: &str) -> Result<Vec<f64>, String> {
    out.split_whitespace()
        .map(|v| v.parse::<f64>().map(|us| us / 1000.0))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("probe output {out:?}: {e}"))
}

/// The seconds of a transfer a probe reported as "BYTES SECONDS", checking it moved `expected`
/// bytes.
pub(crate) fn transfer_secs(got: &str, expected: u64) -> Result<f64, String> {
    let mut words = got.split_whitespace();
    let bytes: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let secs: f64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::NAN);
    if bytes == expected {
        Ok(secs)
    } else {
        Err(format!("printed {got:?}, not {expected} bytes"))
    }
}

/// Runs `probe` for one side (`true`: in the sandbox, or through the path measured) and the
/// other (`false`: on the host, or the path compared with) in alternating order, `rounds` times
/// each: what each side returned, in the order of the rounds.
pub(crate) fn interleaved<T>(
    rounds: usize,
    mut probe: impl FnMut(bool) -> Result<T, String>,
) -> Result<(Vec<T>, Vec<T>), String> {
    let (mut inside, mut host) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for in_sandbox in order {
            let v = probe(in_sandbox)?;
            if in_sandbox { &mut inside } else { &mut host }.push(v);
        }
    }
    Ok((inside, host))
}
