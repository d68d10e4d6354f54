//! Writing a sandbox's changes into the workspace's folder: every removed path removed (deepest
//! first), then every added or modified one written (parents first), each file through a
//! temporary name renamed over the old one, so a reader of the folder sees either version. A
//! file keeps its owner; a new one takes its directory's. Every path is resolved beneath the
//! folder without following a symlink: a sandbox that replaced a directory with a link, or a
//! folder holding links of its own, cannot steer a write outside it.

use std::ffi::CString;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, Mode, fchmod, fstat};
use nix::unistd::{Gid, Uid, fchown};

use super::{Blob, carried, entries, open_beneath, open_root, raw_path, read};
use crate::diff::{Change, Kind};

/// Applies the changes in the upper `upper` to the folder `host`; returns how many paths it
/// wrote or removed.
pub fn apply(host: &Path, upper: &Path, id_base: Option<u32>) -> io::Result<u64> {
    let list = entries(host, upper, id_base)?;
    let root = open_root(host)?;
    let top = open_root(upper)?;
    let mut removals = Vec::new();
    let mut writes = Vec::new();
    for e in list.iter().filter(|e| carried(e) || e.kind == Kind::Dir) {
        let rel = raw_path(&e.path);
        if rel.is_empty() {
            continue;
        }
        let type_changed = e.what.contains(&"type");
        if e.change == Change::Removed || type_changed {
            removals.push(rel.clone());
        }
        if e.change != Change::Removed {
            writes.push(rel);
        }
    }
    let mut done = 0;
    // Deepest first: a directory's contents go before it.
    removals.sort_by(|a, b| b.cmp(a));
    for rel in &removals {
        remove(&root, rel)?;
        done += 1;
    }
    for rel in &writes {
        let blob = match read(&top, rel)? {
            Blob::None => continue,
            blob => blob,
        };
        write(&root, rel, &blob)?;
        done += 1;
    }
    Ok(done)
}

/// The parent directory of `rel` beneath `root`, and `rel`'s last name.
fn parent_of<'r>(root: &impl AsFd, rel: &'r [u8]) -> io::Result<(OwnedFd, &'r [u8])> {
    let (dir, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&b""[..], rel),
    };
    let fd = open_beneath(root, dir, OFlag::O_DIRECTORY | OFlag::O_RDONLY)?;
    Ok((fd, name))
}

fn cname(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a NUL in a name"))
}

fn remove(root: &impl AsFd, rel: &[u8]) -> io::Result<()> {
    let (dir, name) = parent_of(root, rel)?;
    let name = cname(name)?;
    let is_dir = nix::sys::stat::fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
    let flag = match is_dir {
        Ok(true) => nix::unistd::UnlinkatFlags::RemoveDir,
        Ok(false) => nix::unistd::UnlinkatFlags::NoRemoveDir,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match nix::unistd::unlinkat(&dir, name.as_c_str(), flag) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(nix::errno::Errno::ENOTEMPTY) => Err(io::Error::other(format!(
            "{} holds files the sandbox never saw (added to the folder since); nothing more was applied",
            String::from_utf8_lossy(rel)
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Owner to give a new entry of `dir`: the directory's own.
fn owner_of(fd: &impl AsFd) -> io::Result<(Uid, Gid)> {
    let st = fstat(fd)?;
    Ok((Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid)))
}

fn write(root: &impl AsFd, rel: &[u8], blob: &Blob) -> io::Result<()> {
    let (dir, name) = parent_of(root, rel)?;
    let name = cname(name)?;
    let existing =
        nix::sys::stat::fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
    let (uid, gid) = match &existing {
        Some(st) => (Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid)),
        None => owner_of(&dir)?,
    };
    match blob {
        Blob::Dir { mode } => {
            match existing {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                _ => {
                    nix::sys::stat::mkdirat(
                        &dir,
                        name.as_c_str(),
                        Mode::from_bits_truncate(0o700),
                    )?;
                    let _ = nix::unistd::fchownat(
                        &dir,
                        name.as_c_str(),
                        Some(uid),
                        Some(gid),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    );
                }
            }
            nix::sys::stat::fchmodat(
                &dir,
                name.as_c_str(),
                Mode::from_bits_truncate(*mode),
                FchmodatFlags::NoFollowSymlink,
            )
            .or_else(|e| {
                // Older kernels cannot fchmodat without following; a directory is no link.
                if e == nix::errno::Errno::EOPNOTSUPP {
                    nix::sys::stat::fchmodat(
                        &dir,
                        name.as_c_str(),
                        Mode::from_bits_truncate(*mode),
                        FchmodatFlags::FollowSymlink,
                    )
                } else {
                    Err(e)
                }
            })?;
        }
        Blob::File { data, mode } => {
            let tmp = temp_name();
            let fd = nix::fcntl::openat(
                &dir,
                tmp.as_c_str(),
                OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )?;
            let done = (|| -> io::Result<()> {
                let mut f = std::fs::File::from(fd);
                f.write_all(data)?;
                let _ = fchown(&f, Some(uid), Some(gid));
                fchmod(&f, Mode::from_bits_truncate(*mode & 0o7777))?;
                f.sync_all()
            })();
            finish(&dir, &tmp, &name, done)?;
        }
        Blob::Link(target) => {
            let tmp = temp_name();
            nix::unistd::symlinkat(cname(target)?.as_c_str(), &dir, tmp.as_c_str())?;
            let _ = nix::unistd::fchownat(
                &dir,
                tmp.as_c_str(),
                Some(uid),
                Some(gid),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            );
            finish(&dir, &tmp, &name, Ok(()))?;
        }
        Blob::None => {}
    }
    Ok(())
}

/// Renames the temporary `tmp` over `name`, or removes it if writing it failed.
fn finish(dir: &OwnedFd, tmp: &CString, name: &CString, done: io::Result<()>) -> io::Result<()> {
    let renamed = done.and_then(|()| {
        nix::fcntl::renameat(dir, tmp.as_c_str(), dir, name.as_c_str()).map_err(io::Error::from)
    });
    if renamed.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    renamed
}

fn temp_name() -> CString {
    let mut bytes = [0u8; 8];
    let _ = getrandom_fill(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    CString::new(format!(".sandbox-mcp-apply.{hex}")).unwrap_or_default()
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), ring::error::Unspecified> {
    use ring::rand::SecureRandom as _;
    ring::rand::SystemRandom::new().fill(buf)
}
