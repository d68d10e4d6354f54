//! The timers: expired sandboxes are killed, idle ones paused, activity written down; on a
//! driver whose engine replicas share records, what the others changed is taken in.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sandbox_mcp_model::ids;
use tokio_util::sync::CancellationToken;

use super::lifecycle::Lifecycle;
use super::registry::{Registry, Runtime};
use crate::state::Status;

pub(crate) struct Timers {
    /// How often they run.
    tick: Duration,
    /// Idle time after which a running sandbox is paused (`None`: never).
    idle_pause: Option<Duration>,
    /// Idle time after which a paused sandbox is hibernated (`None`: never).
    idle_hibernate: Option<Duration>,
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
}

impl Timers {
    pub(crate) fn new(
        tick: Duration,
        (idle_pause, idle_hibernate): (Option<Duration>, Option<Duration>),
        registry: Arc<Registry>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        Self {
            tick,
            idle_pause,
            idle_hibernate,
            registry,
            lifecycle,
        }
    }

    /// One pass of the timers: kill expired sandboxes, pause idle ones, persist activity.
    pub(crate) async fn tick(&self) {
        if let Err(e) = self.registry.sync_shared().await {
            tracing::warn!("cannot read the sandboxes other replicas made: {e}");
        }
        let now = ids::now_ms();
        for (id, entry) in self.registry.ready() {
            let record = entry.record();
            if record.timed_out(now) {
                let action = record.on_timeout.as_str();
                tracing::info!(sandbox = %id, "timeout reached: {action}");
                // A failed pause or stop keeps the timeout: the next tick tries again.
                if let Err(e) = self
                    .lifecycle
                    .at_timeout(&id, &entry, record.on_timeout)
                    .await
                {
                    tracing::warn!(sandbox = %id, "{action} at timeout failed: {e}");
                }
                continue;
            }
            if let Some(idle) = self.idle_pause
                && record.status == Status::Running
                && entry.inflight.load(Ordering::Relaxed) == 0
                && now - entry.last_active.load(Ordering::Relaxed) >= idle.as_millis() as i64
            {
                tracing::info!(sandbox = %id, "idle; pausing");
                if let Err(e) = self.lifecycle.pause_entry(&id, &entry).await {
                    tracing::debug!(sandbox = %id, "auto-pause skipped: {e}");
                }
            }
            let last_active = entry.last_active.load(Ordering::Relaxed);
            if let Some(idle) = self.idle_hibernate
                && self.lifecycle.can_hibernate()
                && entry.inflight.load(Ordering::Relaxed) == 0
                && now - last_active >= idle.as_millis() as i64
                && entry.hibernate_refused.load(Ordering::Relaxed) != last_active
                && entry
                    .lifecycle
                    .try_lock()
                    .is_ok_and(|rt| matches!(*rt, Runtime::Running | Runtime::Frozen))
            {
                tracing::info!(sandbox = %id, "idle; hibernating");
                if let Err(e) = self.lifecycle.hibernate_entry(&id, &entry).await {
                    // Tried again once the sandbox has been used, not at every tick: each try
                    // dumps its processes.
                    entry
                        .hibernate_refused
                        .store(last_active, Ordering::Relaxed);
                    tracing::warn!(sandbox = %id, "auto-hibernate failed: {e}");
                }
            }
            self.lifecycle.flush_active(&id, &entry).await;
        }
    }

    /// Runs the timers until `stop` fires.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut interval = tokio::time::interval(self.tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = interval.tick() => self.tick().await,
            }
        }
    }
}
