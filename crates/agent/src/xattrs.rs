//! File metadata as E2B keeps it: extended attributes in the `user.e2b.` namespace, set when a
//! file is written and read back with listings. Keys are lowercased; keys, values and their
//! number are bounded, so a listing never grows past what the engine accepts.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::spawn::error;
use sandbox_mcp_protocol::{AgentError, ErrorKind};

const PREFIX: &str = "user.e2b.";
/// Most attributes of one file, and longest key and value.
const MAX_KEYS: usize = 32;
const MAX_KEY: usize = 128;
const MAX_VALUE: usize = 4096;
/// Most bytes of a file's attribute names read.
const MAX_NAMES: usize = 64 * 1024;

/// Checks metadata asked for and gives it as it is kept (keys lowercased).
pub(crate) fn checked(
    metadata: BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, AgentError> {
    if metadata.len() > MAX_KEYS {
        return Err(error(
            ErrorKind::InvalidArgument,
            format!("a file takes at most {MAX_KEYS} metadata keys"),
        ));
    }
    metadata
        .into_iter()
        .map(|(k, v)| {
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if k.is_empty() || k.len() > MAX_KEY || !k.chars().all(token) {
                return Err(error(
                    ErrorKind::InvalidArgument,
                    format!(
                        "metadata key {:?} is invalid: 1 to {MAX_KEY} letters, digits or !#$%&'*+-.^_`|~",
                        k.chars().take(64).collect::<String>()
                    ),
                ));
            }
            if v.len() > MAX_VALUE || !v.chars().all(|c| (' '..='~').contains(&c)) {
                return Err(error(
                    ErrorKind::InvalidArgument,
                    format!("the value of metadata key {k} is invalid: at most {MAX_VALUE} printable ASCII characters"),
                ));
            }
            Ok((k.to_ascii_lowercase(), v))
        })
        .collect()
}

/// Sets `metadata` (checked) on an open file.
pub(crate) fn set(file: &std::fs::File, metadata: &[(String, String)]) -> std::io::Result<()> {
    for (k, v) in metadata {
        let name = CString::new(format!("{PREFIX}{k}"))?;
        // SAFETY: fsetxattr on a descriptor we own, a NUL-terminated name and a buffer of v.len().
        let ret = unsafe {
            libc::fsetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0,
            )
        };
        if ret < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The `user.e2b.*` attributes of `path` (not following a symlink), without the prefix; none
/// where the filesystem keeps none.
pub(crate) fn get(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return out;
    };
    let mut names = vec![0u8; MAX_NAMES];
    // SAFETY: llistxattr into a buffer of names.len() bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return out;
    }
    for raw in names[..n as usize].split(|b| *b == 0) {
        let Some(key) = std::str::from_utf8(raw)
            .ok()
            .and_then(|s| s.strip_prefix(PREFIX))
        else {
            continue;
        };
        if out.len() >= MAX_KEYS {
            break;
        }
        let Ok(name) = CString::new(raw) else {
            continue;
        };
        let mut value = vec![0u8; MAX_VALUE];
        // SAFETY: lgetxattr into a buffer of value.len() bytes.
        let len = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if len >= 0 {
            value.truncate(len as usize);
            out.insert(
                key.to_string(),
                String::from_utf8_lossy(&value).into_owned(),
            );
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_checked_lowercased_and_kept_on_the_file() {
        let m = BTreeMap::from([("Author".to_string(), "mish".to_string())]);
        assert_eq!(
            checked(m).unwrap(),
            [("author".to_string(), "mish".to_string())]
        );
        for (k, v) in [("bad key", "x"), ("", "x"), ("good", "bad\nvalue")] {
            let m = BTreeMap::from([(k.to_string(), v.to_string())]);
            assert_eq!(
                checked(m).unwrap_err().kind,
                ErrorKind::InvalidArgument,
                "{k:?}"
            );
        }
        // The bounds: 32 keys, 128-byte keys, 4 KiB values.
        let many: BTreeMap<String, String> = (0..=MAX_KEYS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(checked(many).unwrap_err().message.contains("at most 32"));
        for (k, v) in [
            ("k".repeat(MAX_KEY + 1), String::new()),
            ("k".into(), "v".repeat(MAX_VALUE + 1)),
        ] {
            let m = BTreeMap::from([(k, v)]);
            assert_eq!(checked(m).unwrap_err().kind, ErrorKind::InvalidArgument);
        }
        let at_bounds = BTreeMap::from([("k".repeat(MAX_KEY), "v".repeat(MAX_VALUE))]);
        assert!(checked(at_bounds).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        // Where the filesystem keeps no user attributes (tmpfs on old kernels), nothing to read.
        if set(&file, &[("author".into(), "mish".into())]).is_ok() {
            assert_eq!(
                get(&path),
                BTreeMap::from([("author".into(), "mish".into())])
            );
        }
    }
}
