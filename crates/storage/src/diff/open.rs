//! Every call the diff makes on a layer's files. Sandbox code wrote the uppers and may still be
//! writing them, so each is relative to a directory descriptor: directories are opened beneath
//! their layer's root without crossing a symlink, only regular files are ever opened (without
//! following, without blocking), and xattrs are read from descriptors.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fstat};
pub(crate) use sandbox_mcp_sys::fs_tree::open_dir_beneath as open_beneath;

/// Set to `y` on a directory that hides the same directory in the layers below (`userxattr`).
const OPAQUE: &CStr = c"user.overlay.opaque";
/// Carried by an empty regular file that stands for a whiteout.
pub(crate) const WHITEOUT: &CStr = c"user.overlay.whiteout";

/// Errors that mean a directory was replaced after its parent was read.
pub(crate) fn vanished(e: Errno) -> bool {
    matches!(e, Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP)
}

pub(crate) fn read_names(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut stream = Dir::openat(dir, c".", flags, Mode::empty())?;
    let mut names = Vec::new();
    for entry in stream.iter() {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Opens regular file `name` for reading; None if it is no longer one.
pub(crate) fn open_file(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<File>> {
    // Never follow, never block (a fifo swapped in), never become a terminal's controller.
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::ENODEV) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    Ok(Some(File::from(fd)))
}

/// The length of xattr `name` of `fd` read into `buf`, if it has one that fits.
pub(crate) fn xattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: a live descriptor, a NUL-terminated name and a buffer of the length given.
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    usize::try_from(n).ok()
}

pub(crate) fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 2];
    xattr(dir, OPAQUE, &mut buf).is_some_and(|n| buf[..n] == *b"y")
}

/// Reads until `buf` is full or the file ends.
pub(crate) fn fill(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(m) => n += m,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
