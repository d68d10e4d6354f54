//! Hosted MCP servers' registrations: one row per (tenant, name), the operator's under the empty
//! tenant. The settings are the API's JSON, kept as given: the engine stores them and the MCP
//! layer runs them.

use rusqlite::{OptionalExtension, params};

use super::Store;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS servers (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    settings TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
";

/// One registration; `tenant` is `None` for the operator's.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerRow {
    pub tenant: Option<String>,
    pub name: String,
    pub settings: String,
    pub created_at: i64,
    pub updated_at: i64,
}

fn key(tenant: Option<&str>) -> &str {
    tenant.unwrap_or("")
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ServerRow> {
    let tenant: String = r.get(0)?;
    Ok(ServerRow {
        tenant: (!tenant.is_empty()).then_some(tenant),
        name: r.get(1)?,
        settings: r.get(2)?,
        created_at: r.get(3)?,
        updated_at: r.get(4)?,
    })
}

/// Why a registration was refused, decided in the same transaction as the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutRefused {
    /// A tenant asked for a name the operator shares.
    OperatorsName,
    /// The owner has `max` registrations already.
    Full,
}

impl Store {
    /// Creates or replaces a registration (keeping its creation time), unless a tenant asks for
    /// a name the operator shares or a new one would be over `max`: checked and written in one
    /// transaction, so two concurrent requests cannot both pass the checks.
    pub(crate) fn put_server_checked(
        &self,
        tenant: Option<&str>,
        name: &str,
        settings: &str,
        now: i64,
        max: u64,
    ) -> rusqlite::Result<Result<ServerRow, PutRefused>> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let exists = |t: Option<&str>| -> rusqlite::Result<bool> {
                tx.query_row(
                    "SELECT COUNT(*) FROM servers WHERE tenant = ?1 AND name = ?2",
                    params![key(t), name],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n > 0)
            };
            if tenant.is_some() && exists(None)? {
                return Ok(Err(PutRefused::OperatorsName));
            }
            if !exists(tenant)? {
                let count: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM servers WHERE tenant = ?1",
                    [key(tenant)],
                    |r| r.get(0),
                )?;
                if count as u64 >= max {
                    return Ok(Err(PutRefused::Full));
                }
            }
            tx.execute(
                "INSERT INTO servers (tenant, name, settings, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?4)
                 ON CONFLICT (tenant, name) DO UPDATE SET settings = ?3, updated_at = ?4",
                params![key(tenant), name, settings, now],
            )?;
            let row = tx.query_row(
                "SELECT tenant, name, settings, created_at, updated_at FROM servers
                 WHERE tenant = ?1 AND name = ?2",
                params![key(tenant), name],
                row,
            )?;
            tx.commit()?;
            Ok(Ok(row))
        })
    }

    /// Creates or replaces a registration (keeping its creation time).
    #[cfg(test)]
    pub(crate) fn put_server(
        &self,
        tenant: Option<&str>,
        name: &str,
        settings: &str,
        now: i64,
    ) -> rusqlite::Result<ServerRow> {
        self.with(|c| {
            c.execute(
                "INSERT INTO servers (tenant, name, settings, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?4)
                 ON CONFLICT (tenant, name) DO UPDATE SET settings = ?3, updated_at = ?4",
                params![key(tenant), name, settings, now],
            )?;
            c.query_row(
                "SELECT tenant, name, settings, created_at, updated_at FROM servers
                 WHERE tenant = ?1 AND name = ?2",
                params![key(tenant), name],
                row,
            )
        })
    }

    pub(crate) fn server(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> rusqlite::Result<Option<ServerRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT tenant, name, settings, created_at, updated_at FROM servers
                 WHERE tenant = ?1 AND name = ?2",
                params![key(tenant), name],
                row,
            )
            .optional()
        })
    }

    /// The tenant's registrations and the operator's, by name.
    pub(crate) fn servers(&self, tenant: Option<&str>) -> rusqlite::Result<Vec<ServerRow>> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT tenant, name, settings, created_at, updated_at FROM servers
                 WHERE tenant = ?1 OR tenant = '' ORDER BY name, tenant",
            )?;
            stmt.query_map([key(tenant)], row)?.collect()
        })
    }

    #[cfg(test)]
    pub(crate) fn count_servers(&self, tenant: Option<&str>) -> rusqlite::Result<u64> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM servers WHERE tenant = ?1",
                [key(tenant)],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
        })
    }

    pub(crate) fn delete_server(&self, tenant: Option<&str>, name: &str) -> rusqlite::Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM servers WHERE tenant = ?1 AND name = ?2",
                params![key(tenant), name],
            )
            .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn registrations_are_per_tenant_and_the_operator_s_are_seen_by_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        store.put_server(None, "time", "{}", 1).unwrap();
        store.put_server(Some("a"), "mine", "{\"x\":1}", 2).unwrap();
        let again = store.put_server(Some("a"), "mine", "{\"x\":2}", 3).unwrap();
        assert_eq!((again.created_at, again.updated_at), (2, 3));
        // Checked in the write's own transaction: the operator's name, and the owner's count.
        assert_eq!(
            store
                .put_server_checked(Some("a"), "time", "{}", 4, 10)
                .unwrap(),
            Err(PutRefused::OperatorsName)
        );
        assert_eq!(
            store
                .put_server_checked(Some("a"), "other", "{}", 4, 1)
                .unwrap(),
            Err(PutRefused::Full)
        );
        assert!(
            store
                .put_server_checked(Some("a"), "mine", "{}", 5, 1)
                .unwrap()
                .is_ok()
        );
        let names = |t| {
            store
                .servers(t)
                .unwrap()
                .into_iter()
                .map(|r| r.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(Some("a")), ["mine", "time"]);
        assert_eq!(names(Some("b")), ["time"]);
        assert!(store.server(Some("b"), "mine").unwrap().is_none());
        assert!(!store.delete_server(Some("b"), "mine").unwrap());
        assert!(store.delete_server(Some("a"), "mine").unwrap());
        drop(store);
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        assert_eq!(store.count_servers(None).unwrap(), 1);
    }
}
