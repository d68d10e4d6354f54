//! What `/proc/<pid>/stat` says about a host process.

/// Field `n` of a process's `stat`, counted from the one after the command name (0 is the
/// state, 1 the parent's pid, 19 the start time): the name may itself hold spaces and
/// parentheses, so the fields are found after its last `)`.
pub(crate) fn stat_field(pid: i32, n: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(n)?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_process_s_parent_and_start_time_are_read_past_its_name() {
        let me = std::process::id() as i32;
        let parent = stat_field(me, 1).unwrap();
        assert_eq!(parent, std::os::unix::process::parent_id() as u64);
        assert!(stat_field(me, 19).unwrap() > 0);
        assert_eq!(stat_field(i32::MAX, 1), None);
    }
}
