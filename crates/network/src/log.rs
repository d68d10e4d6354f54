//! The network log: one row per connection or DNS query a sandbox made, kept in a SQLite file
//! of its own (`<data>/network-log.db`), so it survives restarts and is readable while the
//! sandbox is paused.
//!
//! Rows are written by one thread in batches (a busy sandbox must not wait on the disk), and a
//! read first flushes what is pending, so a caller always sees what already happened. Identical
//! rows (same host, address, port, protocol, verdict and rule) within [`AGGREGATE_WINDOW_MS`] are
//! folded into one with a count and summed bytes; each sandbox keeps its newest [`MAX_ROWS`].
//! The log is written with `synchronous=NORMAL`: a power loss may drop its last rows, never a
//! sandbox.
//!
//! A sandbox can make rows as fast as it can send packets (a million refused DNS queries in ten
//! seconds, each for another name), so what it costs is bounded where it is made: each sandbox
//! may log [`ROWS_PER_SECOND`] rows a second (bursts of [`BURST`]); what it makes beyond that is
//! counted, not queued, and the count is logged as one row per protocol (`count` is how many were
//! left out) once the sandbox is under the rate again or its log is read. The log's own file
//! keeps its writes from ever holding the state database's lock; and with the rate bounded, its
//! queue stays short, so another sandbox's read waits for little.
//!
//! This file is the log's handle and each sandbox's rate; `store` is the writer thread and the
//! SQLite file it folds rows into.

mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;

use sandbox_mcp_sys::now_ms;
use store::{SCHEMA, move_rows, writer};

/// Rows kept per sandbox; older ones are dropped.
pub const MAX_ROWS: i64 = 1000;
/// Repeats closer together than this are one row.
const AGGREGATE_WINDOW_MS: i64 = 60_000;
/// Most rows returned by one read.
pub const MAX_LIMIT: usize = 200;
/// Rows a sandbox may log a second, sustained …
pub const ROWS_PER_SECOND: f64 = 100.0;
/// … and at once.
pub const BURST: f64 = 1000.0;
/// The rule of a row that counts what a sandbox's flood left out of the log.
pub const FLOOD_RULE: &str = "left out of the log: this sandbox made more than 100 entries a second (a flood); count says how many";

/// One connection or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// When it started (ms since the epoch); for folded rows, the first.
    pub at: i64,
    /// When the last folded repeat started.
    pub last_at: i64,
    pub host: Option<String>,
    pub addr: Option<String>,
    pub port: Option<u16>,
    /// `dns`, `http`, `tls` or `tcp`.
    pub protocol: &'static str,
    /// `allowed`, `blocked` or `failed`.
    pub verdict: &'static str,
    pub rule: String,
    pub sent: u64,
    pub received: u64,
    pub duration_ms: u64,
    pub count: u64,
}

/// A stored row, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub id: i64,
    pub row: Row,
}

/// What to read.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub verdict: Option<String>,
    /// Only rows whose last repeat is at or after this (ms since the epoch).
    pub since: Option<i64>,
    pub limit: usize,
    /// Continue below this row id (the previous page's `next_cursor`).
    pub before: Option<i64>,
}

enum Msg {
    Row(String, Row),
    Read(
        String,
        Query,
        tokio::sync::oneshot::Sender<rusqlite::Result<Vec<Stored>>>,
    ),
    Forget(String),
    Retain(Vec<String>),
}

/// The writer's handle. Cheap to clone; the thread stops when every handle is gone.
#[derive(Clone)]
pub struct NetLog {
    tx: mpsc::Sender<Msg>,
    rates: std::sync::Arc<std::sync::Mutex<HashMap<String, Bucket>>>,
    /// Rows a second, and at once, per sandbox.
    rate: (f64, f64),
}

/// One sandbox's rate of rows, and what it left out.
struct Bucket {
    tokens: f64,
    at: std::time::Instant,
    rate: (f64, f64),
    /// Rows left out, by protocol.
    dropped: HashMap<&'static str, u64>,
}

impl Bucket {
    fn new((per_second, burst): (f64, f64)) -> Bucket {
        Bucket {
            tokens: burst,
            at: std::time::Instant::now(),
            rate: (per_second, burst),
            dropped: HashMap::new(),
        }
    }

    /// Whether one more row fits now.
    fn admit(&mut self) -> bool {
        let now = std::time::Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() * self.rate.0;
        self.tokens = (self.tokens + earned).min(self.rate.1);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The rows that say what was left out, and the count reset.
    fn summaries(&mut self) -> Vec<Row> {
        self.dropped
            .drain()
            .map(|(protocol, n)| {
                let mut r = row(None, None, protocol, "blocked", FLOOD_RULE.to_string());
                r.count = n;
                r
            })
            .collect()
    }
}

impl NetLog {
    /// Opens (and creates) the log in the database at `path` and starts its writer. Rows an
    /// older engine kept in the state database `legacy` (a table of the same name) move here
    /// the first time.
    pub fn open(path: &Path, legacy: Option<&Path>) -> rusqlite::Result<NetLog> {
        // Host names a sandbox reached are its owner's business only.
        sandbox_mcp_sys::durable::private_file(path)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        if let Some(old) = legacy.filter(|p| p.exists()) {
            move_rows(&conn, old)?;
        }
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("network-log".into())
            .spawn(move || writer(conn, rx))
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        Ok(NetLog {
            tx,
            rates: Default::default(),
            rate: (ROWS_PER_SECOND, BURST),
        })
    }

    /// The same log with another rate per sandbox (tests of what the rate does not cover).
    #[cfg(test)]
    fn with_rate(mut self, per_second: f64, burst: f64) -> NetLog {
        self.rate = (per_second, burst);
        self
    }

    /// Logs a row, unless the sandbox is over its rate: then it is only counted.
    pub fn record(&self, sandbox: &str, row: Row) {
        let summaries = {
            let mut rates = sandbox_mcp_sys::lock(&self.rates);
            let bucket = rates
                .entry(sandbox.to_string())
                .or_insert_with(|| Bucket::new(self.rate));
            if !bucket.admit() {
                *bucket.dropped.entry(row.protocol).or_default() += row.count;
                return;
            }
            bucket.summaries()
        };
        for summary in summaries {
            let _ = self.tx.send(Msg::Row(sandbox.to_string(), summary));
        }
        let _ = self.tx.send(Msg::Row(sandbox.to_string(), row));
    }

    /// Counts `n` events of the sandbox that were dropped before they could be logged (DNS
    /// queries over its rate): they show in the log's flood row.
    pub fn dropped(&self, sandbox: &str, protocol: &'static str, n: u64) {
        let mut rates = sandbox_mcp_sys::lock(&self.rates);
        let bucket = rates
            .entry(sandbox.to_string())
            .or_insert_with(|| Bucket::new(self.rate));
        *bucket.dropped.entry(protocol).or_default() += n;
    }

    /// Rows of one sandbox, newest first, after everything recorded so far is written (what
    /// a flood left out included, as its count).
    pub async fn read(&self, sandbox: &str, query: Query) -> rusqlite::Result<Vec<Stored>> {
        let summaries = sandbox_mcp_sys::lock(&self.rates)
            .get_mut(sandbox)
            .map(Bucket::summaries)
            .unwrap_or_default();
        for summary in summaries {
            let _ = self.tx.send(Msg::Row(sandbox.to_string(), summary));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Msg::Read(sandbox.to_string(), query, tx))
            .map_err(|_| rusqlite::Error::InvalidQuery)?;
        rx.await.map_err(|_| rusqlite::Error::InvalidQuery)?
    }

    /// Drops a killed sandbox's rows.
    pub fn forget(&self, sandbox: &str) {
        sandbox_mcp_sys::lock(&self.rates).remove(sandbox);
        let _ = self.tx.send(Msg::Forget(sandbox.to_string()));
    }

    /// Drops the rows of every sandbox but `live` (those forgotten while the engine was not
    /// running to see it, or in a crash between a kill and its log's deletion).
    pub fn retain(&self, live: Vec<String>) {
        let _ = self.tx.send(Msg::Retain(live));
    }
}

/// A log row for a connection that carried nothing (yet).
pub fn row(
    host: Option<String>,
    dst: Option<SocketAddr>,
    protocol: &'static str,
    verdict: &'static str,
    rule: String,
) -> Row {
    let at = now_ms();
    Row {
        at,
        last_at: at,
        host,
        addr: dst.map(|d| d.ip().to_string()),
        port: dst.map(|d| d.port()),
        protocol,
        verdict,
        rule,
        sent: 0,
        received: 0,
        duration_ms: 0,
        count: 1,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
