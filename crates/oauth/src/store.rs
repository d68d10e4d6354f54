//! The built-in authorization server's state, in SQLite (`<data dir>/oauth.db`, mode 0600):
//! registered clients, grants (a tenant's consent to one client), and the codes and tokens each
//! grant issued. Codes, tokens and client secrets are stored as SHA-256 digests only; a grant
//! that is revoked takes every code and token it issued with it. The operator commands open the
//! same file while the server runs (WAL, a busy timeout).
//!
//! Budgets: codes live a minute; expired tokens are deleted as new ones are issued; at most
//! [`MAX_DYNAMIC_CLIENTS`] clients registered themselves (unused ones are forgotten after a day
//! when room is needed), and at most [`MAX_GRANTS_PER_KEY`] grants stand for one access key.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use sandbox_mcp_model::ids;

/// Clients that registered themselves (RFC 7591) at most: registration is open to anyone.
pub const MAX_DYNAMIC_CLIENTS: i64 = 1000;
/// Grants one access key may hold: a sign-in loop cannot fill the disk.
pub const MAX_GRANTS_PER_KEY: i64 = 200;
/// An unused self-registered client may be forgotten after this long (ms).
const UNUSED_CLIENT_MS: i64 = 24 * 3600 * 1000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    redirect_uris TEXT NOT NULL,
    auth_method TEXT NOT NULL,
    secret_sha256 TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE TABLE IF NOT EXISTS grants (
    id TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    client_name TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    resource TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    used_at INTEGER,
    revoked_at INTEGER,
    revoked_why TEXT
);
CREATE INDEX IF NOT EXISTS grants_client ON grants(client_id);
CREATE TABLE IF NOT EXISTS codes (
    sha256 TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL,
    redirect_uri TEXT NOT NULL,
    challenge TEXT NOT NULL,
    nonce TEXT,
    expires_at INTEGER NOT NULL,
    used_at INTEGER
);
CREATE TABLE IF NOT EXISTS tokens (
    sha256 TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    scope TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at INTEGER
);
CREATE INDEX IF NOT EXISTS tokens_grant ON tokens(grant_id);
";

pub fn digest(secret: &str) -> String {
    ids::hex(&crate::jwt::sha2_256(secret.as_bytes()))
}

/// A new secret: a prefix naming what it is, then 256 random bits.
pub fn secret(prefix: &str) -> String {
    format!("{prefix}{}", &ids::api_key()[4..])
}

#[derive(Debug, Clone, Serialize)]
pub struct Client {
    pub client_id: String,
    /// `registered` (by the operator) or `dynamic` (RFC 7591); CIMD clients are not stored.
    pub kind: String,
    pub name: String,
    pub redirect_uris: Vec<String>,
    /// `none`, `client_secret_basic` or `client_secret_post`.
    pub auth_method: String,
    #[serde(skip)]
    pub secret_sha256: Option<String>,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Grant {
    pub id: String,
    pub client_id: String,
    pub client_name: String,
    pub tenant: String,
    pub key_id: String,
    pub scope: String,
    pub resource: String,
    pub created_at: String,
    pub used_at: Option<String>,
    pub revoked_at: Option<String>,
    pub revoked_why: Option<String>,
}

/// What a code was issued for.
pub struct Code {
    pub grant: Grant,
    pub redirect_uri: String,
    pub challenge: String,
    pub nonce: Option<String>,
    pub expired: bool,
    pub used: bool,
}

/// What a token stands for.
pub struct Token {
    pub grant: Grant,
    pub scope: String,
    pub expired: bool,
    pub used: bool,
}

pub struct Store {
    db: Mutex<Connection>,
}

fn time(ms: Option<i64>) -> Option<String> {
    ms.map(ids::rfc3339)
}

const GRANT_COLUMNS: &str = "g.id, g.client_id, g.client_name, g.tenant, g.key_id, g.scope, g.resource, g.created_at, g.used_at, g.revoked_at, g.revoked_why";

fn grant_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Grant> {
    Ok(Grant {
        id: r.get(at)?,
        client_id: r.get(at + 1)?,
        client_name: r.get(at + 2)?,
        tenant: r.get(at + 3)?,
        key_id: r.get(at + 4)?,
        scope: r.get(at + 5)?,
        resource: r.get(at + 6)?,
        created_at: ids::rfc3339(r.get(at + 7)?),
        used_at: time(r.get(at + 8)?),
        revoked_at: time(r.get(at + 9)?),
        revoked_why: r.get(at + 10)?,
    })
}

fn client_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Client> {
    let uris: String = r.get(3)?;
    Ok(Client {
        client_id: r.get(0)?,
        kind: r.get(1)?,
        name: r.get(2)?,
        redirect_uris: serde_json::from_str(&uris).unwrap_or_default(),
        auth_method: r.get(4)?,
        secret_sha256: r.get(5)?,
        created_at: ids::rfc3339(r.get(6)?),
        revoked_at: time(r.get(7)?),
    })
}

type Result<T> = std::result::Result<T, String>;

fn db_err(e: rusqlite::Error) -> String {
    format!("the OAuth database failed: {e}")
}

impl Store {
    pub fn open(data_dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(data_dir).map_err(|e| e.to_string())?;
        let path = data_dir.join("oauth.db");
        sandbox_mcp_sys::durable::private_file(&path)
            .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
        let db = Connection::open(&path).map_err(db_err)?;
        db.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(db_err)?;
        db.pragma_update(None, "journal_mode", "WAL")
            .map_err(db_err)?;
        db.execute_batch(SCHEMA).map_err(db_err)?;
        Ok(Store { db: Mutex::new(db) })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- clients ----

    /// Adds a client; returns its secret when it has one (shown once).
    pub fn add_client(
        &self,
        kind: &str,
        name: &str,
        redirect_uris: &[String],
        auth_method: &str,
    ) -> Result<(Client, Option<String>)> {
        let db = self.db();
        let now = ids::now_ms();
        if kind == "dynamic" {
            db.execute(
                "DELETE FROM clients WHERE kind = 'dynamic' AND created_at < ?1
                 AND client_id NOT IN (SELECT client_id FROM grants)",
                params![now - UNUSED_CLIENT_MS],
            )
            .map_err(db_err)?;
            let n: i64 = db
                .query_row(
                    "SELECT COUNT(*) FROM clients WHERE kind = 'dynamic'",
                    [],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            if n >= MAX_DYNAMIC_CLIENTS {
                return Err(format!(
                    "too many registered clients ({n}); try again later, or ask the operator to register this client"
                ));
            }
        }
        let secret = (auth_method != "none").then(|| secret("smcp_cs_"));
        let client = Client {
            client_id: format!("smcp_client_{}", &ids::nonce()[..20]),
            kind: kind.to_string(),
            name: name.to_string(),
            redirect_uris: redirect_uris.to_vec(),
            auth_method: auth_method.to_string(),
            secret_sha256: secret.as_deref().map(digest),
            created_at: ids::rfc3339(now),
            revoked_at: None,
        };
        db.execute(
            "INSERT INTO clients (client_id, kind, name, redirect_uris, auth_method, secret_sha256, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                client.client_id,
                kind,
                name,
                serde_json::to_string(redirect_uris).unwrap_or_default(),
                auth_method,
                client.secret_sha256,
                now
            ],
        )
        .map_err(db_err)?;
        Ok((client, secret))
    }

    pub fn client(&self, client_id: &str) -> Result<Option<Client>> {
        self.db()
            .query_row(
                "SELECT client_id, kind, name, redirect_uris, auth_method, secret_sha256, created_at, revoked_at
                 FROM clients WHERE client_id = ?1",
                params![client_id],
                client_row,
            )
            .optional()
            .map_err(db_err)
    }

    pub fn clients(&self) -> Result<Vec<Client>> {
        let db = self.db();
        let mut q = db
            .prepare(
                "SELECT client_id, kind, name, redirect_uris, auth_method, secret_sha256, created_at, revoked_at
                 FROM clients ORDER BY created_at",
            )
            .map_err(db_err)?;
        let rows = q.query_map([], client_row).map_err(db_err)?;
        rows.collect::<rusqlite::Result<_>>().map_err(db_err)
    }

    /// Revokes a client and every grant it holds (a CIMD client, which has no row, by its URL).
    pub fn revoke_client(&self, client_id: &str) -> Result<usize> {
        let db = self.db();
        let now = ids::now_ms();
        let clients = db
            .execute(
                "UPDATE clients SET revoked_at = ?2 WHERE client_id = ?1 AND revoked_at IS NULL",
                params![client_id, now],
            )
            .map_err(db_err)?;
        let grants = db
            .execute(
                "UPDATE grants SET revoked_at = ?2, revoked_why = 'client revoked by the operator'
                 WHERE client_id = ?1 AND revoked_at IS NULL",
                params![client_id, now],
            )
            .map_err(db_err)?;
        if clients == 0 && grants == 0 {
            let known: bool = db
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM clients WHERE client_id = ?1)
                     OR EXISTS(SELECT 1 FROM grants WHERE client_id = ?1)",
                    params![client_id],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            if !known {
                return Err(format!(
                    "no client {client_id}; `sandbox-mcp oauth clients list` shows them"
                ));
            }
        }
        Ok(grants)
    }

    /// Whether the client was revoked (also a CIMD client, by a revoked grant row kept for it).
    pub fn client_revoked(&self, client_id: &str) -> Result<bool> {
        self.db()
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM clients WHERE client_id = ?1 AND revoked_at IS NOT NULL)
                 OR EXISTS(SELECT 1 FROM grants WHERE client_id = ?1 AND revoked_why = 'client revoked by the operator')",
                params![client_id],
                |r| r.get(0),
            )
            .map_err(db_err)
    }

    // ---- grants and codes ----

    /// Records consent and issues a code for it; returns the code.
    #[allow(clippy::too_many_arguments)]
    pub fn grant_code(
        &self,
        client_id: &str,
        client_name: &str,
        tenant: &str,
        key_id: &str,
        scope: &str,
        resource: &str,
        redirect_uri: &str,
        challenge: &str,
        nonce: Option<&str>,
    ) -> Result<String> {
        let db = self.db();
        let now = ids::now_ms();
        db.execute("DELETE FROM codes WHERE expires_at < ?1", params![now])
            .map_err(db_err)?;
        let held: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM grants WHERE key_id = ?1 AND revoked_at IS NULL",
                params![key_id],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        if held >= MAX_GRANTS_PER_KEY {
            // The oldest unused grants of this key make room.
            db.execute(
                "UPDATE grants SET revoked_at = ?2, revoked_why = 'replaced by newer sign-ins'
                 WHERE id IN (SELECT id FROM grants WHERE key_id = ?1 AND revoked_at IS NULL
                              ORDER BY COALESCE(used_at, created_at) LIMIT ?3)",
                params![key_id, now, held - MAX_GRANTS_PER_KEY + 1],
            )
            .map_err(db_err)?;
        }
        let id = format!("grant_{}", &ids::nonce()[..16]);
        db.execute(
            "INSERT INTO grants (id, client_id, client_name, tenant, key_id, scope, resource, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![id, client_id, client_name, tenant, key_id, scope, resource, now],
        )
        .map_err(db_err)?;
        let code = secret("smcp_code_");
        db.execute(
            "INSERT INTO codes (sha256, grant_id, redirect_uri, challenge, nonce, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                digest(&code),
                id,
                redirect_uri,
                challenge,
                nonce,
                now + 60_000
            ],
        )
        .map_err(db_err)?;
        Ok(code)
    }

    /// Looks a code up and marks it used (whatever comes next: a code works once).
    pub fn take_code(&self, code: &str) -> Result<Option<Code>> {
        let db = self.db();
        let now = ids::now_ms();
        let sql = format!(
            "SELECT c.redirect_uri, c.challenge, c.nonce, c.expires_at, c.used_at, {GRANT_COLUMNS}
             FROM codes c JOIN grants g ON g.id = c.grant_id WHERE c.sha256 = ?1"
        );
        let found = db
            .query_row(&sql, params![digest(code)], |r| {
                Ok(Code {
                    redirect_uri: r.get(0)?,
                    challenge: r.get(1)?,
                    nonce: r.get(2)?,
                    expired: r.get::<_, i64>(3)? < now,
                    used: r.get::<_, Option<i64>>(4)?.is_some(),
                    grant: grant_row(r, 5)?,
                })
            })
            .optional()
            .map_err(db_err)?;
        if found.is_some() {
            db.execute(
                "UPDATE codes SET used_at = ?2 WHERE sha256 = ?1 AND used_at IS NULL",
                params![digest(code), now],
            )
            .map_err(db_err)?;
        }
        Ok(found)
    }

    pub fn grants(&self) -> Result<Vec<Grant>> {
        let db = self.db();
        let mut q = db
            .prepare(&format!(
                "SELECT {GRANT_COLUMNS} FROM grants g ORDER BY g.created_at"
            ))
            .map_err(db_err)?;
        let rows = q.query_map([], |r| grant_row(r, 0)).map_err(db_err)?;
        rows.collect::<rusqlite::Result<_>>().map_err(db_err)
    }

    /// Revokes a grant: its tokens stop working at once. False when it was unknown.
    pub fn revoke_grant(&self, id: &str, why: &str) -> Result<bool> {
        let db = self.db();
        let n = db
            .execute(
                "UPDATE grants SET revoked_at = ?2, revoked_why = ?3 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, ids::now_ms(), why],
            )
            .map_err(db_err)?;
        db.execute("DELETE FROM tokens WHERE grant_id = ?1", params![id])
            .map_err(db_err)?;
        if n == 0 {
            let known: bool = db
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM grants WHERE id = ?1)",
                    params![id],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            return Ok(known);
        }
        Ok(true)
    }

    // ---- tokens ----

    /// Issues an access token (and a refresh token) for a grant.
    pub fn issue(
        &self,
        grant_id: &str,
        scope: &str,
        access_ttl_ms: i64,
        refresh_ttl_ms: i64,
    ) -> Result<(String, String)> {
        let db = self.db();
        let now = ids::now_ms();
        db.execute("DELETE FROM tokens WHERE expires_at < ?1", params![now])
            .map_err(db_err)?;
        let access = secret("smcp_at_");
        let refresh = secret("smcp_rt_");
        for (token, kind, ttl) in [
            (&access, "access", access_ttl_ms),
            (&refresh, "refresh", refresh_ttl_ms),
        ] {
            db.execute(
                "INSERT INTO tokens (sha256, grant_id, kind, scope, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![digest(token), grant_id, kind, scope, now + ttl],
            )
            .map_err(db_err)?;
        }
        db.execute(
            "UPDATE grants SET used_at = ?2 WHERE id = ?1",
            params![grant_id, now],
        )
        .map_err(db_err)?;
        Ok((access, refresh))
    }

    /// What a token of `kind` stands for, if it exists; with `consume`, it is marked used (a
    /// refresh token works once).
    pub fn token(&self, token: &str, kind: &str, consume: bool) -> Result<Option<Token>> {
        let db = self.db();
        let now = ids::now_ms();
        let sql = format!(
            "SELECT t.scope, t.expires_at, t.used_at, {GRANT_COLUMNS}
             FROM tokens t JOIN grants g ON g.id = t.grant_id WHERE t.sha256 = ?1 AND t.kind = ?2"
        );
        let found = db
            .query_row(&sql, params![digest(token), kind], |r| {
                Ok(Token {
                    scope: r.get(0)?,
                    expired: r.get::<_, i64>(1)? < now,
                    used: r.get::<_, Option<i64>>(2)?.is_some(),
                    grant: grant_row(r, 3)?,
                })
            })
            .optional()
            .map_err(db_err)?;
        if consume && found.is_some() {
            db.execute(
                "UPDATE tokens SET used_at = ?2 WHERE sha256 = ?1 AND used_at IS NULL",
                params![digest(token), now],
            )
            .map_err(db_err)?;
        }
        Ok(found)
    }

    /// Deletes one access token (RFC 7009 revocation of an access token).
    pub fn delete_token(&self, token: &str) -> Result<()> {
        self.db()
            .execute(
                "DELETE FROM tokens WHERE sha256 = ?1 AND kind = 'access'",
                params![digest(token)],
            )
            .map_err(db_err)?;
        Ok(())
    }

    /// Which tables hold how many rows (for tests of the budgets).
    pub fn counts(&self) -> Result<(i64, i64, i64, i64)> {
        let db = self.db();
        let n = |t: &str| -> Result<i64> {
            db.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))
                .map_err(db_err)
        };
        Ok((n("clients")?, n("grants")?, n("codes")?, n("tokens")?))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
