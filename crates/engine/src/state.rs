//! Durable sandbox records in SQLite (WAL, `synchronous=FULL`): a record is committed before
//! the API acknowledges the change it describes, so a crash (even `kill -9`, even power loss)
//! never loses an acknowledged sandbox.
//!
//! Status transitions are written around the effects they describe: `creating` before a sandbox
//! is built and `running` once it is; `killing` before it is torn down and the row deleted after.
//! On restart, `creating` rows (never acknowledged) and `killing` rows are cleaned up.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use sandbox_mcp_model::driver::Shape;
pub use sandbox_mcp_model::record::OnTimeout;
pub use sandbox_mcp_model::{Binding, NetworkRules, Preview, Record, Snapshot, Status};

mod servers;
mod volumes;

pub use servers::{PutRefused, ServerRow};
pub use volumes::VolumeRow;

pub struct Store {
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    name TEXT,
    template TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT NOT NULL,
    env TEXT NOT NULL,
    vcpus REAL NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_mb INTEGER NOT NULL,
    max_pids INTEGER NOT NULL,
    uid_slot INTEGER NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL,
    expires_at INTEGER,
    tenant TEXT,
    network TEXT NOT NULL DEFAULT '{}',
    secrets TEXT NOT NULL DEFAULT '{}',
    desktop TEXT
);
CREATE TABLE IF NOT EXISTS previews (
    sandbox_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    token TEXT NOT NULL,
    public INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (sandbox_id, port)
);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    name TEXT,
    ready INTEGER NOT NULL,
    method TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '1');
";

/// Inserts one record on `c` (a connection or a transaction).
fn insert_on(c: &Connection, r: &Record) -> rusqlite::Result<()> {
    let [metadata, env, network, secrets, volumes] = json_columns(r)?;
    let desktop = desktop_column(r)?;
    c.execute(
        "INSERT INTO sandboxes (id, name, template, status, metadata, env, vcpus, memory_mb, disk_mb,
         max_pids, uid_slot, created_at, last_active_at, expires_at, tenant, network, secrets,
         desktop, volumes, on_timeout)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
         ?19, ?20)",
        params![
            r.id,
            r.name,
            r.template,
            r.status.as_str(),
            metadata,
            env,
            r.shape.vcpus,
            r.shape.memory_mb as i64,
            r.shape.disk_mb as i64,
            r.shape.max_pids as i64,
            r.uid_slot,
            r.created_at,
            r.last_active_at,
            r.expires_at,
            r.tenant,
            network,
            secrets,
            desktop,
            volumes,
            r.on_timeout.as_str(),
        ],
    )
    .map(|_| ())
}

/// The columns of a record stored as JSON: metadata, env, network, secrets, volumes.
fn json_columns(r: &Record) -> rusqlite::Result<[String; 5]> {
    Ok([
        serde_json::to_string(&r.metadata).map_err(db_err)?,
        serde_json::to_string(&r.env).map_err(db_err)?,
        serde_json::to_string(&r.network).map_err(db_err)?,
        serde_json::to_string(&r.secrets).map_err(db_err)?,
        serde_json::to_string(&r.volumes).map_err(db_err)?,
    ])
}

/// The desktop column: JSON, or NULL for a sandbox without one.
fn desktop_column(r: &Record) -> rusqlite::Result<Option<String>> {
    r.desktop
        .map(|d| serde_json::to_string(&d).map_err(db_err))
        .transpose()
}

fn db_err(e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(e.to_string().into())
}

impl Store {
    pub fn open(path: &Path) -> rusqlite::Result<Self> {
        // Records hold sandbox environment variables, which may be secrets.
        sandbox_mcp_sys::durable::private_file(path).map_err(db_err)?;
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(servers::SCHEMA)?;
        conn.execute_batch(volumes::SCHEMA)?;
        // Data dirs from before a column keep their rows, with its default.
        volumes::add_columns(&conn)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&conn)
    }

    pub fn insert(&self, r: &Record) -> rusqlite::Result<()> {
        self.with(|c| insert_on(c, r))
    }

    /// Inserts every record, in one transaction (one commit to wait for, not one each).
    pub(crate) fn insert_all(&self, records: &[Record]) -> rusqlite::Result<()> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            for r in records {
                insert_on(&tx, r)?;
            }
            tx.commit()
        })
    }

    /// Sets the status of every sandbox named, in one transaction.
    pub(crate) fn set_status_all(
        &self,
        ids: &[impl AsRef<str>],
        status: Status,
    ) -> rusqlite::Result<()> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            for id in ids {
                tx.execute(
                    "UPDATE sandboxes SET status = ?2 WHERE id = ?1",
                    params![id.as_ref(), status.as_str()],
                )?;
            }
            tx.commit()
        })
    }

    pub fn set_status(&self, id: &str, status: Status) -> rusqlite::Result<()> {
        self.set_status_all(&[id], status)
    }

    /// Replaces what is given of the metadata and the network rules, in one statement: an
    /// update is stored whole or not at all.
    pub(crate) fn update(
        &self,
        id: &str,
        metadata: Option<&BTreeMap<String, String>>,
        network: Option<&NetworkRules>,
    ) -> rusqlite::Result<()> {
        let metadata = metadata
            .map(serde_json::to_string)
            .transpose()
            .map_err(db_err)?;
        let network = network
            .map(serde_json::to_string)
            .transpose()
            .map_err(db_err)?;
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET metadata = COALESCE(?2, metadata), network = COALESCE(?3, network)
                 WHERE id = ?1",
                params![id, metadata, network],
            )
            .map(|_| ())
        })
    }

    /// Gives a pooled sandbox its owner's request: name, labels, environment, expiry, tenant,
    /// network rules, secrets and timestamps.
    pub(crate) fn adopt(&self, r: &Record) -> rusqlite::Result<()> {
        let [metadata, env, network, secrets, _] = json_columns(r)?;
        let desktop = desktop_column(r)?;
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET name = ?2, metadata = ?3, env = ?4, created_at = ?5,
                 last_active_at = ?6, expires_at = ?7, tenant = ?8, network = ?9, secrets = ?10,
                 desktop = ?11, on_timeout = ?12
                 WHERE id = ?1",
                params![
                    r.id,
                    r.name,
                    metadata,
                    env,
                    r.created_at,
                    r.last_active_at,
                    r.expires_at,
                    r.tenant,
                    network,
                    secrets,
                    desktop,
                    r.on_timeout.as_str()
                ],
            )
            .map(|_| ())
        })
    }

    /// Replaces the sandbox's secret bindings.
    pub(crate) fn set_secrets(
        &self,
        id: &str,
        secrets: &BTreeMap<String, Binding>,
    ) -> rusqlite::Result<()> {
        let secrets = serde_json::to_string(secrets).map_err(db_err)?;
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET secrets = ?2 WHERE id = ?1",
                params![id, secrets],
            )
            .map(|_| ())
        })
    }

    pub(crate) fn set_last_active(&self, id: &str, at: i64) -> rusqlite::Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET last_active_at = ?2 WHERE id = ?1",
                params![id, at],
            )
            .map(|_| ())
        })
    }

    pub(crate) fn set_expiry(&self, id: &str, at: Option<i64>) -> rusqlite::Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET expires_at = ?2 WHERE id = ?1",
                params![id, at],
            )
            .map(|_| ())
        })
    }

    /// Deletes the sandbox's record, its previews and its snapshots' records, in one transaction.
    pub fn delete(&self, id: &str) -> rusqlite::Result<()> {
        self.with(|c| {
            let tx =
                rusqlite::Transaction::new_unchecked(c, rusqlite::TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM previews WHERE sandbox_id = ?1", params![id])?;
            tx.execute("DELETE FROM snapshots WHERE sandbox_id = ?1", params![id])?;
            tx.execute("DELETE FROM sandboxes WHERE id = ?1", params![id])?;
            tx.commit()
        })
    }

    /// Stores a sandbox's preview of a port, replacing the one it had.
    pub(crate) fn put_preview(&self, id: &str, p: &Preview) -> rusqlite::Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO previews (sandbox_id, port, token, public, created_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, p.port, p.token, p.public, p.created_at, p.expires_at],
            )
            .map(|_| ())
        })
    }

    /// Deletes a sandbox's preview of a port; whether there was one.
    pub(crate) fn delete_preview(&self, id: &str, port: u16) -> rusqlite::Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM previews WHERE sandbox_id = ?1 AND port = ?2",
                params![id, port],
            )
            .map(|n| n > 0)
        })
    }

    /// Every preview, with its sandbox's id.
    pub(crate) fn previews(&self) -> rusqlite::Result<Vec<(String, Preview)>> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT sandbox_id, port, token, public, created_at, expires_at FROM previews",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    Preview {
                        port: r.get(1)?,
                        token: r.get(2)?,
                        public: r.get(3)?,
                        created_at: r.get(4)?,
                        expires_at: r.get(5)?,
                    },
                ))
            })?;
            rows.collect()
        })
    }

    pub fn get(&self, id: &str) -> rusqlite::Result<Option<Record>> {
        self.with(|c| {
            c.query_row(&format!("{SELECT} WHERE id = ?1"), params![id], row)
                .optional()
        })
    }

    /// Stores a snapshot's record: `ready: false` before its files are made (or while they are
    /// deleted), so a crash in between leaves a row that recovery cleans up, never one that
    /// names missing files.
    pub(crate) fn put_snapshot(&self, s: &Snapshot) -> rusqlite::Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO snapshots (id, sandbox_id, name, ready, method, size_bytes, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    s.id,
                    s.sandbox_id,
                    s.name,
                    s.ready,
                    s.method,
                    s.size_bytes as i64,
                    s.created_at
                ],
            )
            .map(|_| ())
        })
    }

    pub(crate) fn delete_snapshot(&self, id: &str) -> rusqlite::Result<()> {
        self.with(|c| {
            c.execute("DELETE FROM snapshots WHERE id = ?1", params![id])
                .map(|_| ())
        })
    }

    /// Every snapshot, or those of one sandbox, oldest first.
    pub(crate) fn snapshots(&self, sandbox: Option<&str>) -> rusqlite::Result<Vec<Snapshot>> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, sandbox_id, name, ready, method, size_bytes, created_at FROM snapshots
                 WHERE ?1 IS NULL OR sandbox_id = ?1 ORDER BY created_at, id",
            )?;
            let rows = stmt.query_map(params![sandbox], |r| {
                Ok(Snapshot {
                    id: r.get(0)?,
                    sandbox_id: r.get(1)?,
                    name: r.get(2)?,
                    ready: r.get(3)?,
                    method: r.get(4)?,
                    size_bytes: r.get::<_, i64>(5)? as u64,
                    created_at: r.get(6)?,
                    memory_bytes: None,
                })
            })?;
            rows.collect()
        })
    }

    pub fn all(&self) -> rusqlite::Result<Vec<Record>> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!("{SELECT} ORDER BY created_at DESC, id"))?;
            let rows = stmt.query_map([], row)?;
            rows.collect()
        })
    }
}

const SELECT: &str =
    "SELECT id, name, template, status, metadata, env, vcpus, memory_mb, disk_mb, max_pids,
    uid_slot, created_at, last_active_at, expires_at, tenant, network, secrets, desktop, volumes,
    on_timeout
    FROM sandboxes";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Record> {
    let metadata: String = r.get(4)?;
    let env: String = r.get(5)?;
    let network: String = r.get(15)?;
    let secrets: String = r.get(16)?;
    let desktop: Option<String> = r.get(17)?;
    let volumes: String = r.get(18)?;
    Ok(Record {
        id: r.get(0)?,
        name: r.get(1)?,
        template: r.get(2)?,
        status: Status::parse(&r.get::<_, String>(3)?),
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        env: serde_json::from_str(&env).unwrap_or_default(),
        shape: Shape {
            vcpus: r.get(6)?,
            memory_mb: r.get::<_, i64>(7)? as u64,
            disk_mb: r.get::<_, i64>(8)? as u64,
            max_pids: r.get::<_, i64>(9)? as u64,
        },
        uid_slot: r.get(10)?,
        created_at: r.get(11)?,
        last_active_at: r.get(12)?,
        expires_at: r.get(13)?,
        tenant: r.get(14)?,
        network: serde_json::from_str(&network).unwrap_or_default(),
        secrets: serde_json::from_str(&secrets).unwrap_or_default(),
        desktop: desktop.and_then(|d| serde_json::from_str(&d).ok()),
        volumes: serde_json::from_str(&volumes).unwrap_or_default(),
        on_timeout: OnTimeout::parse(&r.get::<_, String>(19)?),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
