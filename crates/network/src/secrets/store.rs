//! The secrets table: each value sealed with ChaCha20-Poly1305 under the engine's key, a fresh
//! random nonce per value, and the tenant and name as associated data (so a sealed value moved to
//! another row does not open). A value is opened only at the moment of use, so a rotation applies
//! to the next request; listings never hold one.

use std::path::Path;
use std::sync::Mutex;

use ring::aead::{Aad, LessSafeKey, NONCE_LEN, Nonce};
use rusqlite::{Connection, OptionalExtension, params};

use super::key::load_or_create_key;
use super::{DEFAULT_HEADER, NewSecret, SecretError, SecretMeta, Value, check};
use sandbox_mcp_model::ids;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS secrets (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    hosts TEXT NOT NULL,
    header TEXT,
    format TEXT,
    nonce BLOB NOT NULL,
    sealed BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
";

pub struct SecretStore {
    conn: Mutex<Connection>,
    key: LessSafeKey,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretStore")
    }
}

/// The headers of a stored secret: a JSON list, or one name as older engines stored it, or none
/// (older engines' "any header"), which is now [`DEFAULT_HEADER`].
fn headers_from_column(column: Option<String>) -> Vec<String> {
    match column {
        Some(text) if text.starts_with('[') => serde_json::from_str::<Vec<String>>(&text)
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| vec![DEFAULT_HEADER.to_string()]),
        Some(one) => vec![one],
        None => vec![DEFAULT_HEADER.to_string()],
    }
}

fn aad(tenant: &str, name: &str) -> Vec<u8> {
    let mut a = tenant.as_bytes().to_vec();
    a.push(0);
    a.extend_from_slice(name.as_bytes());
    a
}

impl SecretStore {
    /// Opens the store in `db` with the key in `key_file` (created, 0600, on first use).
    pub fn open(db: &Path, key_file: &Path) -> Result<Self, SecretError> {
        let key = load_or_create_key(key_file)?;
        let conn = Connection::open(db)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
            key,
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        f(&self.conn.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Creates or replaces a secret (a new value applies to the next request).
    pub fn set(
        &self,
        tenant: Option<&str>,
        new: &NewSecret,
        value: &[u8],
    ) -> Result<SecretMeta, SecretError> {
        check(new, value)?;
        let tenant_key = tenant.unwrap_or("");
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|e| SecretError::Invalid(format!("no randomness: {e}")))?;
        let mut sealed = value.to_vec();
        let sealing = self.key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(tenant_key, &new.name)),
            &mut sealed,
        );
        if sealing.is_err() {
            return Err(SecretError::Invalid("cannot seal the value".into()));
        }
        let hosts = serde_json::to_string(&new.hosts).unwrap_or_default();
        let headers = if new.headers.is_empty() {
            vec![DEFAULT_HEADER.to_string()]
        } else {
            new.headers.clone()
        };
        let headers = serde_json::to_string(&headers).unwrap_or_default();
        let now = ids::now_ms();
        self.with(|c| {
            c.execute(
                "INSERT INTO secrets (tenant, name, hosts, header, format, nonce, sealed, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
                 ON CONFLICT (tenant, name) DO UPDATE SET hosts = ?3, header = ?4, format = ?5,
                 nonce = ?6, sealed = ?7, updated_at = ?8",
                params![tenant_key, new.name, hosts, headers, new.format, &nonce[..], sealed, now],
            )
        })?;
        self.meta(tenant, &new.name)?
            .ok_or_else(|| SecretError::NotFound(new.name.clone()))
    }

    /// Every secret of `tenant`, by name (never a value).
    pub fn list(&self, tenant: Option<&str>) -> Result<Vec<SecretMeta>, SecretError> {
        Ok(self.with(|c| {
            let mut stmt = c.prepare(&format!("{SELECT} WHERE tenant = ?1 ORDER BY name"))?;
            let rows = stmt.query_map([tenant.unwrap_or("")], meta_row)?;
            rows.collect()
        })?)
    }

    pub fn meta(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Option<SecretMeta>, SecretError> {
        Ok(self.with(|c| {
            c.query_row(
                &format!("{SELECT} WHERE tenant = ?1 AND name = ?2"),
                params![tenant.unwrap_or(""), name],
                meta_row,
            )
            .optional()
        })?)
    }

    /// Deletes a secret; whether it existed. Bound sandboxes' requests then fail (logged).
    pub fn remove(&self, tenant: Option<&str>, name: &str) -> Result<bool, SecretError> {
        Ok(self.with(|c| {
            c.execute(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant.unwrap_or(""), name],
            )
        })? > 0)
    }

    /// The secret's description and decrypted value, read at the moment of use (so a rotation
    /// applies to the next request).
    pub fn open_value(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Option<(SecretMeta, Value)>, SecretError> {
        let tenant_key = tenant.unwrap_or("");
        let row = self.with(|c| {
            c.query_row(
                "SELECT nonce, sealed FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant_key, name],
                |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?)),
            )
            .optional()
        })?;
        let Some((nonce, mut sealed)) = row else {
            return Ok(None);
        };
        let nonce = Nonce::try_assume_unique_for_key(&nonce)
            .map_err(|_| SecretError::Invalid(format!("secret {name} is damaged")))?;
        let opened = self
            .key
            .open_in_place(nonce, Aad::from(aad(tenant_key, name)), &mut sealed)
            .map_err(|_| {
                SecretError::Invalid(format!(
                    "secret {name} does not open with this engine's key (was secrets.key replaced?); set it again"
                ))
            })?
            .len();
        sealed.truncate(opened);
        let value = Value(sealed);
        let meta = self
            .meta(tenant, name)?
            .ok_or_else(|| SecretError::NotFound(name.to_string()))?;
        Ok(Some((meta, value)))
    }
}

const SELECT: &str =
    "SELECT tenant, name, hosts, header, format, created_at, updated_at FROM secrets";

fn meta_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SecretMeta> {
    let tenant: String = r.get(0)?;
    let hosts: String = r.get(2)?;
    Ok(SecretMeta {
        tenant: (!tenant.is_empty()).then_some(tenant),
        name: r.get(1)?,
        hosts: serde_json::from_str(&hosts).unwrap_or_default(),
        headers: headers_from_column(r.get(3)?),
        format: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
    })
}
