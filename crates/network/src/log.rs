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

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use sandbox_mcp_sys::now_ms;

/// Rows kept per sandbox; older ones are dropped.
pub const MAX_ROWS: i64 = 1000;
/// Repeats closer together than this are one row.
const AGGREGATE_WINDOW_MS: i64 = 60_000;
/// How long rows wait before they are written, unless a read asks for them.
const BATCH_DELAY: Duration = Duration::from_millis(250);
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

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS network_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox TEXT NOT NULL,
    at INTEGER NOT NULL,
    last_at INTEGER NOT NULL,
    host TEXT,
    addr TEXT,
    port INTEGER,
    protocol TEXT NOT NULL,
    verdict TEXT NOT NULL,
    rule TEXT NOT NULL,
    sent INTEGER NOT NULL,
    received INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    count INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS network_log_by_sandbox ON network_log (sandbox, id);
";

impl NetLog {
    /// Opens (and creates) the log in the database at `path` and starts its writer. Rows an
    /// older engine kept in the state database `legacy` (a table of the same name) move here
    /// the first time.
    pub fn open(path: &Path, legacy: Option<&Path>) -> rusqlite::Result<NetLog> {
        let conn = Connection::open(path)?;
        // Host names a sandbox reached are its owner's business only.
        let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600));
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

/// Moves the rows an older engine kept in the state database into the log's own file, and
/// drops the old table (once: afterwards the table is gone).
fn move_rows(conn: &Connection, legacy: &Path) -> rusqlite::Result<()> {
    conn.execute("ATTACH DATABASE ?1 AS legacy", [legacy.to_string_lossy()])?;
    let has_table: bool = conn.query_row(
        "SELECT count(*) > 0 FROM legacy.sqlite_master WHERE type = 'table' AND name = 'network_log'",
        [],
        |r| r.get(0),
    )?;
    if has_table {
        conn.execute_batch(
            "BEGIN IMMEDIATE;
             INSERT INTO main.network_log (sandbox, at, last_at, host, addr, port, protocol,
               verdict, rule, sent, received, duration_ms, count)
             SELECT sandbox, at, last_at, host, addr, port, protocol, verdict, rule, sent,
               received, duration_ms, count FROM legacy.network_log ORDER BY id;
             DROP TABLE legacy.network_log;
             COMMIT;",
        )?;
    }
    conn.execute("DETACH DATABASE legacy", [])?;
    Ok(())
}

type Key = (
    String,
    Option<String>,
    Option<String>,
    Option<u16>,
    &'static str,
    &'static str,
    String,
);

/// Rows kept in memory while the database refuses writes.
const MAX_PENDING: usize = 8192;

fn writer(conn: Connection, rx: mpsc::Receiver<Msg>) {
    let mut pending: HashMap<Key, Row> = HashMap::new();
    loop {
        let msg = if pending.is_empty() {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            }
        } else {
            match rx.recv_timeout(BATCH_DELAY) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = flush(&conn, &mut pending);
                    return;
                }
            }
        };
        match msg {
            Some(Msg::Row(sandbox, row)) => {
                let key = (
                    sandbox,
                    row.host.clone(),
                    row.addr.clone(),
                    row.port,
                    row.protocol,
                    row.verdict,
                    row.rule.clone(),
                );
                match pending.get_mut(&key) {
                    Some(p) => fold(p, &row),
                    None => {
                        pending.insert(key, row);
                    }
                }
                if pending.len() >= 512
                    && let Err(e) = flush(&conn, &mut pending)
                    && pending.len() >= MAX_PENDING
                {
                    // The database refuses writes (disk full?): bounded memory over completeness.
                    tracing::warn!(
                        "network log: cannot write, dropping {} rows: {e}",
                        pending.len()
                    );
                    pending.clear();
                }
            }
            Some(Msg::Read(sandbox, query, reply)) => {
                // What is stored is worth reading even if the newest rows cannot be written.
                if let Err(e) = flush(&conn, &mut pending) {
                    tracing::warn!("network log: cannot write: {e}");
                }
                let _ = reply.send(read(&conn, &sandbox, &query));
            }
            Some(Msg::Forget(sandbox)) => {
                pending.retain(|k, _| k.0 != sandbox);
                let _ = conn.execute("DELETE FROM network_log WHERE sandbox = ?1", [sandbox]);
            }
            Some(Msg::Retain(live)) => {
                let live: std::collections::HashSet<String> = live.into_iter().collect();
                pending.retain(|k, _| live.contains(&k.0));
                let logged: Vec<String> = conn
                    .prepare("SELECT DISTINCT sandbox FROM network_log")
                    .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(0))?.collect())
                    .unwrap_or_default();
                for gone in logged.into_iter().filter(|s| !live.contains(s)) {
                    let _ = conn.execute("DELETE FROM network_log WHERE sandbox = ?1", [gone]);
                }
            }
            None => {
                if let Err(e) = flush(&conn, &mut pending) {
                    tracing::warn!("network log: cannot write: {e}");
                }
            }
        }
    }
}

fn fold(into: &mut Row, row: &Row) {
    into.at = into.at.min(row.at);
    into.last_at = into.last_at.max(row.last_at);
    into.sent += row.sent;
    into.received += row.received;
    into.duration_ms += row.duration_ms;
    into.count += row.count;
}

fn flush(conn: &Connection, pending: &mut HashMap<Key, Row>) -> rusqlite::Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    // IMMEDIATE: the transaction reads before it writes, and a deferred one would then fail at
    // once (SQLITE_BUSY, no retry) whenever the engine's state connection wrote in between.
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
    let mut touched = Vec::new();
    // Oldest first, so that row ids follow time.
    // Copied, not drained: a batch that cannot be written stays pending for the next flush.
    let mut rows: Vec<(Key, Row)> = pending
        .iter()
        .map(|(k, r)| (k.clone(), r.clone()))
        .collect();
    rows.sort_by_key(|(_, r)| r.at);
    for (key, row) in rows {
        let sandbox = key.0;
        let existing: Option<i64> = tx
            .query_row(
                "SELECT id FROM network_log WHERE sandbox = ?1 AND host IS ?2 AND addr IS ?3
                 AND port IS ?4 AND protocol = ?5 AND verdict = ?6 AND rule = ?7 AND last_at >= ?8
                 ORDER BY id DESC LIMIT 1",
                params![
                    sandbox,
                    row.host,
                    row.addr,
                    row.port,
                    row.protocol,
                    row.verdict,
                    row.rule,
                    row.at - AGGREGATE_WINDOW_MS
                ],
                |r| r.get(0),
            )
            .optional()?;
        match existing {
            Some(id) => {
                tx.execute(
                    "UPDATE network_log SET last_at = max(last_at, ?2), sent = sent + ?3,
                     received = received + ?4, duration_ms = duration_ms + ?5, count = count + ?6
                     WHERE id = ?1",
                    params![
                        id,
                        row.last_at,
                        row.sent as i64,
                        row.received as i64,
                        row.duration_ms as i64,
                        row.count as i64
                    ],
                )?;
            }
            None => {
                tx.execute(
                    "INSERT INTO network_log (sandbox, at, last_at, host, addr, port, protocol,
                     verdict, rule, sent, received, duration_ms, count)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                    params![
                        sandbox,
                        row.at,
                        row.last_at,
                        row.host,
                        row.addr,
                        row.port,
                        row.protocol,
                        row.verdict,
                        row.rule,
                        row.sent as i64,
                        row.received as i64,
                        row.duration_ms as i64,
                        row.count as i64
                    ],
                )?;
            }
        }
        if !touched.contains(&sandbox) {
            touched.push(sandbox);
        }
    }
    for sandbox in touched {
        tx.execute(
            "DELETE FROM network_log WHERE sandbox = ?1 AND id <= (SELECT id FROM network_log
             WHERE sandbox = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            params![sandbox, MAX_ROWS],
        )?;
    }
    tx.commit()?;
    pending.clear();
    Ok(())
}

fn read(conn: &Connection, sandbox: &str, q: &Query) -> rusqlite::Result<Vec<Stored>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, at, last_at, host, addr, port, protocol, verdict, rule, sent, received,
         duration_ms, count FROM network_log
         WHERE sandbox = ?1 AND (?2 IS NULL OR verdict = ?2) AND (?3 IS NULL OR last_at >= ?3)
         AND (?4 IS NULL OR id < ?4) ORDER BY id DESC LIMIT ?5",
    )?;
    let rows = stmt.query_map(
        params![
            sandbox,
            q.verdict,
            q.since,
            q.before,
            q.limit.min(MAX_LIMIT) as i64
        ],
        |r| {
            let protocol: String = r.get(6)?;
            let verdict: String = r.get(7)?;
            Ok(Stored {
                id: r.get(0)?,
                row: Row {
                    at: r.get(1)?,
                    last_at: r.get(2)?,
                    host: r.get(3)?,
                    addr: r.get(4)?,
                    port: r.get(5)?,
                    protocol: intern(&protocol, &["dns", "http", "tls", "tcp"]),
                    verdict: intern(&verdict, &["allowed", "blocked", "failed"]),
                    rule: r.get(8)?,
                    sent: r.get::<_, i64>(9)? as u64,
                    received: r.get::<_, i64>(10)? as u64,
                    duration_ms: r.get::<_, i64>(11)? as u64,
                    count: r.get::<_, i64>(12)? as u64,
                },
            })
        },
    )?;
    rows.collect()
}

fn intern(s: &str, known: &[&'static str]) -> &'static str {
    known.iter().find(|k| **k == s).copied().unwrap_or("tcp")
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
mod tests {
    use super::*;

    fn row(host: &str, verdict: &'static str, at: i64, sent: u64) -> Row {
        Row {
            at,
            last_at: at,
            host: Some(host.into()),
            addr: Some("198.51.100.2".into()),
            port: Some(443),
            protocol: "tls",
            verdict,
            rule: "default open".into(),
            sent,
            received: 2 * sent,
            duration_ms: 1,
            count: 1,
        }
    }

    #[tokio::test]
    async fn repeats_fold_reads_flush_and_each_sandbox_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let log = NetLog::open(&dir.path().join("state.db"), None)
            .unwrap()
            .with_rate(1e9, 1e9);
        for i in 0..3 {
            log.record("sbx_a", row("pypi.test", "allowed", 1_000 + i, 10));
        }
        log.record("sbx_a", row("evil.test", "blocked", 1_005, 0));
        log.record("sbx_b", row("pypi.test", "allowed", 1_000, 1));
        // A page of sbx_a's log, of one verdict or all.
        let page = |verdict: Option<&str>| {
            log.read(
                "sbx_a",
                Query {
                    verdict: verdict.map(str::to_string),
                    limit: 50,
                    ..Query::default()
                },
            )
        };
        let all = page(None).await.unwrap();
        assert_eq!(all.len(), 2, "{all:?}");
        let folded = all.iter().find(|s| s.row.verdict == "allowed").unwrap();
        assert_eq!(
            (folded.row.count, folded.row.sent, folded.row.received),
            (3, 30, 60)
        );
        assert_eq!((folded.row.at, folded.row.last_at), (1_000, 1_002));
        // Folding continues across batches within the window.
        log.record("sbx_a", row("pypi.test", "allowed", 2_000, 5));
        let blocked = page(Some("blocked")).await.unwrap();
        assert_eq!(blocked.len(), 1);
        let again = page(None).await.unwrap();
        assert_eq!(again.iter().map(|s| s.row.count).sum::<u64>(), 5);
        // Bounded: distinct rows beyond the cap push the oldest out.
        for i in 0..(MAX_ROWS + 20) {
            log.record("sbx_c", row(&format!("h{i}.test"), "allowed", 5_000 + i, 1));
        }
        let page = log
            .read(
                "sbx_c",
                Query {
                    limit: 10,
                    ..Query::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            page[0].row.host.as_deref(),
            Some(&*format!("h{}.test", MAX_ROWS + 19))
        );
        let next = log
            .read(
                "sbx_c",
                Query {
                    limit: 10,
                    before: Some(page[9].id),
                    ..Query::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(next[0].id, page[9].id - 1);
        let conn = Connection::open(dir.path().join("state.db")).unwrap();
        let kept: i64 = conn
            .query_row(
                "SELECT count(*) FROM network_log WHERE sandbox = 'sbx_c'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(kept, MAX_ROWS);
        log.forget("sbx_a");
        assert!(
            log.read(
                "sbx_a",
                Query {
                    limit: 50,
                    ..Query::default()
                }
            )
            .await
            .unwrap()
            .is_empty()
        );
        assert_eq!(
            log.read(
                "sbx_b",
                Query {
                    limit: 50,
                    ..Query::default()
                }
            )
            .await
            .unwrap()
            .len(),
            1
        );
    }

    #[tokio::test]
    async fn a_flood_is_counted_not_queued_and_the_count_is_logged() {
        let dir = tempfile::tempdir().unwrap();
        let log = NetLog::open(&dir.path().join("network-log.db"), None).unwrap();
        let n = 20_000u64;
        for i in 0..n {
            let mut r = row(&format!("q{i}.tunnel.test"), "blocked", 1_000 + i as i64, 0);
            r.protocol = "dns";
            log.record("sbx_flood", r);
        }
        log.dropped("sbx_flood", "dns", 5);
        // Another sandbox is not held to the first one's rate.
        log.record("sbx_calm", row("pypi.test", "allowed", 1_000, 1));
        let read = |s: &'static str| {
            let log = log.clone();
            async move {
                let mut all = Vec::new();
                let mut before = None;
                loop {
                    let page = log
                        .read(
                            s,
                            Query {
                                limit: MAX_LIMIT,
                                before,
                                ..Query::default()
                            },
                        )
                        .await
                        .unwrap();
                    let Some(last) = page.last() else { break };
                    before = Some(last.id);
                    all.extend(page);
                }
                all
            }
        };
        let rows = read("sbx_flood").await;
        let flood: Vec<&Stored> = rows.iter().filter(|r| r.row.rule == FLOOD_RULE).collect();
        assert_eq!(flood.len(), 1, "{flood:?}");
        let logged = rows.len() as u64 - 1;
        assert!(logged <= MAX_ROWS as u64);
        // What was not logged is counted: all but the burst (and what the rate earned while
        // the loop ran), plus the 5 dropped before they could be.
        let count = flood[0].row.count;
        assert!(count <= n + 5 - BURST as u64, "{:?}", flood[0]);
        assert!(count >= n + 5 - 2 * BURST as u64, "{:?}", flood[0]);
        assert_eq!(flood[0].row.protocol, "dns");
        assert_eq!(read("sbx_calm").await.len(), 1);
    }

    #[tokio::test]
    async fn rows_an_older_engine_kept_in_the_state_database_move_over() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.db");
        {
            let old = NetLog::open(&state, None).unwrap();
            old.record("sbx_old", row("pypi.test", "allowed", 1_000, 7));
            let _ = old
                .read(
                    "sbx_old",
                    Query {
                        limit: 10,
                        ..Query::default()
                    },
                )
                .await
                .unwrap();
        }
        let log = NetLog::open(&dir.path().join("network-log.db"), Some(&state)).unwrap();
        let rows = log
            .read(
                "sbx_old",
                Query {
                    limit: 10,
                    ..Query::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].row.sent, 7);
        let conn = Connection::open(&state).unwrap();
        let left: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'network_log'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 0, "the old table is gone");
        // Opening again finds nothing more to move.
        drop(log);
        let again = NetLog::open(&dir.path().join("network-log.db"), Some(&state)).unwrap();
        again.retain(vec![]);
        assert!(
            again
                .read(
                    "sbx_old",
                    Query {
                        limit: 10,
                        ..Query::default()
                    }
                )
                .await
                .unwrap()
                .is_empty()
        );
    }

    /// The engine's state connection writes all the time (activity, statuses); a log flush
    /// that read before it wrote used to fail at once with SQLITE_BUSY when such a write came
    /// in between, and a read of the log failed with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_and_writes_hold_up_while_the_state_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let log = NetLog::open(&db, None).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let other = {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || {
                let conn = Connection::open(&db).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                conn.execute_batch("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
                    .unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    conn.execute("INSERT INTO t (v) VALUES (1)", []).unwrap();
                    std::thread::sleep(Duration::from_micros(300));
                }
            })
        };
        for i in 0..300 {
            log.record("sbx_a", row(&format!("h{i}.test"), "allowed", 1_000 + i, 1));
            let page = log
                .read(
                    "sbx_a",
                    Query {
                        limit: 1,
                        ..Query::default()
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("read {i}: {e}"));
            assert_eq!(page[0].row.host.as_deref(), Some(&*format!("h{i}.test")));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        other.join().unwrap();
    }
}
