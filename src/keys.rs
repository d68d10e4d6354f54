//! MCP access keys for the HTTP transport: one per client, each bound to a tenant.
//!
//! Keys live in `<data dir>/mcp-keys.json` (mode 0600) as SHA-256 digests; a token is shown once,
//! when it is created, and cannot be recovered. The running server re-reads the file whenever it
//! changes, so `keys create` and `keys revoke` take effect without a restart. Writers take an
//! exclusive lock and replace the file atomically, so concurrent commands never lose a key.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::ids;

const FILE: &str = "mcp-keys.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub tenant: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "invalid tenant name {0:?}: use 1-63 characters from a-z, 0-9, `-` and `_`, starting with a letter or digit"
    )]
    InvalidTenant(String),
    #[error("no key {0}; `sandbox-mcp keys list` shows the keys")]
    NotFound(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{file} is corrupt: {reason}")]
    Corrupt { file: String, reason: String },
}

/// Whether `name` can be a tenant.
pub fn valid_tenant(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares two digests without revealing where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A key file's (mtime, inode, length).
type FileVersion = (SystemTime, u64, u64);

pub struct KeyStore {
    path: PathBuf,
    /// The records and the file version (mtime, inode, length) they were read from: writers
    /// replace the file, so a new inode marks a change even within one mtime tick.
    cache: RwLock<(Option<FileVersion>, Vec<KeyRecord>)>,
}

impl KeyStore {
    pub fn open(data_dir: &Path) -> Self {
        Self {
            path: data_dir.join(FILE),
            cache: RwLock::new((None, Vec::new())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<Vec<KeyRecord>, KeyError> {
        match fs::read_to_string(&self.path) {
            Ok(text) if text.trim().is_empty() => Ok(Vec::new()),
            Ok(text) => serde_json::from_str(&text).map_err(|e| KeyError::Corrupt {
                file: self.path.display().to_string(),
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs `change` on the records under an exclusive lock and writes the result atomically.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut Vec<KeyRecord>) -> Result<T, KeyError>,
    ) -> Result<T, KeyError> {
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        let lock_path = self.path.with_extension("lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)?;
        // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let mut records = self.read()?;
        let out = change(&mut records)?;
        let tmp = self
            .path
            .with_extension(format!("tmp.{}", std::process::id()));
        {
            let mut f = fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(&records).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &self.path)?;
        drop(lock);
        Ok(out)
    }

    /// Creates a key for `tenant`; returns its record and the token (shown only now).
    pub fn create(&self, tenant: &str) -> Result<(KeyRecord, String), KeyError> {
        if !valid_tenant(tenant) {
            return Err(KeyError::InvalidTenant(tenant.to_string()));
        }
        let token = format!("smcp_{}", &ids::api_key()[4..]);
        let record = KeyRecord {
            id: format!("key_{}", &ids::request_id()[..8]),
            tenant: tenant.to_string(),
            sha256: digest(&token),
            created_at: ids::rfc3339(ids::now_ms()),
            revoked_at: None,
        };
        let r = record.clone();
        self.update(move |records| {
            records.push(r);
            Ok(())
        })?;
        Ok((record, token))
    }

    pub fn list(&self) -> Result<Vec<KeyRecord>, KeyError> {
        self.read()
    }

    /// Revokes a key by id; it stops working at the server's next request.
    pub fn revoke(&self, id: &str) -> Result<KeyRecord, KeyError> {
        self.update(|records| {
            let r = records
                .iter_mut()
                .find(|r| r.id == id)
                .ok_or_else(|| KeyError::NotFound(id.to_string()))?;
            if r.revoked_at.is_none() {
                r.revoked_at = Some(ids::rfc3339(ids::now_ms()));
            }
            Ok(r.clone())
        })
    }

    /// The tenant of a valid, unrevoked token. Re-reads the file when it changed.
    pub fn tenant_of(&self, token: &str) -> Option<String> {
        let mtime = fs::metadata(&self.path)
            .and_then(|m| Ok((m.modified()?, m.ino(), m.len())))
            .ok();
        let stale = self
            .cache
            .read()
            .map_or(true, |c| c.0 != mtime || mtime.is_none());
        if stale {
            match self.read() {
                Ok(records) => {
                    let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
                    *cache = (mtime, records);
                }
                // A hand-edited file that does not parse: keep the last good keys, say why.
                Err(e) => {
                    tracing::warn!("keeping the previous keys: {e}");
                    self.cache.write().unwrap_or_else(|p| p.into_inner()).0 = mtime;
                }
            }
        }
        let want = digest(token);
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        // Look at every record so timing does not tell which matched.
        let mut found = None;
        for r in &cache.1 {
            if same(&r.sha256, &want) && r.revoked_at.is_none() && found.is_none() {
                found = Some(r.tenant.clone());
            }
        }
        found
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn create_check_revoke() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(dir.path());
        let (rec, token) = store.create("team-a").unwrap();
        assert!(token.starts_with("smcp_") && token.len() > 40);
        assert_eq!(store.tenant_of(&token).as_deref(), Some("team-a"));
        assert_eq!(store.tenant_of("smcp_wrong"), None);
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert!(!text.contains(&token), "tokens are stored hashed");
        // Another handle (another process) sees the revocation.
        KeyStore::open(dir.path()).revoke(&rec.id).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(store.tenant_of(&token), None);
        assert!(matches!(
            store.revoke("key_nope"),
            Err(KeyError::NotFound(_))
        ));
        assert!(matches!(
            store.create("Bad Name"),
            Err(KeyError::InvalidTenant(_))
        ));
    }
}
