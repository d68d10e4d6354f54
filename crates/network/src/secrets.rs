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
//!
//! This file is what a secret is and what is accepted as one; `store` keeps them sealed in the
//! database, `key` is the key file they are sealed under.

mod key;
mod store;

use crate::policy::Domain;
use sandbox_mcp_model::ids;

pub use store::SecretStore;

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

/// A new stand-in: what a sandbox sees in place of a secret.
pub fn standin() -> String {
    format!("{STANDIN_PREFIX}{}", ids::preview_token())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
