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

/// Makes `path` a file only its owner reads and writes, before a database opens it: created with
/// mode 0600 when missing, so that it is never open to others even for a moment (SQLite would
/// make it 0644 and leave a window before a chmod, in which another user could open it and keep
/// the descriptor), else set to 0600. So are SQLite's `-wal` and `-shm` beside it where they
/// exist: SQLite gives new ones the database's mode, and an older data dir may hold others.
pub fn private_file(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    open_lock_file(path)?;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        match fs::set_permissions(&name, fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            done => done?,
        }
    }
    Ok(())
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

    #[test]
    fn a_private_file_is_made_0600_and_so_are_its_databases_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Made anew: 0600 from the start, whatever the umask lets through.
        let new = dir.path().join("new.db");
        private_file(&new).unwrap();
        assert_eq!(mode(&new), 0o600);
        // An older one, and the files SQLite keeps beside it, open to all: closed.
        let old = dir.path().join("old.db");
        for p in ["old.db", "old.db-wal", "old.db-shm"] {
            let p = dir.path().join(p);
            fs::write(&p, b"x").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        }
        private_file(&old).unwrap();
        for p in ["old.db", "old.db-wal", "old.db-shm"] {
            assert_eq!(mode(&dir.path().join(p)), 0o600, "{p}");
        }
        assert_eq!(fs::read(&old).unwrap(), b"x", "its content kept");
    }
}
