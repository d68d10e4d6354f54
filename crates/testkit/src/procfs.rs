//! A process's own figures from `/proc`: what the tests hold an engine's memory to, and what the
//! benchmarks report of it.

/// A field of `/proc/<pid>/status` counted in kB (`"VmRSS:"`, `"VmHWM:"`: the name with its
/// colon), in KiB; `None` when the process or the field is not there.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}
