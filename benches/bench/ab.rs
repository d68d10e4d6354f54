//! A/B mode: another build and this one in alternating rounds, each figure's median over its
//! rounds side by side; and the hot per-call paths of both, interleaved.

use serde_json::json;

use crate::figures::{ms, percentile, time};
use crate::report::{machine, now};
use crate::servers::{BIN, Engine, Mcp, THIS_BUILD};
use crate::suite;

/// A/B, paired: the hot per-call paths of both builds, interleaved in blocks of 50 calls so
/// that each block of one build has the other's beside it in time. Each build's MCP server talks
/// to its own engine, and the raw HTTP series goes to each engine directly.
fn ab_paired(baseline: &'static str) -> String {
    let builds = [baseline, THIS_BUILD];
    let engines: Vec<Engine> = builds
        .iter()
        .map(|b| {
            *BIN.write().unwrap() = b;
            Engine::start()
        })
        .collect();
    let mut servers: Vec<Mcp> = builds
        .iter()
        .zip(&engines)
        .map(|(b, e)| {
            *BIN.write().unwrap() = b;
            let mut m = Mcp::spawn(&e.url);
            m.initialize();
            m
        })
        .collect();
    *BIN.write().unwrap() = THIS_BUILD;
    let ids: Vec<String> = engines.iter().map(Engine::create).collect();
    let series = [
        "MCP: tools/list",
        "MCP: tools/call sandbox_info",
        "HTTP: GET /v1/sandboxes/{id}",
        "Engine: exec `true`",
    ];
    // samples[series][build]
    let mut samples = vec![[Vec::new(), Vec::new()]; series.len()];
    for _block in 0..20 {
        for side in 0..2 {
            let (mcp, engine, id) = (&mut servers[side], &engines[side], &ids[side]);
            for _ in 0..50 {
                samples[0][side].push(ms(time(|| mcp.request("tools/list", json!({}))).0));
                samples[1][side].push(ms(time(|| {
                    mcp.call("sandbox_info", json!({"sandbox_id": id}))
                })
                .0));
                samples[2][side].push(ms(time(|| {
                    engine.get(&format!("/v1/sandboxes/{id}")).unwrap()
                })
                .0));
            }
            for _ in 0..10 {
                samples[3][side].push(ms(time(|| engine.exec(id, "true")).0));
            }
        }
    }
    for (engine, id) in engines.iter().zip(&ids) {
        engine.kill(id);
    }
    let mut md = String::from(
        "\n## Paired: the per-call paths, interleaved\n\nBoth builds at once, each with its own \
         engine and stdio server, in alternating blocks (50 calls, 10 execs) for 20 rounds; the \
         medians of all samples. This is the comparison to trust for small differences.\n\n\
         | Path | A (baseline) | B (this build) | B / A | samples each |\n|---|---:|---:|---:|---:|\n",
    );
    for (name, [a, b]) in series.iter().zip(samples.iter_mut()) {
        let n = a.len();
        let (ma, mb) = (percentile(a, 0.5), percentile(b, 0.5));
        md.push_str(&format!(
            "| {name} | {ma:.3} ms | {mb:.3} ms | {:.2} | {n} |\n",
            mb / ma
        ));
    }
    md
}

/// A/B mode: `baseline` and this build in alternating rounds (ABBA…), then each figure's median
/// over its rounds, side by side.
pub(crate) fn ab(baseline: &str, only: Option<&str>) -> String {
    let rounds: usize = std::env::var("SANDBOX_MCP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let baseline: &'static str = Box::leak(baseline.to_string().into_boxed_str());
    // Figure name → (unit, baseline medians, this build's medians), in first-seen order.
    let mut table: Vec<(String, &'static str, Vec<f64>, Vec<f64>)> = Vec::new();
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [(baseline, true), (THIS_BUILD, false)]
        } else {
            [(THIS_BUILD, false), (baseline, true)]
        };
        for (binary, is_baseline) in order {
            eprintln!("== round {} of {rounds}: {binary}", round + 1);
            *BIN.write().unwrap() = binary;
            let figures = match only {
                Some(section) => crate::section_figures(section)
                    .unwrap_or_else(|| panic!("no benchmark section {section:?}")),
                None => suite(false).0,
            };
            for f in figures {
                let row = match table.iter().position(|r| r.0 == f.name) {
                    Some(i) => &mut table[i],
                    None => {
                        table.push((f.name.clone(), f.unit, Vec::new(), Vec::new()));
                        table.last_mut().unwrap()
                    }
                };
                if is_baseline { &mut row.2 } else { &mut row.3 }.push(f.median);
            }
        }
    }
    *BIN.write().unwrap() = THIS_BUILD;
    // The paired hot paths belong to the whole suite; a section's A/B is that section alone.
    let paired = if only.is_none() {
        ab_paired(baseline)
    } else {
        String::new()
    };
    // The middle value, or the mean of the two middle ones (two rounds: their mean).
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    let fmt = |v: f64, unit: &str| {
        if v.is_nan() {
            "—".to_string()
        } else if v.abs() >= 100.0 {
            format!("{v:.0} {unit}")
        } else {
            format!("{v:.3} {unit}")
        }
    };
    let spread = |v: &[f64], unit: &str| match (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => format!("{} – {}", fmt(lo, unit), fmt(hi, unit)),
        _ => "—".into(),
    };
    let mut md = String::from("# Benchmarks: A/B\n\n");
    md.push_str(
        "Generated by `SANDBOX_MCP_BENCH_BASELINE=<binary> cargo bench` (benches/bench/main.rs), which \
         rewrites this file. Do not edit by hand.\n\n",
    );
    if let Some(section) = only {
        md = md.replace(
            "`SANDBOX_MCP_BENCH_BASELINE=<binary> cargo bench`",
            &format!("`SANDBOX_MCP_BENCH_ONLY={section} SANDBOX_MCP_BENCH_BASELINE=<binary> cargo bench --bench bench`"),
        );
    }
    md.push_str(&format!(
        "- Run: {}\n- Machine: {}\n- A: the baseline binary given; B: this build (sandbox-mcp {})\n\
         - {rounds} rounds of {} each, alternating (A B, B A, …) so that both see \
         the same drift of this shared machine\n\n",
        now(),
        machine(),
        env!("CARGO_PKG_VERSION"),
        only.map_or("the whole suite".to_string(), |s| format!(
            "the {s} section"
        ))
    ));
    md.push_str(
        "Each cell is the median over rounds of that round's median; the ranges are the rounds' \
         medians. B / A below 1 means B is faster (for MiB/s, above 1 does).\n\n",
    );
    md.push_str("| Figure | A (baseline) | B (this build) | B / A | A's rounds | B's rounds |\n");
    md.push_str("|---|---:|---:|---:|---|---|\n");
    for (name, unit, a, b) in &table {
        let (ma, mb) = (median(a), median(b));
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            name.replace('|', "\\|"),
            fmt(ma, unit),
            fmt(mb, unit),
            if ma.is_nan() || mb.is_nan() || ma == 0.0 {
                "—".to_string()
            } else {
                format!("{:.2}", mb / ma)
            },
            spread(a, unit),
            spread(b, unit),
        ));
    }
    md.push_str(&paired);
    md
}
