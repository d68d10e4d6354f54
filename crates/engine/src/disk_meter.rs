//! What each sandbox's files take, as the driver measures it: by walking them, a lookup per file
//! (50 ms for 20,000 files here; the driver stops at a million). `sandbox_info` shows the figure
//! on every call, so a measurement is reused while it is younger than [`REUSE_FACTOR`] times
//! what it took (at most [`MAX_REUSE`]): asking in a loop costs the engine at most a
//! twentieth of a core per sandbox, and a sandbox with few files is measured on every call
//! anyway (a few microseconds make a window far shorter than any caller's loop), unless nothing
//! went through the engine to it since: a sandbox no call of the engine has touched since a walk
//! began (no command, file or code call started or ended, none under way) reuses that walk for
//! up to [`QUIET_REUSE`]. So what a caller did through the engine is always counted by the next
//! description, and what its processes write on their own is counted within a second; 50
//! clients describing 50 quiet sandboxes in a loop no longer walk each on every call. Callers
//! that need the figure as of now (`sandbox_metrics`, the disk check before a snapshot) say so,
//! and share a walk only with one that started after they asked. Either way one walk of a
//! sandbox runs at a time: concurrent callers wait for it rather than start their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A measurement is reused for this many times as long as it took.
pub(crate) const REUSE_FACTOR: u32 = 20;
/// ... and never longer than this.
pub(crate) const MAX_REUSE: Duration = Duration::from_secs(30);
/// How long a walk stands, however cheap, for a sandbox the engine has not touched since it
/// began.
pub(crate) const QUIET_REUSE: Duration = Duration::from_secs(1);

/// One walk's result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    /// When the walk began: a file written before it is counted.
    pub started: Instant,
    /// The same moment on the clock the sandbox's activity is stamped with (ms).
    pub started_ms: i64,
    pub took: Duration,
    pub bytes: u64,
}

impl Measured {
    /// Whether this measurement may stand for one asked for at `asked`, by a caller that
    /// wants it as of now (`fresh`) or accepts a recent one. `last_active`: when a call of the
    /// engine last started or ended in the sandbox (ms), `None` while one is under way or when
    /// the caller cannot tell.
    pub(crate) fn serves(&self, asked: Instant, fresh: bool, last_active: Option<i64>) -> bool {
        if self.started >= asked {
            return true;
        }
        if fresh {
            return false;
        }
        let age = self.started.elapsed();
        let quiet = last_active.is_some_and(|at| at < self.started_ms);
        age < (self.took * REUSE_FACTOR).min(MAX_REUSE) || (quiet && age < QUIET_REUSE)
    }
}

/// Each sandbox's last measurement, behind a lock its next walk holds.
type Slot = Arc<tokio::sync::Mutex<Option<Measured>>>;

#[derive(Default)]
pub(crate) struct DiskMeter {
    slots: Mutex<HashMap<String, Slot>>,
}

impl DiskMeter {
    /// The slot of sandbox `id`, made on first use. Making one drops those nobody holds whose
    /// measurement could no longer be reused (gone sandboxes' among them): the map stays as
    /// large as the sandboxes measured in the last [`MAX_REUSE`].
    pub(crate) fn slot(&self, id: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.get(id) {
            return slot.clone();
        }
        slots.retain(|_, slot| {
            Arc::strong_count(slot) > 1
                || slot
                    .try_lock()
                    .map_or(true, |m| m.is_some_and(|m| m.started.elapsed() < MAX_REUSE))
        });
        slots.entry(id.to_string()).or_default().clone()
    }

    /// Forgets `id`'s measurement: its files were replaced or removed.
    pub(crate) fn forget(&self, id: &str) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW_MS: i64 = 1_000_000;

    fn measured(ago: Duration, took: Duration) -> Measured {
        Measured {
            started: Instant::now() - ago,
            started_ms: NOW_MS - ago.as_millis() as i64,
            took,
            bytes: 1,
        }
    }

    #[test]
    fn a_measurement_is_reused_in_proportion_to_its_cost() {
        // Each walk is asked about as soon as it is made: a walk made "1 ms ago" must not have
        // begun after the question, however long the test took to get there.
        let now = Instant::now;
        let ms = Duration::from_millis;
        // A 50 ms walk 500 ms ago stands; 1.5 s ago it does not.
        assert!(measured(ms(500), ms(50)).serves(now(), false, None));
        assert!(!measured(ms(1500), ms(50)).serves(now(), false, None));
        // A cheap walk is redone at once.
        assert!(!measured(ms(1), Duration::from_micros(20)).serves(now(), false, None));
        // However slow, never past MAX_REUSE.
        assert!(!measured(MAX_REUSE + ms(1), Duration::from_secs(60)).serves(now(), false, None));
        // A caller that wants it as of now takes only a walk begun after it asked.
        assert!(!measured(ms(500), ms(50)).serves(now(), true, None));
        let asked = now();
        let later = Measured {
            started: asked + ms(1),
            started_ms: NOW_MS + 1,
            took: ms(1),
            bytes: 1,
        };
        assert!(later.serves(asked, true, None));
    }

    #[test]
    fn a_cheap_walk_stands_for_a_second_only_while_the_engine_leaves_the_sandbox_alone() {
        let ms = Duration::from_millis;
        let cheap = |ago| measured(ago, Duration::from_micros(20));
        let walked_at = |ago: Duration| NOW_MS - ago.as_millis() as i64;
        // Last touched before the walk began: it stands up to QUIET_REUSE.
        let before = Some(walked_at(ms(300)) - 5);
        assert!(cheap(ms(300)).serves(Instant::now(), false, before));
        assert!(!cheap(QUIET_REUSE + ms(1)).serves(Instant::now(), false, before));
        // A call that started or ended since the walk began (even in its first millisecond),
        // or one under way: walked again.
        assert!(!cheap(ms(300)).serves(Instant::now(), false, Some(walked_at(ms(300)))));
        assert!(!cheap(ms(300)).serves(Instant::now(), false, Some(walked_at(ms(100)))));
        assert!(!cheap(ms(300)).serves(Instant::now(), false, None));
        // Never for a caller that wants the figure as of now.
        assert!(!cheap(ms(300)).serves(Instant::now(), true, before));
    }

    #[test]
    fn slots_of_sandboxes_not_measured_lately_are_dropped() {
        let meter = DiskMeter::default();
        let old = meter.slot("sbx_old");
        *old.try_lock().unwrap() =
            Some(measured(MAX_REUSE + Duration::from_secs(1), Duration::ZERO));
        drop(old);
        let recent = meter.slot("sbx_recent");
        *recent.try_lock().unwrap() = Some(measured(Duration::ZERO, Duration::ZERO));
        drop(recent);
        let held = meter.slot("sbx_held");
        meter.slot("sbx_new");
        let slots = meter.slots.lock().unwrap();
        let mut ids: Vec<_> = slots.keys().map(String::as_str).collect();
        ids.sort();
        // sbx_held has no measurement yet but is in use; sbx_new was made empty just now.
        assert_eq!(ids, ["sbx_held", "sbx_new", "sbx_recent"]);
        drop(held);
    }
}
