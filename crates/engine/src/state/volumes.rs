//! Named volumes: one row per (tenant, name), the untenanted caller's under the empty tenant.
//! The files are the driver's, under `key`; the row is written before they are made and deleted
//! after they are gone, so a crash between leaves a row whose files can be made or deleted again.

use rusqlite::{Connection, OptionalExtension, params};

use super::Store;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS volumes (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    key TEXT NOT NULL UNIQUE,
    quota_bytes INTEGER,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
";

/// The columns of `sandboxes` added since the first data dirs, each with what a row made before
/// it holds: no network rules (the engine's default), no secrets bound, no desktop, no volumes.
pub(super) fn add_columns(conn: &Connection) -> rusqlite::Result<()> {
    for (column, kind) in [
        ("network", "TEXT NOT NULL DEFAULT '{}'"),
        ("secrets", "TEXT NOT NULL DEFAULT '{}'"),
        ("desktop", "TEXT"),
        ("volumes", "TEXT NOT NULL DEFAULT '[]'"),
        ("on_timeout", "TEXT NOT NULL DEFAULT 'kill'"),
    ] {
        let has: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('sandboxes') WHERE name = ?1")?
            .exists([column])?;
        if !has {
            conn.execute_batch(&format!("ALTER TABLE sandboxes ADD COLUMN {column} {kind}"))?;
        }
    }
    Ok(())
}

/// One named volume; `tenant` is `None` for the untenanted caller's.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeRow {
    pub tenant: Option<String>,
    pub name: String,
    /// The driver's name for its directory.
    pub key: String,
    pub quota_bytes: Option<u64>,
    pub created_at: i64,
}

fn tenant_key(tenant: Option<&str>) -> &str {
    tenant.unwrap_or("")
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VolumeRow> {
    let tenant: String = r.get(0)?;
    Ok(VolumeRow {
        tenant: (!tenant.is_empty()).then_some(tenant),
        name: r.get(1)?,
        key: r.get(2)?,
        quota_bytes: r.get::<_, Option<i64>>(3)?.map(|q| q as u64),
        created_at: r.get(4)?,
    })
}

const SELECT: &str = "SELECT tenant, name, key, quota_bytes, created_at FROM volumes";

impl Store {
    /// Adds a volume's row unless the owner has one of that name or `max` volumes already:
    /// `Ok(None)` for a name taken, `Err` for the rest (checked and written in one transaction).
    pub(crate) fn insert_volume(&self, v: &VolumeRow, max: u64) -> rusqlite::Result<Option<bool>> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let t = tenant_key(v.tenant.as_deref());
            let taken: bool = tx
                .prepare("SELECT 1 FROM volumes WHERE tenant = ?1 AND name = ?2")?
                .exists(params![t, v.name])?;
            if taken {
                return Ok(None);
            }
            let count: i64 =
                tx.query_row("SELECT COUNT(*) FROM volumes WHERE tenant = ?1", [t], |r| {
                    r.get(0)
                })?;
            if count as u64 >= max {
                return Ok(Some(false));
            }
            tx.execute(
                "INSERT INTO volumes (tenant, name, key, quota_bytes, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    t,
                    v.name,
                    v.key,
                    v.quota_bytes.map(|q| q as i64),
                    v.created_at
                ],
            )?;
            tx.commit()?;
            Ok(Some(true))
        })
    }

    pub(crate) fn volume(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> rusqlite::Result<Option<VolumeRow>> {
        self.with(|c| {
            c.query_row(
                &format!("{SELECT} WHERE tenant = ?1 AND name = ?2"),
                params![tenant_key(tenant), name],
                row,
            )
            .optional()
        })
    }

    /// The owner's volumes, by name.
    pub(crate) fn volumes(&self, tenant: Option<&str>) -> rusqlite::Result<Vec<VolumeRow>> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!("{SELECT} WHERE tenant = ?1 ORDER BY name"))?;
            let rows = stmt.query_map([tenant_key(tenant)], row)?;
            rows.collect()
        })
    }

    pub(crate) fn delete_volume(&self, tenant: Option<&str>, name: &str) -> rusqlite::Result<()> {
        self.with(|c| {
            c.execute(
                "DELETE FROM volumes WHERE tenant = ?1 AND name = ?2",
                params![tenant_key(tenant), name],
            )
            .map(|_| ())
        })
    }
}
