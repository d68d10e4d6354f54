//! Resolving names through one side's layers as overlayfs does: the first layer that has a name
//! wins, unless what it has is a whiteout (a 0:0 character device, or an empty file marked as
//! one); an opaque directory stops the layers below it; a later mount owns everything under its
//! target. A directory's layers are opened only as a lookup needs them, and one that vanished
//! since its parent was read (the sandbox is running) counts as absent.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, fstatat};

use super::open::{WHITEOUT, is_opaque, open_beneath, open_file, read_names, vanished, xattr};
use super::path::join;
use super::side::{Layered, Layers, Stat};

/// A directory of one side: the mount it is taken from and the layers (indices into the
/// mount's) where it is a directory that counts, top first.
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub(crate) mount: usize,
    pub(crate) chain: Vec<usize>,
}

/// A name resolved on one side.
pub(crate) struct Found {
    pub(crate) st: Stat,
    /// Position in the parent's chain of the layer it was found in (None: a mount's root).
    pub(crate) pos: Option<usize>,
    /// For a directory: where its own entries come from.
    pub(crate) child: Option<View>,
    pub(crate) mount_root: bool,
}

/// A directory of one side being listed: its layers' directories, opened on demand in order.
pub(crate) struct OpenDir<'l> {
    pub(crate) layers: &'l Layers,
    mount: usize,
    /// The path inside the mount's layers ("." for the mount's root).
    rel: CString,
    pub(crate) chain: Vec<usize>,
    slots: Vec<Slot>,
}

enum Slot {
    Closed,
    /// Vanished since its parent was read (the sandbox is running), or a missing layer.
    Gone,
    Open {
        fd: OwnedFd,
        /// Sorted, once read: a name absent here needs no lookup.
        names: Option<Vec<Vec<u8>>>,
    },
}

impl<'l> OpenDir<'l> {
    pub(crate) fn new(layers: &'l Layers, view: View, path: &[u8]) -> io::Result<Self> {
        let target = &layers.mounts[view.mount].target;
        let rel = if target == b"/" {
            &path[1..]
        } else {
            path[target.len()..].strip_prefix(b"/").unwrap_or_default()
        };
        let rel = CString::new(if rel.is_empty() { b"." } else { rel })
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let slots = view.chain.iter().map(|_| Slot::Closed).collect();
        Ok(Self {
            layers,
            mount: view.mount,
            rel,
            chain: view.chain,
            slots,
        })
    }

    pub(crate) fn has_upper(&self) -> bool {
        self.chain.first() == Some(&0)
    }

    /// Whether `other` takes this directory's lower part from the very same directories, so
    /// that a name neither upper holds resolves the same on both.
    pub(crate) fn same_lowers(&self, other: &OpenDir<'_>) -> bool {
        let (m, n) = (
            &self.layers.mounts[self.mount],
            &other.layers.mounts[other.mount],
        );
        let lowers = |o: &OpenDir<'_>, m: &Layered| -> Vec<PathBuf> {
            o.chain
                .iter()
                .filter(|&&l| l != 0)
                .map(|&l| m.paths[l].clone())
                .collect()
        };
        m.target == n.target && lowers(self, m) == lowers(other, n)
    }

    /// The directory at chain position `k`, opening those above it first: an opaque one cuts
    /// the chain below it. None: gone, or cut.
    pub(crate) fn fd(&mut self, k: usize) -> io::Result<Option<BorrowedFd<'_>>> {
        let mut i = 0;
        while i <= k && i < self.chain.len() {
            if matches!(self.slots[i], Slot::Closed) {
                self.open(i)?;
            }
            i += 1;
        }
        Ok(self.opened(k))
    }

    pub(crate) fn opened(&self, k: usize) -> Option<BorrowedFd<'_>> {
        match self.slots.get(k) {
            Some(Slot::Open { fd, .. }) => Some(fd.as_fd()),
            _ => None,
        }
    }

    fn open(&mut self, i: usize) -> io::Result<()> {
        let root = self.layers.mounts[self.mount].roots[self.chain[i]].as_ref();
        let fd = match root.map(|root| open_beneath(root.as_fd(), &self.rel)) {
            None => None,
            Some(Ok(fd)) => Some(fd),
            Some(Err(e)) if vanished(e) => None,
            Some(Err(e)) => return Err(e.into()),
        };
        self.slots[i] = match fd {
            None => Slot::Gone,
            Some(fd) => {
                if i + 1 < self.chain.len() && is_opaque(fd.as_fd()) {
                    self.chain.truncate(i + 1);
                    self.slots.truncate(i + 1);
                }
                Slot::Open { fd, names: None }
            }
        };
        Ok(())
    }

    /// The names in the directory at chain position `k`, whiteouts included.
    pub(crate) fn names(&mut self, k: usize) -> io::Result<&[Vec<u8>]> {
        if self.fd(k)?.is_none() {
            return Ok(&[]);
        }
        let Some(Slot::Open { fd, names }) = self.slots.get_mut(k) else {
            return Ok(&[]);
        };
        if names.is_none() {
            *names = Some(read_names(fd.as_fd())?);
        }
        Ok(names.as_deref().unwrap_or_default())
    }

    /// `name`'s own status at chain position `k`, if it is there.
    fn stat(&mut self, k: usize, name: &[u8]) -> io::Result<Option<FileStat>> {
        if self.fd(k)?.is_none() {
            return Ok(None);
        }
        let Some(Slot::Open { fd, names }) = self.slots.get(k) else {
            return Ok(None);
        };
        if let Some(names) = names
            && names.binary_search_by(|n| n.as_slice().cmp(name)).is_err()
        {
            return Ok(None);
        }
        match fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Resolves `name` (whose sandbox path is `path`) as overlayfs would: the first layer that
    /// has it wins, unless what it has is a whiteout.
    pub(crate) fn lookup(&mut self, name: &[u8], path: &[u8]) -> io::Result<Option<Found>> {
        let layers = self.layers;
        match layers.responsible(path) {
            Some(j) if j != self.mount => return layers.mount_root(j),
            _ => {}
        }
        let mut k = 0;
        // The chain can shrink as its directories are opened (an opaque one cuts it).
        while k < self.chain.len() {
            let Some(st) = self.stat(k, name)? else {
                k += 1;
                continue;
            };
            if self.is_whiteout(k, name, &st) {
                return Ok(None);
            }
            let st = Stat::new(&st, layers, layers.is_own(self.chain[k]));
            let child = match st.format() {
                libc::S_IFDIR => Some(self.child_chain(k, name)?),
                _ => None,
            };
            return Ok(Some(Found {
                st,
                pos: Some(k),
                child,
                mount_root: false,
            }));
        }
        Ok(None)
    }

    fn is_whiteout(&self, k: usize, name: &[u8], st: &FileStat) -> bool {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFCHR => st.st_rdev == 0,
            // The other form: an empty file marked as one (only these need opening).
            libc::S_IFREG if st.st_size == 0 => self
                .opened(k)
                .and_then(|dir| open_file(dir, name).ok().flatten())
                .is_some_and(|f| xattr(f.as_fd(), WHITEOUT, &mut []).is_some()),
            _ => false,
        }
    }

    /// The layers of directory `name`, found at chain position `k`: it and every directory of
    /// that name below it, down to a layer where the name is something else.
    fn child_chain(&mut self, k: usize, name: &[u8]) -> io::Result<View> {
        let mut chain = vec![self.chain[k]];
        let mut i = k + 1;
        while i < self.chain.len() {
            match self.stat(i, name)? {
                None => {}
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    if let Some(&l) = self.chain.get(i) {
                        chain.push(l);
                    }
                }
                // A file or a whiteout hides the rest.
                Some(_) => break,
            }
            i += 1;
        }
        Ok(View {
            mount: self.mount,
            chain,
        })
    }
}

/// The entry at `names` (an absolute path's) on one side, with the directory it was found in
/// (None for a mount's root, which has none of its own).
pub(crate) fn entry_at<'l>(
    layers: &'l Layers,
    names: &[Vec<u8>],
) -> io::Result<(Option<Found>, Option<OpenDir<'l>>)> {
    let path = join(names);
    let Some(j) = layers.responsible(&path) else {
        return Ok((None, None));
    };
    let (Some((name, parent)), false) = (names.split_last(), layers.mounts[j].target == path)
    else {
        return Ok((layers.mount_root(j)?, None));
    };
    let Some(view) = locate(layers, parent)? else {
        return Ok((None, None));
    };
    let mut dir = OpenDir::new(layers, view, &join(parent))?;
    let found = dir.lookup(name, &path)?;
    Ok((found, Some(dir)))
}

/// Where directory `names` (an absolute path's) is taken from on one side, if it is one there.
fn locate(layers: &Layers, names: &[Vec<u8>]) -> io::Result<Option<View>> {
    let path = join(names);
    let Some(j) = layers.responsible(&path) else {
        return Ok(None);
    };
    let Some(mut view) = layers.mount_root(j)?.and_then(|f| f.child) else {
        return Ok(None);
    };
    let depth = components_of(&layers.mounts[j].target);
    for i in depth..names.len() {
        let mut dir = OpenDir::new(layers, view, &join(&names[..i]))?;
        match dir.lookup(&names[i], &join(&names[..=i]))? {
            Some(Found { child: Some(v), .. }) => view = v,
            _ => return Ok(None),
        }
    }
    Ok(Some(view))
}

fn components_of(target: &[u8]) -> usize {
    target
        .split(|&c| c == b'/')
        .filter(|n| !n.is_empty())
        .count()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
