//! The log end to end: folding, reading, bounds, the flood count, the move from an older
//! engine's state database, and writes that hold up beside the state's.

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
    let page = newest(&log, "sbx_c", 10).await;
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
        let _ = newest(&old, "sbx_old", 10).await;
    }
    let log = NetLog::open(&dir.path().join("network-log.db"), Some(&state)).unwrap();
    let rows = newest(&log, "sbx_old", 10).await;
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
    assert!(newest(&again, "sbx_old", 10).await.is_empty());
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

/// The newest `limit` entries of `sandbox`'s log, of every verdict.
async fn newest(log: &NetLog, sandbox: &str, limit: usize) -> Vec<Stored> {
    log.read(
        sandbox,
        Query {
            limit,
            ..Query::default()
        },
    )
    .await
    .unwrap()
}
