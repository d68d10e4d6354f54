//! A sandbox's changes to a workspace: a host folder it mounts as an overlay's lower layer, its
//! own writes in the overlay's upper. Read from the host without entering the sandbox, the way
//! [`crate::diff`] compares two sandboxes: the list of changes is that diff's (upper against the
//! folder), every file opened beneath its root without following a symlink.
//!
//! [`changes`] renders them as a git patch (`patch`): text files as unified diffs, anything else
//! as git binary patches, with modes and symlinks, and full `index` lines so `git apply` checks
//! each file's preimage. [`apply`] writes the sandbox's version of every changed file into the
//! folder itself, resolving every path beneath it without following symlinks, so neither a
//! sandbox's names nor the folder's own links can lead a write outside it.

mod apply;
mod patch;

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

pub use apply::apply;
pub use patch::changes;

use crate::diff::{self, Change, Entry, Kind};

/// Most changes listed (and applied) at once.
pub const MAX_CHANGES: usize = 100_000;
/// Largest file carried in a patch or applied.
pub const MAX_FILE: u64 = 256 << 20;

/// One changed file (directories are not listed: git carries none).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileChange {
    /// Relative to the workspace, escaped as [`crate::diff`] escapes names.
    pub path: String,
    pub change: Change,
    pub binary: bool,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Changes {
    pub patch: String,
    pub files: Vec<FileChange>,
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
}

/// The workspace's changes as the diff lists them: the folder (`a`) against the sandbox's view
/// of it, the upper over the folder (`b`).
fn entries(host: &Path, upper: &Path, id_base: Option<u32>) -> io::Result<Vec<Entry>> {
    let side = |upper: &Path| diff::Side {
        mounts: vec![diff::Mount {
            target: "/".into(),
            upper: upper.to_path_buf(),
            lowers: vec![host.to_path_buf()],
        }],
        id_base,
        stacked: 0,
    };
    // The folder alone: an upper that does not exist (beside the real one, where the sandbox
    // writes nothing).
    let none = upper.with_extension("absent");
    let d = diff::diff(&side(&none), &side(upper), "/", MAX_CHANGES)?;
    let listed = d.added + d.removed + d.modified;
    if (d.entries.len() as u64) < listed {
        return Err(io::Error::other(format!(
            "the sandbox changed over {MAX_CHANGES} paths in the workspace; too many to carry"
        )));
    }
    // Git's own directories are not the work: git never carries them, and a sandbox's commits
    // stay in the sandbox (the folder's history is the user's).
    Ok(d.entries
        .into_iter()
        .filter(|e| {
            !raw_path(&e.path)
                .split(|&b| b == b'/')
                .any(|n| n == b".git")
        })
        .collect())
}

/// Undoes [`crate::diff`]'s escaping: `\\` and `\xNN` back to bytes; the leading `/` dropped.
pub(crate) fn raw_path(escaped: &str) -> Vec<u8> {
    let s = escaped.strip_prefix('/').unwrap_or(escaped).as_bytes();
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && s.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else if s[i] == b'\\'
            && s.get(i + 1) == Some(&b'x')
            && let Some(b) = s
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// Resolution that never leaves `root` and never follows a symlink (nor crosses a mount).
fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_XDEV
}

fn cpath(rel: &[u8]) -> io::Result<CString> {
    CString::new(if rel.is_empty() {
        b".".to_vec()
    } else {
        rel.to_vec()
    })
    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a path holds a NUL byte"))
}

/// Opens `rel` beneath the directory `root` with `flags`, following no symlink.
pub(crate) fn open_beneath(root: &impl AsFd, rel: &[u8], flags: OFlag) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(beneath());
    Ok(openat2(root.as_fd(), cpath(rel)?.as_c_str(), how)?)
}

pub(crate) fn open_root(dir: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))?;
    Ok(nix::fcntl::open(
        c.as_c_str(),
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?)
}

/// What one side holds at a path: a regular file's bytes and mode, a symlink's target, or
/// nothing (absent, or another kind).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Blob {
    File { data: Vec<u8>, mode: u32 },
    Link(Vec<u8>),
    Dir { mode: u32 },
    None,
}

/// Reads `rel` beneath `root`: a regular file (at most [`MAX_FILE`]), a symlink's target, or a
/// directory's mode. Never follows a symlink, never blocks on a FIFO.
pub(crate) fn read(root: &impl AsFd, rel: &[u8]) -> io::Result<Blob> {
    let fd = match open_beneath(root, rel, OFlag::O_PATH) {
        Ok(fd) => fd,
        // Absent, or below a symlink or a file: nothing is at this path on this side (a
        // sandbox that replaced the folder's link with a directory, say).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
            ) =>
        {
            return Ok(Blob::None);
        }
        Err(e) => return Err(e),
    };
    let st = nix::sys::stat::fstat(&fd)?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => {
            let target = nix::fcntl::readlinkat(&fd, c"")?;
            Ok(Blob::Link(target.as_bytes().to_vec()))
        }
        libc::S_IFDIR => Ok(Blob::Dir {
            mode: st.st_mode & 0o7777,
        }),
        libc::S_IFREG => {
            if st.st_size as u64 > MAX_FILE {
                return Err(io::Error::other(format!(
                    "{} is over {} MiB; too large to carry",
                    String::from_utf8_lossy(rel),
                    MAX_FILE >> 20
                )));
            }
            let file = open_beneath(root, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?;
            let mut data = Vec::with_capacity(st.st_size as usize);
            File::from(file).take(MAX_FILE + 1).read_to_end(&mut data)?;
            Ok(Blob::File {
                data,
                mode: st.st_mode & 0o7777,
            })
        }
        _ => Ok(Blob::None),
    }
}

/// Whether `entry` is a change git carries (files and symlinks; a directory only by what is in
/// it).
pub(crate) fn carried(entry: &Entry) -> bool {
    !(entry.kind == Kind::Dir && entry.change != Change::Modified)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn escaped_paths_come_back_as_bytes() {
        assert_eq!(raw_path("/a/b"), b"a/b");
        assert_eq!(raw_path("/a\\\\b"), b"a\\b");
        assert_eq!(raw_path("/\\xff\\x0a"), [0xff, 0x0a]);
        assert_eq!(raw_path("/\\xzz"), b"\\xzz");
    }
}
