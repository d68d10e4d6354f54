//! Identifiers, keys and timestamps.

/// Crockford-style base32 alphabet (lowercase, no i/l/o/u).
const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // getrandom only fails when the OS has no entropy source at all; there is no safe fallback,
    // and a predictable id or key would be worse than an outage.
    if let Err(e) = getrandom::fill(&mut buf) {
        tracing::error!("the OS random number generator failed: {e}");
        std::process::abort();
    }
    buf
}

fn base32(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 8 / 5 + 1);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// 128 random bits as 26 base32 characters: names that must not collide (scratch directories,
/// layers of one import or capture).
pub fn nonce() -> String {
    base32(&random_bytes::<16>())
}

/// A new sandbox id: `sbx_` and 128 random bits as 26 base32 characters.
pub fn sandbox_id() -> String {
    format!("sbx_{}", base32(&random_bytes::<16>()))
}

/// Whether `s` has the shape of a sandbox id (it may still not exist).
pub fn is_sandbox_id(s: &str) -> bool {
    s.len() == 30 && s.starts_with("sbx_") && s.as_bytes()[4..].iter().all(|b| ALPHABET.contains(b))
}

/// A new snapshot id: `snap_` and 128 random bits as 26 base32 characters.
pub fn snapshot_id() -> String {
    format!("snap_{}", base32(&random_bytes::<16>()))
}

/// Whether `s` has the shape of a snapshot id (it may still not exist).
pub fn is_snapshot_id(s: &str) -> bool {
    s.len() == 31
        && s.starts_with("snap_")
        && s.as_bytes()[5..].iter().all(|b| ALPHABET.contains(b))
}

/// A new API key: 256 random bits.
pub fn api_key() -> String {
    format!("smk_{}", base32(&random_bytes::<32>()))
}

/// A preview's token: 160 random bits, safe in a URL's query.
pub fn preview_token() -> String {
    base32(&random_bytes::<20>())
}

/// A short request id for logs and error bodies.
pub fn request_id() -> String {
    base32(&random_bytes::<8>())
}

tokio::task_local! {
    /// The id of the API request being handled, for everything that reports on it.
    pub static REQUEST_ID: String;
}

/// The id of the API request being handled (empty outside one).
pub fn current_request_id() -> String {
    REQUEST_ID.try_with(Clone::clone).unwrap_or_default()
}

pub use sandbox_mcp_sys::now_ms;

/// A time from milliseconds since the Unix epoch, in whole seconds (as the API reports times).
pub fn time(unix_ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(unix_ms.div_euclid(1000), 0).unwrap_or_default()
}

/// [`time`] as RFC 3339 text (`2026-11-22T17:33:52Z`), for files that keep times as strings.
pub fn rfc3339(unix_ms: i64) -> String {
    time(unix_ms).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_well_formed_and_distinct() {
        let a = sandbox_id();
        let b = sandbox_id();
        assert!(is_sandbox_id(&a), "{a}");
        assert_ne!(a, b);
        assert!(!is_sandbox_id("sbx_short"));
        assert!(!is_sandbox_id("sbx_ABCDEFGHJKMNPQRSTVWXYZ0123"));
        assert_eq!(api_key().len(), 4 + 52);
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_329_000_000), "2026-11-22T06:30:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        // The API's JSON carries the same text: whole seconds, `Z`.
        assert_eq!(
            serde_json::to_value(time(1_795_329_000_999)).unwrap(),
            "2026-11-22T06:30:00Z"
        );
    }
}
