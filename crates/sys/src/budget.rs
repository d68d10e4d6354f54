//! The engine's own budgets, which no sandbox may spend: its file descriptors and its memory.
//!
//! **Descriptors.** Every connection the relay carries costs the engine two descriptors (the
//! sandbox's end and the upstream), a preview request two, a DNS query sent upstream one. With
//! the soft `RLIMIT_NOFILE` of 1024 a systemd service gets, one sandbox's 512 connections used
//! to exhaust the engine: other sandboxes' commands failed, creates failed, and so did the kill
//! of the attacker. So the engine raises its soft limit to the hard one when it starts
//! ([`raise_nofile`]; the sandboxes' own processes get the old soft limit back, [`restore`]),
//! and shares out what it has: [`Descriptors`] hands out slots for sandbox-driven work from the
//! limit less a reserve (a quarter, at least 256) kept for the engine's own work — agent calls,
//! cgroup files, state, and the kills that free everything else — and no sandbox may hold more
//! than half of what it hands out.
//!
//! **Memory.** What a sandbox makes the engine allocate (relay buffers, decrypted connections)
//! is bounded per sandbox where it is allocated. For it to be given back when the sandbox goes,
//! large buffers must not stay in the allocator's free lists: [`tune_allocator`] has glibc map
//! every allocation of 128 KiB or more on its own (the default threshold rises with use, up to
//! 32 MiB, after which freed buffers stay in the heap), and [`give_back`] returns freed heap
//! pages to the kernel after a sandbox is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Descriptors kept for the engine's own work, at least.
const MIN_RESERVE: usize = 256;

/// The soft limit the engine started with, for its children.
static STARTED_WITH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard one; returns the limit now in force. The soft
/// limit found first is remembered for [`restore`].
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    STARTED_WITH.get_or_init(|| soft);
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// Puts back, in a child about to exec a sandbox's launcher, the soft limit the engine started
/// with: sandbox processes keep what they had before the engine raised its own (programs that
/// close every descriptor up to the limit, or use `select`, expect a small one). Only a system
/// call: safe between fork and exec.
pub fn restore() -> std::io::Result<()> {
    let Some(&soft) = STARTED_WITH.get() else {
        return Ok(());
    };
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit struct for each call; no allocation, no lock.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit.rlim_cur = soft.min(limit.rlim_max);
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The descriptors sandbox-driven work may use, shared by every sandbox of the engine.
#[derive(Debug)]
pub struct Descriptors {
    /// Slots handed out at most.
    total: usize,
    used: AtomicUsize,
}

/// Slots held; given back when dropped.
#[derive(Debug)]
pub struct Held {
    of: Arc<Descriptors>,
    n: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.of.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

impl Descriptors {
    /// Shares out `limit` descriptors (the process's `RLIMIT_NOFILE`), keeping a quarter of
    /// them (at least [`MIN_RESERVE`]) for the engine's own work.
    pub fn new(limit: u64) -> Arc<Descriptors> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let reserve = (limit / 4).max(MIN_RESERVE);
        Arc::new(Descriptors {
            total: limit.saturating_sub(reserve),
            used: AtomicUsize::new(0),
        })
    }

    /// Takes `n` slots, or none if that would pass the budget.
    pub fn take(self: &Arc<Self>, n: usize) -> Option<Held> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            if used + n > self.total {
                return None;
            }
            match self.used.compare_exchange_weak(
                used,
                used + n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Held {
                        of: self.clone(),
                        n,
                    });
                }
                Err(now) => used = now,
            }
        }
    }

    /// Slots handed out at most.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The relayed connections one sandbox may hold at once, whatever `--max-connections`
    /// says: half of what the budget has for connections (two descriptors each), so a sandbox
    /// that takes all it may still leaves the other half to every other sandbox.
    pub fn connections_per_sandbox(&self) -> usize {
        (self.total / 4).max(1)
    }
}

/// Has glibc map every allocation of 128 KiB or more on its own, so that freeing it gives it
/// back at once (see the module's doc). Once, at engine start.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Returns freed heap memory to the kernel (after a sandbox, and whatever the engine held for
/// it, is gone). Takes a few milliseconds with a large heap: call it off the async threads.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_a_reserve_and_gives_slots_back() {
        let d = Descriptors::new(1024);
        assert_eq!(d.total(), 768);
        assert_eq!(d.connections_per_sandbox(), 192);
        let small = Descriptors::new(300);
        assert_eq!(small.total(), 44, "at least 256 kept");
        let held: Vec<Held> = (0..384).map(|_| d.take(2).unwrap()).collect();
        assert!(d.take(1).is_none());
        drop(held);
        assert!(d.take(768).is_some());
        assert!(Descriptors::new(100).take(1).is_none());
    }

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one_and_back_for_children() {
        use nix::sys::resource::{Resource, getrlimit};
        use std::os::unix::process::CommandExt;
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(raise_nofile(), hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap().0, hard);
        let started = *STARTED_WITH.get().unwrap();
        // SAFETY: `restore` makes system calls only.
        let out = unsafe {
            std::process::Command::new("sh")
                .args(["-c", "ulimit -n"])
                .pre_exec(restore)
                .output()
                .unwrap()
        };
        let shown = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(shown, started.min(hard).to_string());
    }
}
