//! MCP access keys for the HTTP transport: one per client, each bound to a tenant.
//!
//! Keys live in `<data dir>/mcp-keys.json` (mode 0600) as SHA-256 digests; a token is shown once,
//! when it is created, and cannot be recovered. Checking a token goes through
//! [`sandbox_mcp_api::auth`] (constant-time, against every key; the file re-read when it changes,
//! so `keys create` and `keys revoke` take effect without a restart). Writers take an exclusive
//! lock and replace the file atomically ([`sandbox_mcp_sys::durable`]), so concurrent commands
//! never lose a key.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use sandbox_mcp_api::auth::{Digest, KeyFile};
use sandbox_mcp_model::ids;

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

fn parse(text: &str) -> Result<Vec<KeyRecord>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// An active key: its id and the tenant it stands for.
#[derive(Debug, Clone)]
struct Active {
    id: String,
    tenant: String,
}

/// The active keys of a key file's text, as digests and what they stand for.
fn active_keys(text: &str) -> Result<Vec<(Digest, Active)>, String> {
    Ok(parse(text)?
        .into_iter()
        .filter(|r| r.revoked_at.is_none())
        .filter_map(|r| {
            Some((
                Digest::from_hex(&r.sha256)?,
                Active {
                    id: r.id,
                    tenant: r.tenant,
                },
            ))
        })
        .collect())
}

pub struct KeyStore {
    file: KeyFile<Active>,
}

impl KeyStore {
    pub fn open(data_dir: &Path) -> Self {
        Self {
            file: KeyFile::new(data_dir.join(FILE), active_keys),
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    fn read(&self) -> Result<Vec<KeyRecord>, KeyError> {
        match fs::read_to_string(self.path()) {
            Ok(text) => parse(&text).map_err(|reason| KeyError::Corrupt {
                file: self.path().display().to_string(),
                reason,
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
        if let Some(dir) = self.path().parent() {
            fs::create_dir_all(dir)?;
        }
        let _lock = sandbox_mcp_sys::durable::lock(&self.path().with_extension("lock"))?;
        let mut records = self.read()?;
        let out = change(&mut records)?;
        let json = serde_json::to_vec_pretty(&records).map_err(std::io::Error::other)?;
        sandbox_mcp_sys::durable::write_atomically(self.path(), &json, 0o600)?;
        Ok(out)
    }

    /// Creates a key for `tenant`; returns its record and the token (shown only now).
    pub fn create(&self, tenant: &str) -> Result<(KeyRecord, String), KeyError> {
        if !sandbox_mcp_api::auth::valid_tenant(tenant) {
            return Err(KeyError::InvalidTenant(tenant.to_string()));
        }
        let token = format!("smcp_{}", &ids::api_key()[4..]);
        let record = KeyRecord {
            id: format!("key_{}", &ids::request_id()[..8]),
            tenant: tenant.to_string(),
            sha256: Digest::of(&token).to_hex(),
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

    /// The tenant of a valid, unrevoked token (the file is re-read when it changed).
    pub(crate) fn tenant_of(&self, token: &str) -> Option<String> {
        self.file.find(token).map(|a| a.tenant)
    }
}

/// The keys are who signs in on the OAuth sign-in page: a grant is the key's tenant's, and ends
/// when the key is revoked.
impl sandbox_mcp_oauth::Accounts for KeyStore {
    fn sign_in(&self, key: &str) -> Option<sandbox_mcp_oauth::Account> {
        if key.is_empty() {
            return None;
        }
        self.file.find(key).map(|a| sandbox_mcp_oauth::Account {
            key_id: a.id,
            tenant: a.tenant,
        })
    }

    fn active(&self, key_id: &str) -> bool {
        self.file.any(|a| a.id == key_id)
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
