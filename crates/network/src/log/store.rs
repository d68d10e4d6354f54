//! The log's SQLite file and the one thread that writes it. Rows wait in memory (folded by
//! sandbox, host, address, port, protocol, verdict and rule) until a batch is due or a read asks
//! for them; a flush folds each into the newest stored row of the same key within
//! [`AGGREGATE_WINDOW_MS`] and trims each sandbox to its newest [`MAX_ROWS`]. While the database
//! refuses writes, at most [`MAX_PENDING`] rows wait: memory stays bounded over completeness.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{AGGREGATE_WINDOW_MS, MAX_LIMIT, MAX_ROWS, Msg, Query, Row, Stored};

/// How long rows wait before they are written, unless a read asks for them.
const BATCH_DELAY: Duration = Duration::from_millis(250);

pub(crate) const SCHEMA: &str = "
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

/// Moves the rows an older engine kept in the state database into the log's own file, and
/// drops the old table (once: afterwards the table is gone).
pub(crate) fn move_rows(conn: &Connection, legacy: &Path) -> rusqlite::Result<()> {
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

pub(crate) fn writer(conn: Connection, rx: mpsc::Receiver<Msg>) {
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
