//! Bearer keys, one implementation for both layers that check them: the engine's API keys and the
//! MCP access keys of the HTTP transport. Security-critical; keep it small.
//!
//! A key is kept only as its SHA-256 digest. A token is compared against *every* accepted digest
//! in constant time ([`subtle`]), so timing tells neither how much of a key matched nor which key
//! did. Keys kept in a file are re-read when the file changes (its mtime, inode or length), so
//! keys are added and revoked without a restart; a file that no longer parses keeps the last
//! good keys, with a warning.

use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// The SHA-256 digest of a token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Digest([u8; 32]);

impl Digest {
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Lowercase hex, as key files store it.
    pub fn to_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest(<redacted>)")
    }
}

/// What the first key matching `token` stands for. Every candidate is compared, in constant time.
pub fn find<'a, T>(
    candidates: impl IntoIterator<Item = (&'a Digest, &'a T)>,
    token: &str,
) -> Option<&'a T> {
    let wanted = Digest::of(token);
    let mut found = None;
    for (digest, value) in candidates {
        let matches: bool = digest.0.ct_eq(&wanted.0).into();
        if matches && found.is_none() {
            found = Some(value);
        }
    }
    found
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `name` can be a tenant: 1-63 characters from a-z, 0-9, `-` and `_`, starting with a
/// letter or digit (it appears in headers, logs and key files).
pub fn valid_tenant(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A file's identity as far as change detection goes: a writer that replaces it makes a new
/// inode, so a change shows even within one mtime tick.
type Version = (SystemTime, u64, u64);

fn version(path: &Path) -> Option<Version> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.ino(), m.len()))
}

/// Keys, each with what it stands for.
pub type Keys<T> = Vec<(Digest, T)>;

/// Turns a key file's text into keys, or says why it cannot.
pub type ParseKeys<T> = fn(&str) -> Result<Keys<T>, String>;

/// Keys read from a file, and read again whenever the file changes.
pub struct KeyFile<T> {
    path: PathBuf,
    parse: ParseKeys<T>,
    /// The keys, and the version of the file they were read from.
    cache: RwLock<(Option<Version>, Keys<T>)>,
}

impl<T: Clone> KeyFile<T> {
    /// `parse` turns the file's text into keys; a missing file has none.
    pub fn new(path: PathBuf, parse: ParseKeys<T>) -> Self {
        Self {
            path,
            parse,
            cache: RwLock::new((None, Vec::new())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What `token` stands for, after re-reading the file if it changed.
    pub fn find(&self, token: &str) -> Option<T> {
        self.refresh();
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        find(cache.1.iter().map(|(d, v)| (d, v)), token).cloned()
    }

    /// Whether any accepted key's value satisfies `f` (after re-reading the file if it changed).
    pub fn any(&self, f: impl Fn(&T) -> bool) -> bool {
        self.refresh();
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        cache.1.iter().any(|(_, v)| f(v))
    }

    fn refresh(&self) {
        let now = version(&self.path);
        {
            let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
            if cache.0 == now && now.is_some() {
                return;
            }
        }
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                tracing::warn!(
                    "keeping the previous keys: cannot read {}: {e}",
                    self.path.display()
                );
                return;
            }
        };
        match (self.parse)(&text) {
            Ok(keys) => *cache = (now, keys),
            Err(e) => {
                tracing::warn!(
                    "keeping the previous keys: {} is malformed: {e}",
                    self.path.display()
                );
                cache.0 = now;
            }
        }
    }
}

/// Keys given at start, plus, optionally, those of a key file.
pub struct KeyRing<T> {
    fixed: Keys<T>,
    file: Option<KeyFile<T>>,
}

impl<T: Clone> KeyRing<T> {
    pub fn new(file: Option<KeyFile<T>>) -> Self {
        Self {
            fixed: Vec::new(),
            file,
        }
    }

    /// Accepts `token`, standing for `value`.
    pub fn with(mut self, token: &str, value: T) -> Self {
        self.fixed.push((Digest::of(token), value));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.fixed.is_empty() && self.file.is_none()
    }

    /// What `token` stands for, if it is an accepted key.
    pub fn find(&self, token: &str) -> Option<T> {
        // The fixed keys and the file's are both looked at whatever matches, so the time taken
        // does not tell which kind of key a token is.
        let fixed = find(self.fixed.iter().map(|(d, v)| (d, v)), token).cloned();
        let from_file = self.file.as_ref().and_then(|f| f.find(token));
        fixed.or(from_file)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_is_compared_and_the_first_match_wins() {
        let keys = [
            (Digest::of("a"), 1),
            (Digest::of("b"), 2),
            (Digest::of("b"), 3),
        ];
        assert_eq!(find(keys.iter().map(|(d, v)| (d, v)), "b"), Some(&2));
        assert_eq!(find(keys.iter().map(|(d, v)| (d, v)), "c"), None);
        let hex = Digest::of("a").to_hex();
        assert_eq!(Digest::from_hex(&hex), Some(Digest::of("a")));
        assert_eq!(Digest::from_hex("zz"), None);
    }

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        let mut h = http::HeaderMap::new();
        assert_eq!(bearer(&h), None);
        for (value, token) in [
            ("Bearer abc", Some("abc")),
            ("bearer  abc ", Some("abc")),
            ("BEARER abc", Some("abc")),
            ("Basic abc", None),
            ("Bearer ", None),
        ] {
            h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
            assert_eq!(bearer(&h), token, "{value}");
        }
    }

    #[test]
    fn a_key_file_is_reread_when_it_changes_and_kept_when_it_breaks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let parse = |text: &str| -> Result<Keys<()>, String> {
            text.lines()
                .map(|l| match l.trim() {
                    "broken" => Err("broken line".to_string()),
                    key => Ok((Digest::of(key), ())),
                })
                .collect()
        };
        let file = KeyFile::new(path.clone(), parse);
        assert_eq!(file.find("one"), None);
        std::fs::write(&path, "one\n").unwrap();
        assert_eq!(file.find("one"), Some(()));
        std::fs::write(&path, "two\n").unwrap();
        assert_eq!(file.find("one"), None);
        assert_eq!(file.find("two"), Some(()));
        std::fs::write(&path, "broken\n").unwrap();
        assert_eq!(file.find("two"), Some(()), "the last good keys stay");
        let ring = KeyRing::new(Some(file)).with("fixed", ());
        assert_eq!(ring.find("fixed"), Some(()));
        assert_eq!(ring.find("two"), Some(()));
        assert_eq!(ring.find("nope"), None);
    }

    #[test]
    fn tenant_names() {
        for ok in ["a", "team-a", "t_1", "0x"] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", "A", "-a", "a b", &"x".repeat(64)] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }
}
