//! Figures: repeated samples reduced to a median and a 95th percentile (for rates, the rate 95% of
//! runs reach), with the target they are checked against; and the timing helpers that take them.

use std::time::{Duration, Instant};

/// One measured figure.
pub(crate) struct Figure {
    pub(crate) name: String,
    pub(crate) unit: &'static str,
    pub(crate) median: f64,
    pub(crate) p95: f64,
    pub(crate) target: Option<(f64, &'static str)>,
    pub(crate) note: String,
}

pub(crate) fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx]
}

pub(crate) fn figure(
    name: &str,
    unit: &'static str,
    mut samples: Vec<f64>,
    target: Option<(f64, &'static str)>,
    note: &str,
) -> Figure {
    let median = percentile(&mut samples, 0.5);
    // The slow tail: for a rate, the one 95% of runs reach.
    let p95 = percentile(
        &mut samples,
        if higher_is_better(unit) { 0.05 } else { 0.95 },
    );
    eprintln!(
        "{name}: median {median:.3} {unit}, p95 {p95:.3} {unit} ({} runs)",
        samples.len()
    );
    Figure {
        name: name.into(),
        unit,
        median,
        p95,
        target,
        note: format!("{note} ({} runs)", samples.len()),
    }
}

/// Units whose figures are better when larger (rates, shares): their targets are minimums.
pub(crate) fn higher_is_better(unit: &str) -> bool {
    matches!(unit, "MiB/s" | "MB/s" | "GB/s" | "calls/s" | "%")
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let start = Instant::now();
    let v = f();
    (start.elapsed(), v)
}

pub(crate) fn median_p95(samples: &[f64]) -> (f64, f64) {
    let mut s = samples.to_vec();
    (percentile(&mut s, 0.5), percentile(&mut s, 0.95))
}
