//! Brokered secrets: values stored encrypted, bound to sandboxes as stand-ins, swapped in by the
//! egress path for the secret's own hosts only. Security-critical; keep it small.
//!
//! - The value is sealed with ChaCha20-Poly1305 (ring) under a 256-bit key kept in its own file,
//!   `<data>/secrets.key` (mode 0600), never in the database; each value has a fresh random
//!   nonce, and the tenant and name are its associated data, so a sealed value moved to another
//!   row does not open.
//! - Values enter only through the operator (`sandbox-mcp secrets set`, reading stdin, or the
//!   engine API, which no model-facing tool binds) and leave only decrypted in the engine's
//!   memory, on their way into a request header for one of the secret's hosts.
//! - A sandbox sees a stand-in: random, unique to the sandbox and binding, worthless elsewhere.

use std::path::Path;
use std::sync::Mutex;

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rusqlite::{Connection, OptionalExtension, params};

use crate::policy::Domain;
use sandbox_mcp_model::ids;

/// Largest value accepted (API keys and tokens are far smaller; a header must stay small).
pub const MAX_VALUE: usize = 8 * 1024;
/// Most hosts per secret.
pub const MAX_HOSTS: usize = 32;
/// What a stand-in starts with (it must never look like anything but itself).
pub const STANDIN_PREFIX: &str = "sbxsecret_";
/// The header a value goes in when its operator names none: where API keys and tokens go.
pub const DEFAULT_HEADER: &str = "Authorization";
/// Most headers per secret.
pub const MAX_HEADERS: usize = 4;
/// Headers no value may go in: ones servers echo back or route requests by, and ones that
/// describe the request rather than authenticate it. A value there would come back to the
/// sandbox (an `Origin` mirrored in CORS headers, a `Referer` on an error page) or go where the
/// request is routed, not where the secret is for.
const NOT_FOR_SECRETS: &[&str] = &[
    "host",
    "origin",
    "referer",
    "user-agent",
    "via",
    "forwarded",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "max-forwards",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "cache-control",
    "pragma",
    "date",
    "dnt",
];
/// Prefixes of such headers.
const NOT_FOR_SECRETS_PREFIX: &[&str] = &[
    "x-forwarded-",
    "content-",
    "accept",
    "sec-",
    "access-control-",
];

/// A secret's description: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretMeta {
    pub tenant: Option<String>,
    pub name: String,
    /// Domain patterns (`api.example.com`, `*.example.org`) the value may be sent to.
    pub hosts: Vec<String>,
    /// The request headers the value may go in (at least one: [`DEFAULT_HEADER`] unless its
    /// operator named others). A stand-in in any other header is refused.
    pub headers: Vec<String>,
    /// The header's whole value, `{value}` replaced (`Bearer {value}`); none: the stand-in
    /// alone is replaced.
    pub format: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl SecretMeta {
    /// Whether the value may go to `host`.
    pub fn allows(&self, host: &str) -> bool {
        host_matches(&self.hosts, host)
    }

    /// Whether the value may go in the request header `name`.
    pub fn allows_header(&self, name: &str) -> bool {
        self.headers.iter().any(|h| h.eq_ignore_ascii_case(name))
    }
}

/// Whether `host` is one of the patterns `hosts`.
pub fn host_matches(hosts: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    hosts
        .iter()
        .filter_map(|h| Domain::parse(h))
        .any(|d| d.matches(&host))
}

/// A decrypted value; its bytes are wiped when dropped.
pub struct Value(Vec<u8>);

impl Value {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value(s.into_bytes())
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: a valid, aligned, exclusive reference; volatile so the wipe is not elided.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Value(…)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{0}")]
    Invalid(String),
    #[error("no secret named {0}")]
    NotFound(String),
    #[error("the secrets key file {}: {source}", path.display())]
    Key {
        path: std::path::PathBuf,
        #[source]
        source: KeyError,
    },
    #[error("secret store: {0}")]
    Db(#[from] rusqlite::Error),
}

/// What is wrong with the secrets key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("is readable by others (mode {0:o}); run chmod 600 on it")]
    Exposed(u32),
    #[error("no randomness for a new key: {0}")]
    Random(getrandom::Error),
    #[error("holds {0} bytes, not a 32-byte key")]
    Length(usize),
}

/// What the operator gives when setting a secret.
#[derive(Debug, Clone, Default)]
pub struct NewSecret {
    pub name: String,
    pub hosts: Vec<String>,
    /// The headers the value may go in; empty: [`DEFAULT_HEADER`].
    pub headers: Vec<String>,
    pub format: Option<String>,
}

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

/// Checks a secret's name: what `secrets set` and bindings call it.
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SecretError::Invalid(format!(
            "{name:?} is not a secret name: use 1-64 letters, digits, `_`, `-` or `.` (e.g. openai-key)"
        )))
    }
}

fn check(new: &NewSecret, value: &[u8]) -> Result<(), SecretError> {
    check_name(&new.name)?;
    let invalid = |s: String| Err(SecretError::Invalid(s));
    if new.hosts.is_empty() {
        return invalid(format!(
            "secret {} has no hosts: give at least one --host (e.g. api.example.com or *.example.org), the hosts its value may be sent to",
            new.name
        ));
    }
    if new.hosts.len() > MAX_HOSTS {
        return invalid(format!("at most {MAX_HOSTS} hosts per secret"));
    }
    for h in &new.hosts {
        if Domain::parse(h).is_none() {
            return invalid(format!(
                "{h:?} is not a host pattern: write a name (api.example.com) or a wildcard (*.example.org)"
            ));
        }
    }
    if new.headers.len() > MAX_HEADERS {
        return invalid(format!("at most {MAX_HEADERS} headers per secret"));
    }
    for h in &new.headers {
        check_header(h)?;
    }
    if let Some(f) = &new.format
        && (f.matches("{value}").count() != 1 || f.contains(['\r', '\n']))
    {
        return invalid(format!(
            "{f:?} is not a format: write it with {{value}} once, e.g. 'Bearer {{value}}'"
        ));
    }
    if value.is_empty() {
        return invalid("the value is empty: pipe it on stdin, e.g. `printenv API_KEY | sandbox-mcp secrets set …`".into());
    }
    if value.len() > MAX_VALUE {
        return invalid(format!(
            "the value is {} bytes; at most {MAX_VALUE} (it is sent in an HTTP header)",
            value.len()
        ));
    }
    if value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return invalid(
            "the value holds a line break or NUL, which an HTTP header cannot carry (trim the trailing newline)"
                .into(),
        );
    }
    Ok(())
}

/// Checks a header a value may go in: a valid name, and not one servers echo back or route by.
fn check_header(h: &str) -> Result<(), SecretError> {
    if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() {
        return Err(SecretError::Invalid(format!(
            "{h:?} is not an HTTP header name"
        )));
    }
    let lower = h.to_ascii_lowercase();
    if NOT_FOR_SECRETS.contains(&lower.as_str())
        || NOT_FOR_SECRETS_PREFIX.iter().any(|p| lower.starts_with(p))
    {
        return Err(SecretError::Invalid(format!(
            "{h} cannot carry a secret: servers echo it back or route requests by it; name the header the API reads its key from (Authorization, X-API-Key, …)"
        )));
    }
    Ok(())
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

/// Reads the 32-byte key, or creates it (0600, never overwritten). A key readable by others is
/// refused: whoever reads it and the database has every value.
fn load_or_create_key(path: &Path) -> Result<LessSafeKey, SecretError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let fail = |source: KeyError| SecretError::Key {
        path: path.to_path_buf(),
        source,
    };
    let io = |e: std::io::Error| fail(KeyError::Io(e));
    let mut bytes = Vec::new();
    match std::fs::OpenOptions::new().read(true).open(path) {
        Ok(f) => {
            let mode = f.metadata().map_err(io)?.mode();
            if mode & 0o077 != 0 {
                return Err(fail(KeyError::Exposed(mode & 0o777)));
            }
            f.take(64).read_to_end(&mut bytes).map_err(io)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).map_err(|e| fail(KeyError::Random(e)))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            f.write_all(&key).and_then(|()| f.sync_all()).map_err(io)?;
            bytes = key.to_vec();
        }
        Err(e) => return Err(io(e)),
    }
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
        .map_err(|_| fail(KeyError::Length(bytes.len())))?;
    bytes.fill(0);
    Ok(LessSafeKey::new(unbound))
}

/// A new stand-in: what a sandbox sees in place of a secret.
pub fn standin() -> String {
    format!("{STANDIN_PREFIX}{}", ids::preview_token())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SecretStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SecretStore::open(
            &dir.path().join("state.db"),
            &dir.path().join("secrets.key"),
        )
        .unwrap();
        (dir, s)
    }

    fn new(name: &str, hosts: &[&str]) -> NewSecret {
        NewSecret {
            name: name.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ..NewSecret::default()
        }
    }

    #[test]
    fn values_are_sealed_at_rest_and_per_tenant() {
        let (dir, s) = store();
        let value = b"sk-test-1234567890abcdef";
        s.set(None, &new("api", &["api.example.test"]), value)
            .unwrap();
        s.set(
            Some("t2"),
            &new("api", &["other.test"]),
            b"tenant-two-value",
        )
        .unwrap();
        let (meta, v) = s.open_value(None, "api").unwrap().unwrap();
        assert_eq!(v.as_bytes(), value);
        assert!(meta.allows("API.example.test."));
        assert!(!meta.allows("example.test"));
        assert_eq!(
            s.open_value(Some("t2"), "api")
                .unwrap()
                .unwrap()
                .1
                .as_bytes(),
            b"tenant-two-value"
        );
        assert!(s.open_value(Some("t3"), "api").unwrap().is_none());
        // Neither the database nor its WAL holds the value in clear.
        for f in ["state.db", "state.db-wal"] {
            if let Ok(bytes) = std::fs::read(dir.path().join(f)) {
                assert!(!bytes.windows(value.len()).any(|w| w == value), "{f}");
            }
        }
        // A sealed value moved to another row does not open.
        let conn = Connection::open(dir.path().join("state.db")).unwrap();
        conn.execute(
            "UPDATE secrets SET nonce = (SELECT nonce FROM secrets WHERE tenant = ''),
             sealed = (SELECT sealed FROM secrets WHERE tenant = '') WHERE tenant = 't2'",
            [],
        )
        .unwrap();
        assert!(s.open_value(Some("t2"), "api").is_err());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("secrets.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn bad_secrets_are_refused_with_what_to_do() {
        let (_dir, s) = store();
        let headers = |h: &[&str]| NewSecret {
            headers: h.iter().map(|h| h.to_string()).collect(),
            ..new("api", &["a.test"])
        };
        let cases: [(NewSecret, &[u8], &str); 16] = [
            (new("api", &[]), b"v", "no hosts"),
            (new("api", &["not a host"]), b"v", "not a host pattern"),
            (new("api", &["10.0.0.1"]), b"v", "not a host pattern"),
            (new("api key", &["a.test"]), b"v", "not a secret name"),
            (new("api", &["a.test"]), b"", "empty"),
            (new("api", &["a.test"]), &[b'x'; 1 << 20], "at most"),
            (new("api", &["a.test"]), b"line\n", "line break"),
            (
                NewSecret {
                    format: Some("Bearer".into()),
                    ..new("api", &["a.test"])
                },
                b"v",
                "{value}",
            ),
            // Headers servers echo back or route by never carry a value.
            (headers(&["Origin"]), b"v", "cannot carry a secret"),
            (headers(&["Referer"]), b"v", "cannot carry a secret"),
            (headers(&["host"]), b"v", "cannot carry a secret"),
            (
                headers(&["X-Forwarded-Host"]),
                b"v",
                "cannot carry a secret",
            ),
            (headers(&["Content-Type"]), b"v", "cannot carry a secret"),
            (
                headers(&["Authorization", "User-Agent"]),
                b"v",
                "cannot carry a secret",
            ),
            (headers(&["bad header"]), b"v", "not an HTTP header name"),
            (
                headers(&["a", "b", "c", "d", "e"]),
                b"v",
                "at most 4 headers",
            ),
        ];
        for (secret, value, says) in cases {
            let e = s.set(None, &secret, value).unwrap_err().to_string();
            assert!(e.contains(says), "{secret:?}: {e}");
        }
        assert!(s.list(None).unwrap().is_empty());
    }

    #[test]
    fn a_value_goes_in_authorization_unless_its_operator_names_its_headers() {
        let (dir, s) = store();
        let meta = s.set(None, &new("a", &["a.test"]), b"v").unwrap();
        assert_eq!(meta.headers, vec!["Authorization"]);
        assert!(meta.allows_header("authorization") && !meta.allows_header("x-api-key"));
        let meta = s
            .set(
                None,
                &NewSecret {
                    headers: vec!["X-Api-Key".into(), "Authorization".into()],
                    ..new("b", &["a.test"])
                },
                b"v",
            )
            .unwrap();
        assert!(meta.allows_header("x-api-key") && meta.allows_header("AUTHORIZATION"));
        // Rows of older engines: one header name, or none (any header then; Authorization now).
        let conn = Connection::open(dir.path().join("state.db")).unwrap();
        conn.execute("UPDATE secrets SET header = 'X-Key' WHERE name = 'a'", [])
            .unwrap();
        conn.execute("UPDATE secrets SET header = NULL WHERE name = 'b'", [])
            .unwrap();
        assert_eq!(s.meta(None, "a").unwrap().unwrap().headers, vec!["X-Key"]);
        assert_eq!(
            s.meta(None, "b").unwrap().unwrap().headers,
            vec!["Authorization"]
        );
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("secrets.key");
        std::fs::write(&key, [7u8; 32]).unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let e = SecretStore::open(&dir.path().join("state.db"), &key).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }
}
