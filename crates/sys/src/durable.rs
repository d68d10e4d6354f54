//! Small state files changed safely: under an exclusive lock, written beside the target and
//! renamed over it, with the data and the rename made durable. A crash leaves the old version or
//! the new one, never a mix, and two processes never lose each other's change.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

/// Writes `data` to `path` (mode `mode`) so that a crash leaves the old or the new content.
pub fn write_atomically(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    replace_with(path, mode, |f, _| f.write_all(data))
}

/// Makes `path` anew so that a crash leaves the old file or the new one: `fill` writes the new
/// content into a file beside it (created empty with mode `mode`; given open and by its path,
/// for content another process writes), which is then synced and renamed over `path`.
pub fn replace_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut fs::File, &Path) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let written = (|| {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(mode)
            .open(&tmp)?;
        fill(&mut f, &tmp)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => fs::File::open(parent)?.sync_all(),
            _ => Ok(()),
        }
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// An exclusive lock on `path` (created, mode 0600), held until dropped. Blocks while another
/// process holds it.
pub fn lock(path: &Path) -> io::Result<Flock<fs::File>> {
    let file = open_lock_file(path)?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e.into())
}

/// Like [`lock`], without waiting: `None` when another process holds it.
pub fn try_lock(path: &Path) -> io::Result<Option<Flock<fs::File>>> {
    let file = open_lock_file(path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

fn open_lock_file(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_whole_files_and_locks_exclude() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        write_atomically(&path, b"one", 0o600).unwrap();
        write_atomically(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
        let lock_path = dir.path().join("lock");
        let held = lock(&lock_path).unwrap();
        assert!(try_lock(&lock_path).unwrap().is_none());
        drop(held);
        assert!(try_lock(&lock_path).unwrap().is_some());
    }
}
