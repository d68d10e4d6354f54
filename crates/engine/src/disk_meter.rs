//! What each sandbox's files take, as the driver measures it: by walking them, a lookup per file
//! (50 ms for 20,000 files here; the driver stops at a million). `sandbox_info` shows the figure
//! on every call, so a measurement is reused while it is younger than [`REUSE_FACTOR`] times
//! what it took (at most [`MAX_REUSE`]): asking in a loop costs the engine at most a
//! twentieth of a core per sandbox, and a sandbox with few files is measured on every call
//! anyway (a few microseconds make a window far shorter than any caller's loop). Callers that
//! need the figure as of now (`sandbox_metrics`, the disk check before a snapshot) say so, and
//! share a walk only with one that started after they asked. Either way one walk of a sandbox
//! runs at a time: concurrent callers wait for it rather than start their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A measurement is reused for this many times as long as it took.
pub(crate) const REUSE_FACTOR: u32 = 20;
/// ... and never longer than this.
pub(crate) const MAX_REUSE: Duration = Duration::from_secs(30);

/// One walk's result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    /// When the walk began: a file written before it is counted.
    pub started: Instant,
    pub took: Duration,
    pub bytes: u64,
}

impl Measured {
    /// Whether this measurement may stand for one asked for at `asked`, by a caller that
    /// wants it as of now (`fresh`) or accepts a recent one.
    pub(crate) fn serves(&self, asked: Instant, fresh: bool) -> bool {
        if self.started >= asked {
            return true;
        }
        !fresh && self.started.elapsed() < (self.took * REUSE_FACTOR).min(MAX_REUSE)
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

    fn measured(ago: Duration, took: Duration) -> Measured {
        Measured {
            started: Instant::now() - ago,
            took,
            bytes: 1,
        }
    }

    #[test]
    fn a_measurement_is_reused_in_proportion_to_its_cost() {
        let asked = Instant::now();
        let ms = Duration::from_millis;
        // A 50 ms walk 500 ms ago stands; 1.5 s ago it does not.
        assert!(measured(ms(500), ms(50)).serves(asked, false));
        assert!(!measured(ms(1500), ms(50)).serves(asked, false));
        // A cheap walk is redone at once.
        assert!(!measured(ms(1), Duration::from_micros(20)).serves(asked, false));
        // However slow, never past MAX_REUSE.
        assert!(!measured(MAX_REUSE + ms(1), Duration::from_secs(60)).serves(asked, false));
        // A caller that wants it as of now takes only a walk begun after it asked.
        assert!(!measured(ms(500), ms(50)).serves(asked, true));
        let later = Measured {
            started: asked + ms(1),
            took: ms(1),
            bytes: 1,
        };
        assert!(later.serves(asked, true));
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
