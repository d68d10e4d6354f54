//! envd access tokens: one per sandbox, an HMAC of its id under a secret the engine keeps in its
//! data dir (`e2b.secret`, 0600, made once). A token opens its own sandbox's envd and nothing
//! else; nothing is stored per sandbox, and tokens handed out survive a restart.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;

const SECRET_FILE: &str = "e2b.secret";

pub(crate) struct Tokens {
    key: hmac::Key,
}

impl Tokens {
    pub(crate) fn open(data_dir: &Path) -> io::Result<Self> {
        let path = data_dir.join(SECRET_FILE);
        let mut secret = [0u8; 32];
        match std::fs::File::open(&path) {
            Ok(mut f) => {
                f.read_exact(&mut secret).map_err(|e| {
                    io::Error::new(e.kind(), format!("{} is damaged: {e}", path.display()))
                })?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                getrandom::fill(&mut secret)
                    .map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
                let tmp = data_dir.join(format!("{SECRET_FILE}.tmp"));
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&secret)?;
                f.sync_all()?;
                std::fs::rename(&tmp, &path)?;
            }
            Err(e) => return Err(e),
        }
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
        })
    }

    /// Sandbox `id`'s envd token.
    pub(crate) fn of(&self, id: &str) -> String {
        self.sign("envd", id)
    }

    /// Sandbox `id`'s traffic token: what the SDKs send to its ports (the code interpreter's).
    pub(crate) fn traffic_of(&self, id: &str) -> String {
        self.sign("traffic", id)
    }

    fn sign(&self, purpose: &str, id: &str) -> String {
        B64.encode(hmac::sign(&self.key, format!("{purpose}:{id}").as_bytes()).as_ref())
    }

    /// Whether `token` is sandbox `id`'s envd token (in constant time).
    pub(crate) fn opens(&self, id: &str, token: &str) -> bool {
        self.verify("envd", id, token)
    }

    /// Whether `token` is sandbox `id`'s traffic token (in constant time).
    pub(crate) fn opens_traffic(&self, id: &str, token: &str) -> bool {
        self.verify("traffic", id, token)
    }

    /// The signature of a file URL of sandbox `id`, as the SDKs make it from the envd token:
    /// `v1_` and the unpadded base64 of SHA-256(`path:operation:user:token[:expiration]`).
    pub(crate) fn url_signature(
        &self,
        id: &str,
        path: &str,
        operation: &str,
        user: &str,
        expiration: Option<i64>,
    ) -> String {
        let mut raw = format!("{path}:{operation}:{user}:{}", self.of(id));
        if let Some(at) = expiration {
            raw.push_str(&format!(":{at}"));
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
        format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
        )
    }

    /// Whether `signature` signs that file URL for sandbox `id` (in constant time).
    pub(crate) fn signed(
        &self,
        id: &str,
        signature: &str,
        url: (&str, &str, &str, Option<i64>),
    ) -> bool {
        let (path, operation, user, expiration) = url;
        let want = self.url_signature(id, path, operation, user, expiration);
        // Every byte compared, whatever differs first (the length is no secret).
        want.len() == signature.len()
            && want
                .bytes()
                .zip(signature.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    fn verify(&self, purpose: &str, id: &str, token: &str) -> bool {
        match B64.decode(token) {
            Ok(tag) => hmac::verify(&self.key, format!("{purpose}:{id}").as_bytes(), &tag).is_ok(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_own_sandbox_only_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::open(dir.path()).unwrap();
        let a = tokens.of("sbx_a");
        assert!(tokens.opens("sbx_a", &a));
        assert!(!tokens.opens("sbx_b", &a));
        assert!(!tokens.opens("sbx_a", "not a token"));
        assert!(!tokens.opens("sbx_a", &a[1..]));
        // The traffic token is another: neither opens what the other does.
        let t = tokens.traffic_of("sbx_a");
        assert!(tokens.opens_traffic("sbx_a", &t) && !tokens.opens("sbx_a", &t));
        assert!(!tokens.opens_traffic("sbx_a", &a) && !tokens.opens_traffic("sbx_b", &t));
        let again = Tokens::open(dir.path()).unwrap();
        assert_eq!(again.of("sbx_a"), a);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(SECRET_FILE))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // A file URL's signature: the SDKs' recipe, bound to the sandbox, path, operation, user
        // and expiry.
        let sig = tokens.url_signature("sbx_a", "f.txt", "read", "user", Some(9));
        let digest = ring::digest::digest(
            &ring::digest::SHA256,
            format!("f.txt:read:user:{a}:9").as_bytes(),
        );
        assert_eq!(
            sig,
            format!(
                "v1_{}",
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
            )
        );
        assert!(tokens.signed("sbx_a", &sig, ("f.txt", "read", "user", Some(9))));
        for other in [
            ("sbx_b", ("f.txt", "read", "user", Some(9))),
            ("sbx_a", ("g.txt", "read", "user", Some(9))),
            ("sbx_a", ("f.txt", "write", "user", Some(9))),
            ("sbx_a", ("f.txt", "read", "root", Some(9))),
            ("sbx_a", ("f.txt", "read", "user", Some(10))),
            ("sbx_a", ("f.txt", "read", "user", None)),
        ] {
            assert!(!tokens.signed(other.0, &sig, other.1), "{other:?}");
        }
        // Another engine's data dir, another secret.
        let other = tempfile::tempdir().unwrap();
        assert!(!Tokens::open(other.path()).unwrap().opens("sbx_a", &a));
    }
}
