//! Opening files inside the sandbox without ever blocking or being redirected.
//!
//! Sandbox code can put a FIFO, a device or a symlink wherever the agent is about to open a file
//! (its spill files, job logs, or a path the model named). Opening a FIFO blocks until someone
//! opens the other end; a symlink to `/proc/1/…` would point the agent at itself. So every open
//! here is non-blocking, the result must be a regular file (checked on the open descriptor, so a
//! swap after the check cannot matter), and files the agent creates for itself are created
//! exclusively, never through a symlink.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

fn not_regular(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is not a regular file (a device, FIFO or socket)",
            path.display()
        ),
    )
}

/// The descriptor must be a regular file; then it is made blocking again (regular files never
/// block on O_NONBLOCK anyway, but the flag must not leak into whatever uses the file next).
fn regular(file: File, path: &Path) -> io::Result<File> {
    if !file.metadata()?.is_file() {
        return Err(not_regular(path));
    }
    let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?;
    let mut flags = nix::fcntl::OFlag::from_bits_truncate(flags);
    flags.remove(nix::fcntl::OFlag::O_NONBLOCK);
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(file)
}

/// Opens an existing regular file for reading (symlinks followed: the path is the caller's).
pub(crate) fn read(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    regular(file, path)
}

/// Opens an existing regular file of the agent's own for reading, never through a symlink.
pub(crate) fn read_own(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(path)?;
    regular(file, path)
}

/// Opens an existing regular file of the agent's own for appending, never through a symlink.
pub(crate) fn append_own(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(path)?;
    regular(file, path)
}

/// Creates a new file (never opening one that exists, whatever it is) with `mode`.
pub(crate) fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(path)
        .and_then(|f| regular(f, path))
}

/// Replaces whatever is at `path` with a new empty file of the agent's own.
pub(crate) fn recreate_own(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    create_new(path, 0o644)
}

/// Opens a directory to sync it, without blocking whatever is really there.
pub(crate) fn dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn fifos_and_symlinks_never_block_or_redirect() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        // Each of these would block forever on a plain open.
        assert!(read(&fifo).is_err());
        assert!(read_own(&fifo).is_err());
        assert!(append_own(&fifo).is_err());
        assert!(create_new(&fifo, 0o644).is_err());
        assert!(dir(&fifo).is_err());
        let target = tmp.path().join("target");
        std::fs::write(&target, "x").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read_own(&link).is_err() && append_own(&link).is_err());
        assert!(create_new(&link, 0o644).is_err());
        assert!(read(&link).is_ok(), "a path the caller names may be a link");
        // Recreating replaces the FIFO with a regular file.
        recreate_own(&fifo).unwrap();
        assert!(std::fs::metadata(&fifo).unwrap().is_file());
        assert!(read(Path::new("/dev/null")).is_err(), "devices are refused");
    }
}
