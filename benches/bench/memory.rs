//! What an idle sandbox costs in memory: charged to its cgroup, and host-wide.

use std::time::Duration;

use crate::figures::{Figure, figure};
use crate::servers::{Engine, networking};

pub(crate) fn meminfo_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

pub(crate) fn cgroup_memory(id: &str) -> Option<u64> {
    for p in [
        format!("/sys/fs/cgroup/memory/sandbox-mcp/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/sandbox-mcp/{id}/memory.current"),
    ] {
        if let Ok(v) = std::fs::read_to_string(&p) {
            return v.trim().parse().ok();
        }
    }
    None
}

pub(crate) fn idle_memory(engine: &Engine, out: &mut Vec<Figure>) {
    let n = 200;
    // Warm the page cache and the template first, so the delta is per-sandbox cost.
    let warm = engine.create();
    engine.exec(&warm, "true");
    engine.kill(&warm);
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    let used_before = meminfo_kib("MemTotal:") - meminfo_kib("MemAvailable:");
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(engine.create());
    }
    std::thread::sleep(Duration::from_secs(2));
    let charged: Vec<f64> = ids
        .iter()
        .filter_map(|id| cgroup_memory(id))
        .map(|b| b as f64 / 1024.0 / 1024.0)
        .collect();
    let used_after = meminfo_kib("MemTotal:") - meminfo_kib("MemAvailable:");
    let per_sandbox_host = (used_after.saturating_sub(used_before)) as f64 / 1024.0 / n as f64;
    let (label, how) = networking(engine, &ids[0]);
    if !charged.is_empty() {
        out.push(figure(
            &format!("Memory per idle sandbox, {n} alive, {label} (charged to its cgroup)"),
            "MiB",
            charged,
            Some((1.0, "≤ 1 MiB")),
            &format!("memory cgroup usage of each idle sandbox: agent plus kernel objects; {how}"),
        ));
    }
    out.push(Figure {
        name: format!("Memory per idle sandbox, {n} alive, {label} (host-wide)"),
        unit: "MiB",
        median: per_sandbox_host,
        p95: f64::NAN,
        target: None,
        note: format!(
            "(MemTotal − MemAvailable) delta / N, including page tables, the engine's bookkeeping \
             and its relay sockets; {how}"
        ),
    });
    for id in ids {
        engine.kill(&id);
    }
}
