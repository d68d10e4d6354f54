//! The key every value is sealed under: 32 random bytes in their own file (`<data>/secrets.key`,
//! mode 0600, never in the database, never overwritten). A key file readable by others is
//! refused: whoever reads it and the database has every value.

use std::path::Path;

use ring::aead::{CHACHA20_POLY1305, LessSafeKey, UnboundKey};

use super::{KeyError, SecretError};

/// Reads the 32-byte key, or creates it (0600, never overwritten). A key readable by others is
/// refused: whoever reads it and the database has every value.
pub(crate) fn load_or_create_key(path: &Path) -> Result<LessSafeKey, SecretError> {
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
