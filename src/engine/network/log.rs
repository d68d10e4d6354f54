//! The network log: one row per connection or DNS query a sandbox made, kept in the engine's
//! SQLite file beside the sandbox's record, so it survives restarts and is readable while the
//! sandbox is paused.
//!
//! Rows are written by one thread in batches (a busy sandbox must not wait on the disk), and a
//! read first flushes what is pending, so a caller always sees what already happened. Identical
//! rows (same host, address, port, protocol, verdict and rule) within [`AGGREGATE_WINDOW_MS`] are
//! folded into one with a count and summed bytes; each sandbox keeps its newest [`MAX_ROWS`].
//! The log is written with `synchronous=NORMAL`: a power loss may drop its last rows, never a
//! sandbox.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::sys::now_ms;

/// Rows kept per sandbox; older ones are dropped.
pub(crate) const MAX_ROWS: i64 = 1000;
/// Repeats closer together than this are one row.
const AGGREGATE_WINDOW_MS: i64 = 60_000;
/// How long rows wait before they are written, unless a read asks for them.
const BATCH_DELAY: Duration = Duration::from_millis(250);
/// Most rows returned by one read.
pub(crate) const MAX_LIMIT: usize = 200;

/// One connection or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
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
pub(crate) struct Stored {
    pub id: i64,
    pub row: Row,
}

/// What to read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query {
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
}

/// The writer's handle. Cheap to clone; the thread stops when every handle is gone.
#[derive(Clone)]
pub(crate) struct NetLog {
    tx: mpsc::Sender<Msg>,
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
    /// Opens (and creates) the log in the database at `path` and starts its writer.
    pub(crate) fn open(path: &Path) -> rusqlite::Result<NetLog> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("network-log".into())
            .spawn(move || writer(conn, rx))
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        Ok(NetLog { tx })
    }

    pub(crate) fn record(&self, sandbox: &str, row: Row) {
        let _ = self.tx.send(Msg::Row(sandbox.to_string(), row));
    }

    /// Rows of one sandbox, newest first, after everything recorded so far is written.
    pub(crate) async fn read(&self, sandbox: &str, query: Query) -> rusqlite::Result<Vec<Stored>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Msg::Read(sandbox.to_string(), query, tx))
            .map_err(|_| rusqlite::Error::InvalidQuery)?;
        rx.await.map_err(|_| rusqlite::Error::InvalidQuery)?
    }

    /// Drops a killed sandbox's rows.
    pub(crate) fn forget(&self, sandbox: &str) {
        let _ = self.tx.send(Msg::Forget(sandbox.to_string()));
    }
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
pub(crate) fn row(
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
        let log = NetLog::open(&dir.path().join("state.db")).unwrap();
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

    /// The engine's state connection writes all the time (activity, statuses); a log flush
    /// that read before it wrote used to fail at once with SQLITE_BUSY when such a write came
    /// in between, and a read of the log failed with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_and_writes_hold_up_while_the_state_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let log = NetLog::open(&db).unwrap();
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
