//! Live output: a streaming call's `output` events become MCP progress notifications, throttled
//! so a chatty build does not flood the client: at most one every 250 ms (or sooner once 4 KiB is
//! waiting), each carrying at most 4 KiB of text, in whole lines where possible (a partial line
//! waits up to a second for its end). The `progress` value is the number of output bytes seen so
//! far, so it always increases.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;
use serde_json::Value;

use crate::call::{CallFailure, EventStream, event_failure};

const INTERVAL: Duration = Duration::from_millis(250);
const BATCH: usize = 4 * 1024;

/// Where to send progress for one call.
#[derive(Clone)]
pub struct Progress {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

struct Throttle {
    progress: Progress,
    pending: String,
    skipped: u64,
    seen: u64,
    started: tokio::time::Instant,
    last_sent: Option<tokio::time::Instant>,
    /// When the unfinished line at the end of `pending` began.
    partial_since: Option<tokio::time::Instant>,
}

/// A partial line is held back this long, hoping for the rest of it.
const PARTIAL_WAIT: Duration = Duration::from_secs(1);
/// The first notification waits this long to gather the first lines.
const FIRST_WAIT: Duration = Duration::from_millis(50);

impl Throttle {
    fn push(&mut self, data: &str) {
        self.seen += data.len() as u64;
        self.pending.push_str(data);
        if self.pending.ends_with('\n') {
            self.partial_since = None;
        } else if self.partial_since.is_none() {
            self.partial_since = Some(tokio::time::Instant::now());
        }
        // Keep only the newest text when more arrives than a few notifications may carry.
        if self.pending.len() > 4 * BATCH {
            let mut cut = self.pending.len() - BATCH;
            while !self.pending.is_char_boundary(cut) {
                cut += 1;
            }
            self.skipped += cut as u64;
            self.pending.drain(..cut);
        }
    }

    /// When the next notification should go out, if there is anything to send.
    fn due(&self) -> Option<tokio::time::Instant> {
        if self.pending.is_empty() {
            return None;
        }
        if self.pending.len() >= BATCH {
            return Some(tokio::time::Instant::now());
        }
        let paced = self
            .last_sent
            .map_or(self.started + FIRST_WAIT, |t| t + INTERVAL);
        if self.pending.contains('\n') {
            Some(paced)
        } else {
            Some(paced.max(self.partial_since.unwrap_or(self.started) + PARTIAL_WAIT))
        }
    }

    /// Sends what is pending: whole lines only, unless `all` or a partial line waited too long.
    async fn flush(&mut self, all: bool) {
        let stale = self
            .partial_since
            .is_some_and(|t| t.elapsed() >= PARTIAL_WAIT);
        let end = if all || stale || self.pending.len() >= BATCH {
            self.pending.len()
        } else {
            self.pending.rfind('\n').map_or(0, |i| i + 1)
        };
        if end == 0 {
            return;
        }
        let mut text: String = self.pending.drain(..end).collect();
        if self.pending.is_empty() {
            self.partial_since = None;
        }
        if text.len() > BATCH {
            let mut cut = text.len() - BATCH;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            self.skipped += cut as u64;
            text.drain(..cut);
        }
        if self.skipped > 0 {
            text = format!("…[{} bytes not shown]…\n{text}", self.skipped);
            self.skipped = 0;
        }
        let param = ProgressNotificationParam::new(self.progress.token.clone(), self.seen as f64)
            .with_message(text);
        // A client that went away is not an error for the call itself.
        let _ = self.progress.peer.notify_progress(param).await;
        self.last_sent = Some(tokio::time::Instant::now());
    }
}

/// Reads `events` to their final result, sending output as progress on the way.
pub(crate) async fn relay(
    mut events: EventStream,
    progress: Progress,
) -> Result<Value, CallFailure> {
    let mut throttle = Throttle {
        progress,
        pending: String::new(),
        skipped: 0,
        seen: 0,
        started: tokio::time::Instant::now(),
        last_sent: None,
        partial_since: None,
    };
    loop {
        let next = match throttle.due() {
            Some(at) => tokio::select! {
                e = events.next() => e?,
                () = tokio::time::sleep_until(at) => {
                    throttle.flush(false).await;
                    continue;
                }
            },
            None => events.next().await?,
        };
        let Some(event) = next else {
            return Err(CallFailure::BadResponse(
                "the event stream ended without a result".into(),
            ));
        };
        match event["type"].as_str() {
            // stdout and stderr interleave, as in a terminal.
            Some("output") => throttle.push(event["data"].as_str().unwrap_or("")),
            Some("result") => {
                throttle.flush(true).await;
                return Ok(event["result"].clone());
            }
            Some("error") => return Err(event_failure(&event)),
            _ => {}
        }
    }
}
