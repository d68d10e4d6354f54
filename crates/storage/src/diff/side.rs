//! One side of a diff: its overlay mounts, each layer's root opened once (the engine's own
//! directories, so their paths are trusted as given), which mount a path belongs to (the last
//! whose target holds it), and the status of an entry with its owner as the sandbox sees it
//! (uppers hold host ids shifted by the side's base; lowers hold the sandbox's own).

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat};

use super::overlay::{Found, View};
use super::path::{components, join, within};
use super::{Kind, Side};

/// Ids a shifted sandbox can see; a host id outside its range shows as nobody.
const ID_COUNT: u32 = 65536;
const NOBODY: u32 = 65534;

/// One side's mounts with every layer root opened once.
pub(crate) struct Layers {
    pub(crate) mounts: Vec<Layered>,
    id_base: Option<u32>,
    /// Layers of each mount, from the upper down, stored with the sandbox's host ids.
    own: usize,
}

pub(crate) struct Layered {
    /// "/" or "/usr" …, normalized.
    pub(crate) target: Vec<u8>,
    /// Host paths of the layers, the upper first then the lowers: two sides share a lower
    /// directory when they name the same one.
    pub(crate) paths: Vec<PathBuf>,
    /// The same layers opened; None for one that does not exist (an upper nothing was written to).
    pub(crate) roots: Vec<Option<OwnedFd>>,
}

impl Layers {
    pub(crate) fn open(side: &Side) -> io::Result<Self> {
        let mut mounts = Vec::with_capacity(side.mounts.len());
        for mount in &side.mounts {
            // The engine's mistake, not the caller's: not InvalidInput.
            let target = components(&mount.target).map(|t| join(&t)).ok_or_else(|| {
                io::Error::other(format!(
                    "mount target {:?} is not an absolute path",
                    mount.target
                ))
            })?;
            let paths: Vec<PathBuf> = std::iter::once(&mount.upper)
                .chain(&mount.lowers)
                .cloned()
                .collect();
            let mut roots = Vec::with_capacity(paths.len());
            for path in &paths {
                // The engine's own directories: their paths are trusted as given.
                let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
                roots.push(
                    match openat(nix::fcntl::AT_FDCWD, path, flags, Mode::empty()) {
                        Ok(fd) => Some(fd),
                        Err(Errno::ENOENT) => None,
                        Err(e) => return Err(e.into()),
                    },
                );
            }
            mounts.push(Layered {
                target,
                paths,
                roots,
            });
        }
        Ok(Self {
            mounts,
            id_base: side.id_base,
            own: 1 + side.stacked,
        })
    }

    /// The mount `path` is taken from: the last one whose target holds it.
    pub(crate) fn responsible(&self, path: &[u8]) -> Option<usize> {
        (0..self.mounts.len())
            .rev()
            .find(|&i| within(path, &self.mounts[i].target))
    }

    /// The root of mount `j` as an entry of its parent directory.
    pub(crate) fn mount_root(&self, j: usize) -> io::Result<Option<Found>> {
        let mount = &self.mounts[j];
        let chain: Vec<usize> = (0..mount.roots.len())
            .filter(|&l| mount.roots[l].is_some())
            .collect();
        let Some(fd) = chain.first().and_then(|&l| mount.roots[l].as_ref()) else {
            return Ok(None);
        };
        let st = fstat(fd)?;
        Ok(Some(Found {
            st: Stat::new(&st, self, self.is_own(chain[0])),
            pos: None,
            child: Some(View { mount: j, chain }),
            mount_root: true,
        }))
    }

    /// Adds the name under `dir` that leads to each mount target below it (a mount point is
    /// there whatever the parent's layers say).
    pub(crate) fn mount_children(&self, dir: &[u8], names: &mut Vec<Vec<u8>>) {
        for mount in &self.mounts {
            let t = &mount.target;
            if t.as_slice() != dir && within(t, dir) {
                let rest = if dir == b"/" {
                    &t[1..]
                } else {
                    &t[dir.len() + 1..]
                };
                if let Some(first) = rest.split(|&c| c == b'/').next() {
                    names.push(first.to_vec());
                }
            }
        }
    }

    /// Whether layer `index` of a mount (0: the upper) holds host ids.
    pub(crate) fn is_own(&self, index: usize) -> bool {
        index < self.own
    }

    /// An upper's host id as the sandbox sees it.
    fn map_id(&self, id: u32) -> u32 {
        match self.id_base {
            Some(base) => id
                .checked_sub(base)
                .filter(|&n| n < ID_COUNT)
                .unwrap_or(NOBODY),
            None => id,
        }
    }
}

/// What is compared of a resolved entry, with the owner already as the sandbox sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) size: u64,
    pub(crate) mtime: (i64, i64),
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) rdev: u64,
}

impl Stat {
    /// Uppers hold host ids; lowers hold the sandbox's own.
    pub(crate) fn new(st: &FileStat, layers: &Layers, upper: bool) -> Self {
        let id = |id| if upper { layers.map_id(id) } else { id };
        Self {
            mode: st.st_mode,
            uid: id(st.st_uid),
            gid: id(st.st_gid),
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            dev: st.st_dev,
            ino: st.st_ino,
            rdev: st.st_rdev,
        }
    }

    pub(crate) fn format(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub(crate) fn is_device(&self) -> bool {
        matches!(self.format(), libc::S_IFCHR | libc::S_IFBLK)
    }

    pub(crate) fn kind(&self) -> Kind {
        match self.format() {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
