// Used by the snapshot and fork operations (being added).
#![allow(dead_code)]

//! What changed between two sandboxes' filesystems (or a sandbox and a snapshot), read from the
//! host without entering either. Each side is a set of overlay mounts; this module resolves them
//! the way overlayfs does (the upper first, whiteouts hide a name, an opaque directory stops the
//! layers below it, a later mount owns everything under its target) and compares the two merged
//! trees path by path.
//!
//! Sandbox code wrote the uppers and may still be writing them. So every lookup is relative to
//! a directory descriptor, every directory is opened beneath its layer's root without crossing a
//! symlink, only regular files are ever opened (without following, without blocking), and the
//! walk is iterative with bounded paths: a sandbox can nest directories 100 000 deep.
//!
//! Speed comes from what the two sides share. Where both resolve a directory through the very
//! same lower directories (two forks of one parent, two sandboxes of one template), a name that
//! neither upper holds resolves identically on both sides, so only the uppers' names are looked
//! at; elsewhere both merged directories are listed in full. Regular files of one size and one
//! mtime are taken as equal without reading them (the copies a fork or a snapshot makes keep
//! mtimes), as are two names of one host inode.

use std::ffi::{CStr, CString};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::rc::Rc;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

/// Longest path (as the sandbox sees it, in bytes) compared; a deeper one fails the diff.
const MAX_PATH: usize = 4096;
/// How much of each file is read at a time when contents must be compared.
const CHUNK: usize = 64 * 1024;
/// Set to `y` on a directory that hides the same directory in the layers below (`userxattr`).
const OPAQUE: &CStr = c"user.overlay.opaque";
/// Carried by an empty regular file that stands for a whiteout.
const WHITEOUT: &CStr = c"user.overlay.whiteout";
/// Ids a shifted sandbox can see; a host id outside its range shows as nobody.
const ID_COUNT: u32 = 65536;
const NOBODY: u32 = 65534;

/// One overlay mount as found on the host.
#[derive(Debug, Clone)]
pub struct Mount {
    /// Mount target inside the sandbox: "/" or "/usr" …
    pub target: String,
    /// The upper directory (may not exist: nothing written yet).
    pub upper: PathBuf,
    /// Lower directories, top first.
    pub lowers: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Side {
    pub mounts: Vec<Mount>,
    /// Host id base of the uppers' owners (see above); None: ids as they are.
    pub id_base: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Added,
    Removed,
    Modified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    /// Absolute path as the sandbox sees it. Bytes that are not UTF-8 and control characters are
    /// written as `\xNN` escapes, and a backslash as `\\`, so every name is printable and two
    /// different names never look the same.
    pub path: String,
    pub change: Change,
    /// Type on the `b` side for added/modified, on the `a` side for removed.
    pub kind: Kind,
    /// Size in bytes on the side given by `kind` (0 for directories).
    pub size: u64,
    /// For modified entries: what differs, a subset of "type", "content", "mode", "owner",
    /// "target" (a symlink's). Empty otherwise.
    pub what: Vec<&'static str>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Diff {
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
    /// Every change, sorted by path (the caller caps what it shows).
    pub entries: Vec<Entry>,
}

/// A diff refused because a sandbox nests files past what a path can name. The message is for
/// the caller: it names the place as the sandbox sees it, never as a host path.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path} is nested too deep to compare (paths over {MAX_PATH} bytes); delete or move that tree in the sandbox first"
)]
pub struct TooDeep {
    path: String,
}

/// A directory or file of a sandbox that could not be read, named as the sandbox sees it.
#[derive(Debug, thiserror::Error)]
#[error("cannot compare {path}: {source}")]
pub struct Unreadable {
    path: String,
    #[source]
    source: io::Error,
}

/// What changed from `a` to `b` under `under` (an absolute path inside the sandbox; "/" for all).
/// Fails with ErrorKind::InvalidInput for an `under` that is not absolute or contains `..`.
pub fn diff(a: &Side, b: &Side, under: &str, max_entries: usize) -> io::Result<Diff> {
    let under = components(under).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{under:?} is not an absolute path without `..`"),
        )
    })?;
    let (a, b) = (Layers::open(a)?, Layers::open(b)?);
    let mut walk = Walk {
        a: &a,
        b: &b,
        max: max_entries,
        diff: Diff::default(),
        stack: Vec::new(),
        buf_a: vec![0; CHUNK],
        buf_b: vec![0; CHUNK],
    };
    let esc = escape_path(&under);
    walk.start(&under).map_err(|e| located(&esc, e))?;
    walk.run()?;
    Ok(walk.diff)
}

/// The names of an absolute path (`.` and empty names dropped); None if it is relative, holds a
/// NUL byte or a `..`.
fn components(path: &str) -> Option<Vec<Vec<u8>>> {
    if !path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut out = Vec::new();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => return None,
            _ => out.push(name.as_bytes().to_vec()),
        }
    }
    Some(out)
}

fn join(names: &[Vec<u8>]) -> Vec<u8> {
    let mut path = Vec::new();
    for name in names {
        path.push(b'/');
        path.extend_from_slice(name);
    }
    if path.is_empty() {
        path.push(b'/');
    }
    path
}

fn child(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(parent.len() + 1 + name.len());
    if parent != b"/" {
        path.extend_from_slice(parent);
    }
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

/// Whether `path` is `dir` or below it.
fn within(path: &[u8], dir: &[u8]) -> bool {
    dir == b"/" || path == dir || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

/// Appends `name` printably and unambiguously: a backslash doubled, control characters and
/// bytes that are not UTF-8 as `\xNN`.
fn escape(out: &mut String, name: &[u8]) {
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if c.is_control() {
                for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                    let _ = write!(out, "\\x{byte:02x}");
                }
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
}

fn escape_child(parent: &str, name: &[u8]) -> String {
    let mut esc = String::with_capacity(name.len());
    escape(&mut esc, name);
    join_escaped(parent, &esc)
}

/// The escaped path of escaped name `name` in directory `parent` (escaped).
fn join_escaped(parent: &str, name: &str) -> String {
    let mut out = String::with_capacity(parent.len() + 1 + name.len());
    if parent != "/" {
        out.push_str(parent);
    }
    out.push('/');
    out.push_str(name);
    out
}

fn escape_path(names: &[Vec<u8>]) -> String {
    names
        .iter()
        .fold(String::from("/"), |path, name| escape_child(&path, name))
}

/// Enough of a path to find the place; past that it is usually the same few names repeated.
fn clip(path: &str) -> String {
    let mut end = path.len().min(120);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < path.len() { "…" } else { "" };
    format!("{}{more}", &path[..end])
}

/// Names the sandbox path an I/O error happened under (once: the innermost place is kept).
fn located(path: &str, e: io::Error) -> io::Error {
    if e.get_ref()
        .is_some_and(|inner| inner.is::<TooDeep>() || inner.is::<Unreadable>())
    {
        return e;
    }
    // InvalidInput is the caller's mistake (a bad `under`); an EINVAL from the host is not.
    let kind = match e.kind() {
        io::ErrorKind::InvalidInput => io::ErrorKind::Other,
        kind => kind,
    };
    io::Error::new(
        kind,
        Unreadable {
            path: clip(path),
            source: e,
        },
    )
}

/// One side's mounts with every layer root opened once.
struct Layers {
    mounts: Vec<Layered>,
    id_base: Option<u32>,
}

struct Layered {
    /// "/" or "/usr" …, normalized.
    target: Vec<u8>,
    /// Host paths of the layers, the upper first then the lowers: two sides share a lower
    /// directory when they name the same one.
    paths: Vec<PathBuf>,
    /// The same layers opened; None for one that does not exist (an upper nothing was written to).
    roots: Vec<Option<OwnedFd>>,
}

impl Layers {
    fn open(side: &Side) -> io::Result<Self> {
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
        })
    }

    /// The mount `path` is taken from: the last one whose target holds it.
    fn responsible(&self, path: &[u8]) -> Option<usize> {
        (0..self.mounts.len())
            .rev()
            .find(|&i| within(path, &self.mounts[i].target))
    }

    /// The root of mount `j` as an entry of its parent directory.
    fn mount_root(&self, j: usize) -> io::Result<Option<Found>> {
        let mount = &self.mounts[j];
        let chain: Vec<usize> = (0..mount.roots.len())
            .filter(|&l| mount.roots[l].is_some())
            .collect();
        let Some(fd) = chain.first().and_then(|&l| mount.roots[l].as_ref()) else {
            return Ok(None);
        };
        let st = fstat(fd)?;
        Ok(Some(Found {
            st: Stat::new(&st, self, chain[0] == 0),
            pos: None,
            child: Some(View { mount: j, chain }),
            mount_root: true,
        }))
    }

    /// Adds the name under `dir` that leads to each mount target below it (a mount point is
    /// there whatever the parent's layers say).
    fn mount_children(&self, dir: &[u8], names: &mut Vec<Vec<u8>>) {
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
struct Stat {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    dev: u64,
    ino: u64,
    rdev: u64,
}

impl Stat {
    /// Uppers hold host ids; lowers hold the sandbox's own.
    fn new(st: &FileStat, layers: &Layers, upper: bool) -> Self {
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

    fn format(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    fn is_device(&self) -> bool {
        matches!(self.format(), libc::S_IFCHR | libc::S_IFBLK)
    }

    fn kind(&self) -> Kind {
        match self.format() {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

/// A directory of one side: the mount it is taken from and the layers (indices into the
/// mount's) where it is a directory that counts, top first.
#[derive(Debug, Clone)]
struct View {
    mount: usize,
    chain: Vec<usize>,
}

/// A name resolved on one side.
struct Found {
    st: Stat,
    /// Position in the parent's chain of the layer it was found in (None: a mount's root).
    pos: Option<usize>,
    /// For a directory: where its own entries come from.
    child: Option<View>,
    mount_root: bool,
}

/// A directory of one side being listed: its layers' directories, opened on demand in order.
struct OpenDir<'l> {
    layers: &'l Layers,
    mount: usize,
    /// The path inside the mount's layers ("." for the mount's root).
    rel: CString,
    chain: Vec<usize>,
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
    fn new(layers: &'l Layers, view: View, path: &[u8]) -> io::Result<Self> {
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

    fn has_upper(&self) -> bool {
        self.chain.first() == Some(&0)
    }

    /// Whether `other` takes this directory's lower part from the very same directories, so
    /// that a name neither upper holds resolves the same on both.
    fn same_lowers(&self, other: &OpenDir<'_>) -> bool {
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
    fn fd(&mut self, k: usize) -> io::Result<Option<BorrowedFd<'_>>> {
        let mut i = 0;
        while i <= k && i < self.chain.len() {
            if matches!(self.slots[i], Slot::Closed) {
                self.open(i)?;
            }
            i += 1;
        }
        Ok(self.opened(k))
    }

    fn opened(&self, k: usize) -> Option<BorrowedFd<'_>> {
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
    fn names(&mut self, k: usize) -> io::Result<&[Vec<u8>]> {
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
    fn lookup(&mut self, name: &[u8], path: &[u8]) -> io::Result<Option<Found>> {
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
            let st = Stat::new(&st, layers, self.chain[k] == 0);
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

/// Opens directory `rel` below `root` without crossing a symlink or leaving `root`.
fn open_beneath(root: BorrowedFd<'_>, rel: &CStr) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let mut tries = 0;
    loop {
        match openat2(root, rel, how) {
            // A rename elsewhere raced the lookup: the kernel asks to try again.
            Err(Errno::EAGAIN) if tries < 8 => tries += 1,
            // No openat2 (an old kernel, or a seccomp filter): one name at a time.
            Err(Errno::ENOSYS | Errno::EPERM) => break,
            r => return r,
        }
    }
    let mut fd = openat(root, c".", flags, Mode::empty())?;
    for name in rel.to_bytes().split(|&c| c == b'/') {
        if !name.is_empty() && name != b"." {
            fd = openat(&fd, name, flags, Mode::empty())?;
        }
    }
    Ok(fd)
}

/// Errors that mean a directory was replaced after its parent was read.
fn vanished(e: Errno) -> bool {
    matches!(e, Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP)
}

fn read_names(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
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
fn open_file(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<File>> {
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
fn xattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Option<usize> {
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

fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 2];
    xattr(dir, OPAQUE, &mut buf).is_some_and(|n| buf[..n] == *b"y")
}

/// Reads until `buf` is full or the file ends.
fn fill(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
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

/// A directory's sandbox path, raw (to open it) and escaped (to show it), shared by everything
/// queued from it: a wide directory deep down costs its names, not its names times its path.
struct Place {
    raw: Vec<u8>,
    esc: String,
}

impl Place {
    /// The parent of "/" (so that the root is its child "").
    fn above_root() -> Rc<Self> {
        Rc::new(Self {
            raw: Vec::new(),
            esc: String::new(),
        })
    }

    fn child(&self, name: &[u8], esc_name: &str) -> Self {
        Self {
            raw: child(&self.raw, name),
            esc: join_escaped(&self.esc, esc_name),
        }
    }
}

enum Item {
    /// A change, its name escaped.
    Entry {
        parent: Rc<Place>,
        name: String,
        change: Change,
        kind: Kind,
        size: u64,
        what: Vec<&'static str>,
    },
    /// A directory to compare, and where each side takes it from (None: absent on that side,
    /// so everything in it is added or removed).
    Dir {
        parent: Rc<Place>,
        name: Vec<u8>,
        esc_name: String,
        a: Option<View>,
        b: Option<View>,
    },
}

impl Item {
    /// Sorting one directory's items by this yields every path in byte order of the escaped
    /// paths: a directory's contents sort as if its name ended in `/` (after `a-b` for `a`).
    fn key(&self) -> impl Iterator<Item = u8> + '_ {
        match self {
            Item::Entry { name, .. } => name.bytes().chain(None),
            Item::Dir { esc_name, .. } => esc_name.bytes().chain(Some(b'/')),
        }
    }
}

struct Walk<'l> {
    a: &'l Layers,
    b: &'l Layers,
    max: usize,
    diff: Diff,
    /// Pending work, the next in path order on top (an explicit stack: no recursion).
    stack: Vec<Item>,
    buf_a: Vec<u8>,
    buf_b: Vec<u8>,
}

impl<'l> Walk<'l> {
    /// Compares the entry at `under` itself, which queues its contents.
    fn start(&mut self, under: &[Vec<u8>]) -> io::Result<()> {
        let parent = match under.split_last() {
            None => Place::above_root(),
            Some((_, parent)) => Rc::new(Place {
                raw: join(parent),
                esc: escape_path(parent),
            }),
        };
        let name = under.last().map_or(&[][..], |n| n.as_slice());
        if child(&parent.raw, name).len() > MAX_PATH {
            let path = clip(&escape_child(&parent.esc, name));
            return Err(io::Error::other(TooDeep { path }));
        }
        let (fa, oa) = entry_at(self.a, under)?;
        let (fb, ob) = entry_at(self.b, under)?;
        let mut items = Vec::new();
        let dirs = (oa.as_ref(), ob.as_ref());
        self.judge(&parent, name, fa, fb, dirs, &mut items)?;
        self.stack.extend(items.into_iter().rev());
        Ok(())
    }

    fn run(&mut self) -> io::Result<()> {
        while let Some(item) = self.stack.pop() {
            match item {
                Item::Entry {
                    parent,
                    name,
                    change,
                    kind,
                    size,
                    what,
                } => {
                    self.count(change);
                    if self.diff.entries.len() < self.max {
                        self.diff.entries.push(Entry {
                            path: join_escaped(&parent.esc, &name),
                            change,
                            kind,
                            size,
                            what,
                        });
                    }
                }
                Item::Dir {
                    parent,
                    name,
                    esc_name,
                    a,
                    b,
                } => {
                    let place = Rc::new(parent.child(&name, &esc_name));
                    drop(parent);
                    self.dir(&place, a, b).map_err(|e| located(&place.esc, e))?;
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, change: Change) {
        match change {
            Change::Added => self.diff.added += 1,
            Change::Removed => self.diff.removed += 1,
            Change::Modified => self.diff.modified += 1,
        }
    }

    /// Whether every entry to keep is kept: what is found from now on is only counted.
    fn full(&self) -> bool {
        self.diff.entries.len() >= self.max
    }

    /// Compares the contents of one directory and queues what it finds in path order.
    fn dir(&mut self, place: &Rc<Place>, a: Option<View>, b: Option<View>) -> io::Result<()> {
        let open =
            |l: &'l Layers, v: Option<View>| v.map(|v| OpenDir::new(l, v, &place.raw)).transpose();
        let (mut oa, mut ob) = (open(self.a, a)?, open(self.b, b)?);
        // The uppers first: an opaque one means the lowers contribute nothing here.
        for o in [&mut oa, &mut ob].into_iter().flatten() {
            if o.has_upper() {
                o.fd(0)?;
            }
        }
        // Same lowers on both sides: a name in neither upper is the same name on both.
        let shared = matches!((&oa, &ob), (Some(x), Some(y)) if x.same_lowers(y));
        let mut names = Vec::new();
        for o in [&mut oa, &mut ob].into_iter().flatten() {
            let upto = if shared {
                usize::from(o.has_upper())
            } else {
                usize::MAX
            };
            let mut k = 0;
            while k < upto.min(o.chain.len()) {
                names.extend_from_slice(o.names(k)?);
                k += 1;
            }
            o.layers.mount_children(&place.raw, &mut names);
        }
        names.sort_unstable();
        names.dedup();
        let mut items = Vec::new();
        for name in &names {
            self.name(place, name, &mut oa, &mut ob, &mut items)?;
        }
        if !self.full() {
            items.sort_by(|x, y| x.key().cmp(y.key()));
        }
        self.stack.extend(items.into_iter().rev());
        Ok(())
    }

    /// Resolves `name` of directory `parent` on both sides and compares it.
    fn name(
        &mut self,
        parent: &Rc<Place>,
        name: &[u8],
        oa: &mut Option<OpenDir<'l>>,
        ob: &mut Option<OpenDir<'l>>,
        items: &mut Vec<Item>,
    ) -> io::Result<()> {
        let path = child(&parent.raw, name);
        if path.len() > MAX_PATH {
            let path = clip(&escape_child(&parent.esc, name));
            return Err(io::Error::other(TooDeep { path }));
        }
        let fa = match oa {
            Some(o) => o.lookup(name, &path)?,
            None => None,
        };
        let fb = match ob {
            Some(o) => o.lookup(name, &path)?,
            None => None,
        };
        self.judge(parent, name, fa, fb, (oa.as_ref(), ob.as_ref()), items)
    }

    /// Queues what differs between `fa` and `fb`, the two sides' entries for `name`, and the
    /// directory below it if there is one.
    fn judge(
        &mut self,
        parent: &Rc<Place>,
        name: &[u8],
        fa: Option<Found>,
        fb: Option<Found>,
        (oa, ob): (Option<&OpenDir<'_>>, Option<&OpenDir<'_>>),
        items: &mut Vec<Item>,
    ) -> io::Result<()> {
        let (change, what, st) = match (&fa, &fb) {
            (None, None) => return Ok(()),
            (None, Some(b)) => (Change::Added, Vec::new(), b.st),
            (Some(a), None) => (Change::Removed, Vec::new(), a.st),
            (Some(a), Some(b)) => {
                let what = self.differences(name, a, oa, b, ob)?;
                (Change::Modified, what, b.st)
            }
        };
        let (a, b) = (fa.and_then(|f| f.child), fb.and_then(|f| f.child));
        let changed = change != Change::Modified || !what.is_empty();
        if !changed && a.is_none() && b.is_none() {
            return Ok(());
        }
        let mut esc_name = String::with_capacity(name.len());
        escape(&mut esc_name, name);
        if changed && self.full() {
            // Nothing more is kept: no order to keep either.
            self.count(change);
        } else if changed {
            let kind = st.kind();
            items.push(Item::Entry {
                parent: parent.clone(),
                name: esc_name.clone(),
                change,
                kind,
                size: if kind == Kind::Dir { 0 } else { st.size },
                what,
            });
        }
        if a.is_some() || b.is_some() {
            items.push(Item::Dir {
                parent: parent.clone(),
                name: name.to_vec(),
                esc_name,
                a,
                b,
            });
        }
        Ok(())
    }

    fn differences(
        &mut self,
        name: &[u8],
        a: &Found,
        oa: Option<&OpenDir<'_>>,
        b: &Found,
        ob: Option<&OpenDir<'_>>,
    ) -> io::Result<Vec<&'static str>> {
        let mut what = Vec::new();
        let format = a.st.format();
        let same_type = format == b.st.format() && (!a.st.is_device() || a.st.rdev == b.st.rdev);
        if !same_type {
            what.push("type");
        }
        // A mount root's own mode and owner are the engine's: it makes the upper directory
        // (or has not yet), the sandbox did not.
        if a.mount_root || b.mount_root {
            return Ok(what);
        }
        let (da, db) = (parent_of(oa, a), parent_of(ob, b));
        if same_type && format == libc::S_IFREG && !self.same_content(name, a, da, b, db)? {
            what.push("content");
        }
        if a.st.mode & 0o7777 != b.st.mode & 0o7777 {
            what.push("mode");
        }
        if (a.st.uid, a.st.gid) != (b.st.uid, b.st.gid) {
            what.push("owner");
        }
        if same_type && format == libc::S_IFLNK && !same_target(name, da, db) {
            what.push("target");
        }
        Ok(what)
    }

    fn same_content(
        &mut self,
        name: &[u8],
        a: &Found,
        da: Option<BorrowedFd<'_>>,
        b: &Found,
        db: Option<BorrowedFd<'_>>,
    ) -> io::Result<bool> {
        if (a.st.dev, a.st.ino) == (b.st.dev, b.st.ino) {
            return Ok(true);
        }
        if a.st.size != b.st.size {
            return Ok(false);
        }
        if a.st.mtime == b.st.mtime {
            return Ok(true);
        }
        let (Some(da), Some(db)) = (da, db) else {
            return Ok(false);
        };
        // Replaced since it was looked at: something changed, whatever it was.
        let (Some(mut fa), Some(mut fb)) = (open_file(da, name)?, open_file(db, name)?) else {
            return Ok(false);
        };
        loop {
            let na = fill(&mut fa, &mut self.buf_a)?;
            let nb = fill(&mut fb, &mut self.buf_b)?;
            if self.buf_a[..na] != self.buf_b[..nb] {
                return Ok(false);
            }
            if na < CHUNK {
                return Ok(true);
            }
        }
    }
}

/// The directory `f` was found in.
fn parent_of<'o>(o: Option<&'o OpenDir<'_>>, f: &Found) -> Option<BorrowedFd<'o>> {
    o.zip(f.pos).and_then(|(o, k)| o.opened(k))
}

fn same_target(name: &[u8], da: Option<BorrowedFd<'_>>, db: Option<BorrowedFd<'_>>) -> bool {
    match (da, db) {
        (Some(da), Some(db)) => match (readlinkat(da, name), readlinkat(db, name)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        },
        _ => false,
    }
}

/// The entry at `names` (an absolute path's) on one side, with the directory it was found in
/// (None for a mount's root, which has none of its own).
fn entry_at<'l>(
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
mod tests {
    use super::*;
    use sandbox_mcp_sys::layers;
    use std::ffi::OsStr;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::time::{Duration, SystemTime};

    fn put(root: &Path, rel: &str, content: &[u8]) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn set_mtime(path: &Path, secs: u64) {
        let t = SystemTime::UNIX_EPOCH + Duration::new(secs, 123_456_789);
        fs::File::open(path).unwrap().set_modified(t).unwrap();
    }

    fn mount(target: &str, upper: &Path, lowers: &[&Path]) -> Mount {
        Mount {
            target: target.into(),
            upper: upper.to_path_buf(),
            lowers: lowers.iter().map(|l| l.to_path_buf()).collect(),
        }
    }

    fn side(upper: &Path, lowers: &[&Path]) -> Side {
        Side {
            mounts: vec![mount("/", upper, lowers)],
            id_base: None,
        }
    }

    fn list(d: &Diff) -> Vec<(String, Change, Vec<&'static str>)> {
        d.entries
            .iter()
            .map(|e| (e.path.clone(), e.change, e.what.clone()))
            .collect()
    }

    fn added(p: &str) -> (String, Change, Vec<&'static str>) {
        (p.into(), Change::Added, vec![])
    }

    fn removed(p: &str) -> (String, Change, Vec<&'static str>) {
        (p.into(), Change::Removed, vec![])
    }

    fn modified(p: &str, what: &[&'static str]) -> (String, Change, Vec<&'static str>) {
        (p.into(), Change::Modified, what.to_vec())
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    fn set_xattr(path: &Path, name: &CStr, value: &[u8]) {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings and a buffer of the length given.
        let r = unsafe {
            libc::lsetxattr(
                p.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
    }

    /// A small template layer, the same every time it is made.
    fn template(dir: &Path) {
        put(dir, "etc/hostname", b"box\n");
        put(dir, "etc/passwd", b"root:x:0:0::/root:/bin/sh\n");
        put(dir, "etc/conf.d/a", b"a = 1\n");
        put(dir, "etc/conf.d/b", b"b = 2\n");
        put(dir, "usr/bin/tool", b"#!/bin/sh\necho hi\n");
        put(dir, "var/lib/data", &[7; 100_000]);
        fs::create_dir_all(dir.join("tmp")).unwrap();
        std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
    }

    #[test]
    fn files_added_removed_and_modified_are_listed_in_path_order() {
        let tmp = tempfile::tempdir().unwrap();
        let (lower, ua, ub) = (
            tmp.path().join("lower"),
            tmp.path().join("a"),
            tmp.path().join("b"),
        );
        put(&lower, "same.txt", b"x");
        put(&lower, "edit.txt", b"1");
        put(&ua, "old.txt", b"old");
        put(&ub, "new.txt", b"new");
        put(&ub, "edit.txt", b"22");
        put(&ua, "dir/f", b"f");
        put(&ub, "dir/f", b"f");
        set_mtime(&ua.join("dir/f"), 1000);
        set_mtime(&ub.join("dir/f"), 1000);
        put(&ub, "newdir/x/y", b"yy");
        // `a-b` sorts between `a` and `a/c`.
        put(&ub, "a/c", b"");
        put(&ub, "a-b", b"");
        // A directory replaced by a file: its contents are gone.
        put(&ua, "t/1", b"1");
        put(&ub, "t", b"t");
        let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![
                added("/a"),
                added("/a-b"),
                added("/a/c"),
                modified("/edit.txt", &["content"]),
                added("/new.txt"),
                added("/newdir"),
                added("/newdir/x"),
                added("/newdir/x/y"),
                removed("/old.txt"),
                // A directory (0755) became a file (0644).
                modified("/t", &["type", "mode"]),
                removed("/t/1"),
            ]
        );
        assert_eq!((d.added, d.removed, d.modified), (7, 2, 2));
        let new = &d.entries[4];
        assert_eq!((new.kind, new.size), (Kind::File, 3));
        let dir = &d.entries[5];
        assert_eq!((dir.kind, dir.size), (Kind::Dir, 0));
        let t = &d.entries[9];
        assert_eq!((t.kind, t.size), (Kind::File, 1));
        let gone = &d.entries[10];
        assert_eq!((gone.kind, gone.size), (Kind::File, 1));

        // An upper that does not exist yet is an empty one.
        let none = tmp.path().join("missing");
        let empty = tmp.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let d = diff(&side(&none, &[&lower]), &side(&empty, &[&lower]), "/", 100).unwrap();
        assert_eq!((d.added, d.removed, d.modified), (0, 0, 0));
        let d = diff(&side(&none, &[&lower]), &side(&ub, &[&lower]), "/", 0).unwrap();
        assert_eq!(
            (d.added, d.removed, d.modified, d.entries.len()),
            (10, 0, 1, 0)
        );
    }

    #[test]
    fn whiteouts_and_opaque_directories_hide_the_lower_layers() {
        let tmp = tempfile::tempdir().unwrap();
        let (lower, ua, ub) = (
            tmp.path().join("lower"),
            tmp.path().join("a"),
            tmp.path().join("b"),
        );
        put(&lower, "f", b"f");
        put(&lower, "g", b"g");
        put(&lower, "d/x", b"x");
        put(&lower, "d/y", b"y");
        put(&lower, "d/sub/z", b"z");
        put(&lower, "e/keep", b"k");
        fs::create_dir_all(&ua).unwrap();
        put(&ub, "d/w", b"w");
        layers::mark_opaque(&ub.join("d")).unwrap();
        layers::whiteout(&ub.join("f")).unwrap();
        // The other form of whiteout: an empty file carrying the xattr.
        put(&ub, "g", b"");
        set_xattr(&ub.join("g"), WHITEOUT, b"");
        // An empty file without it is just an empty file.
        put(&ub, "e/keep", b"");
        // A whiteout over nothing is nothing.
        layers::whiteout(&ub.join("never")).unwrap();
        let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![
                removed("/d/sub"),
                removed("/d/sub/z"),
                added("/d/w"),
                removed("/d/x"),
                removed("/d/y"),
                modified("/e/keep", &["content"]),
                removed("/f"),
                removed("/g"),
            ]
        );
        // Seen the other way round, and with the opaque directory in a lower layer instead.
        let d = diff(&side(&ub, &[&lower]), &side(&ua, &[&lower]), "/", 100).unwrap();
        assert_eq!((d.added, d.removed, d.modified), (6, 1, 1));
        let top = tmp.path().join("top");
        put(&top, "d/only", b"o");
        layers::mark_opaque(&top.join("d")).unwrap();
        let d = diff(
            &side(&ua, &[&lower]),
            &side(&ua, &[&top, &lower]),
            "/d",
            100,
        )
        .unwrap();
        assert_eq!(
            list(&d),
            vec![
                added("/d/only"),
                removed("/d/sub"),
                removed("/d/sub/z"),
                removed("/d/x"),
                removed("/d/y"),
            ]
        );
    }

    #[test]
    fn a_permission_change_alone_is_a_mode_change() {
        let tmp = tempfile::tempdir().unwrap();
        let (lower, ua, ub) = (
            tmp.path().join("lower"),
            tmp.path().join("a"),
            tmp.path().join("b"),
        );
        put(&lower, "run.sh", b"#!/bin/sh\n");
        put(&ub, "run.sh", b"#!/bin/sh\n");
        fs::set_permissions(lower.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(ub.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir_all(lower.join("dir")).unwrap();
        fs::create_dir_all(ub.join("dir")).unwrap();
        fs::set_permissions(ub.join("dir"), fs::Permissions::from_mode(0o1777)).unwrap();
        fs::create_dir_all(&ua).unwrap();
        let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![modified("/dir", &["mode"]), modified("/run.sh", &["mode"])]
        );
    }

    #[test]
    fn owners_are_compared_as_the_sandbox_sees_them() {
        if !is_root() {
            eprintln!("skipped: changing owners needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (lower, ua, ub) = (
            tmp.path().join("lower"),
            tmp.path().join("a"),
            tmp.path().join("b"),
        );
        let own = |p: &Path, id: u32| std::os::unix::fs::lchown(p, Some(id), Some(id)).unwrap();
        for (upper, base) in [(&ua, 100_000), (&ub, 200_000)] {
            put(upper, "same", b"s");
            set_mtime(&upper.join("same"), 5);
            own(&upper.join("same"), base + 1000);
            put(upper, "other", b"o");
            set_mtime(&upper.join("other"), 5);
            // Both outside the range: nobody on both sides.
            put(upper, "stray", b"s");
            set_mtime(&upper.join("stray"), 5);
            own(&upper.join("stray"), base + 70_000);
        }
        own(&ua.join("other"), 100_005);
        own(&ub.join("other"), 200_006);
        // A lower file stores the sandbox's ids; its copy in b's upper, host ids.
        put(&lower, "up", b"u");
        own(&lower.join("up"), 1000);
        put(&ub, "up", b"u");
        own(&ub.join("up"), 201_000);
        put(&lower, "up2", b"u");
        own(&lower.join("up2"), 1000);
        put(&ub, "up2", b"u");
        own(&ub.join("up2"), 1000);
        let a = Side {
            id_base: Some(100_000),
            ..side(&ua, &[&lower])
        };
        let b = Side {
            id_base: Some(200_000),
            ..side(&ub, &[&lower])
        };
        let d = diff(&a, &b, "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![modified("/other", &["owner"]), modified("/up2", &["owner"])]
        );
        // Without a base, host ids are compared as they are.
        let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
        assert_eq!(d.modified, 4);
    }

    #[test]
    fn symlinks_are_compared_by_target_and_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir_all(&ua).unwrap();
        fs::create_dir_all(&ub).unwrap();
        let link = |target: &str, at: &Path| std::os::unix::fs::symlink(target, at).unwrap();
        link("b", &ub.join("a"));
        link("a", &ub.join("b"));
        link("x", &ua.join("link"));
        link("yy", &ub.join("link"));
        link("same", &ua.join("keep"));
        link("same", &ub.join("keep"));
        link("/etc", &ub.join("etc"));
        put(&ua, "f", b"f");
        link("f", &ub.join("f"));
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![
                added("/a"),
                added("/b"),
                added("/etc"),
                modified("/f", &["type", "mode"]),
                modified("/link", &["target"]),
            ]
        );
        assert!(d.entries.iter().all(|e| e.kind == Kind::Symlink));
        assert_eq!(d.entries[4].size, 2);
        // Under a symlink there is nothing to walk.
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/etc", 100).unwrap();
        assert_eq!(list(&d), vec![added("/etc")]);
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/etc/passwd", 100).unwrap();
        assert!(d.entries.is_empty());
    }

    #[test]
    fn fifos_are_compared_without_being_opened() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir_all(&ua).unwrap();
        fs::create_dir_all(&ub).unwrap();
        let fifo = |p: &Path, mode: u32| {
            nix::unistd::mkfifo(p, Mode::from_bits_truncate(mode)).unwrap();
            fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
        };
        fifo(&ua.join("p"), 0o644);
        fifo(&ub.join("p"), 0o644);
        fifo(&ub.join("q"), 0o644);
        fifo(&ua.join("r"), 0o644);
        put(&ub, "r", b"");
        fs::set_permissions(ub.join("r"), fs::Permissions::from_mode(0o644)).unwrap();
        fifo(&ua.join("s"), 0o600);
        fifo(&ub.join("s"), 0o644);
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![
                added("/q"),
                modified("/r", &["type"]),
                modified("/s", &["mode"]),
            ]
        );
        assert_eq!(d.entries[0].kind, Kind::Other);
        assert_eq!(d.entries[1].kind, Kind::File);
    }

    #[test]
    fn odd_names_are_escaped_and_never_collide() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir_all(&ua).unwrap();
        fs::create_dir_all(&ub).unwrap();
        for name in [
            &b"a\nb"[..],
            b"a\\x0ab",
            b"c\xff",
            b"c\\xff",
            b"tab\there",
            "é\u{85}".as_bytes(),
        ] {
            fs::write(ub.join(OsStr::from_bytes(name)), b"").unwrap();
        }
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
        let paths: Vec<&str> = d.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "/a\\\\x0ab",
                "/a\\x0ab",
                "/c\\\\xff",
                "/c\\xff",
                "/tab\\x09here",
                "/é\\xc2\\x85",
            ]
        );
        assert!(paths.iter().all(|p| p.chars().all(|c| !c.is_control())));
    }

    #[test]
    fn contents_are_read_only_when_size_and_mtime_do_not_settle_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        // Same size, different bytes, same mtime: taken as unchanged (what a copy keeps).
        put(&ua, "trusted", b"aaaa");
        put(&ub, "trusted", b"bbbb");
        set_mtime(&ua.join("trusted"), 10);
        set_mtime(&ub.join("trusted"), 10);
        // Same size, different bytes, different mtimes: read, and different.
        put(&ua, "read", b"aaaa");
        put(&ub, "read", b"bbbb");
        set_mtime(&ua.join("read"), 10);
        set_mtime(&ub.join("read"), 11);
        // Same bytes, different mtimes: read, and the same.
        put(&ua, "touched", b"same");
        put(&ub, "touched", b"same");
        set_mtime(&ua.join("touched"), 10);
        set_mtime(&ub.join("touched"), 11);
        // Several chunks, differing only in the last byte; and identical ones.
        let mut big = vec![1u8; 3 * CHUNK + 17];
        put(&ua, "big", &big);
        put(&ua, "big-same", &big);
        put(&ub, "big-same", &big);
        *big.last_mut().unwrap() = 2;
        put(&ub, "big", &big);
        for name in ["big", "big-same"] {
            set_mtime(&ua.join(name), 10);
            set_mtime(&ub.join(name), 11);
        }
        // Hard links: one inode seen from both sides.
        put(&ua, "linked", b"L");
        fs::hard_link(ua.join("linked"), ub.join("linked")).unwrap();
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
        assert_eq!(
            list(&d),
            vec![
                modified("/big", &["content"]),
                modified("/read", &["content"]),
            ]
        );
    }

    #[test]
    fn under_limits_the_walk_and_must_be_absolute() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        put(&ua, "x/keep", b"k");
        put(&ub, "x/keep", b"k");
        set_mtime(&ua.join("x/keep"), 1);
        set_mtime(&ub.join("x/keep"), 1);
        put(&ub, "x/1", b"1");
        put(&ub, "x/sub/2", b"2");
        put(&ub, "y/3", b"3");
        let (a, b) = (side(&ua, &[]), side(&ub, &[]));
        let under = |u: &str| list(&diff(&a, &b, u, 100).unwrap());
        assert_eq!(
            under("/x"),
            vec![added("/x/1"), added("/x/sub"), added("/x/sub/2")]
        );
        assert_eq!(under("/x/"), under("/x"));
        assert_eq!(under("//x/./sub"), vec![added("/x/sub"), added("/x/sub/2")]);
        assert_eq!(under("/x/1"), vec![added("/x/1")]);
        assert_eq!(under("/y"), vec![added("/y"), added("/y/3")]);
        assert_eq!(under("/nope"), vec![]);
        assert_eq!(under("/x/keep/deeper"), vec![]);
        assert_eq!(diff(&a, &b, "/", 100).unwrap().added, 5);
        for bad in ["x", "", "/x/../y", "/..", "/x\0"] {
            let e = diff(&a, &b, bad, 100).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn max_entries_caps_the_list_but_not_the_counts() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir_all(&ua).unwrap();
        for i in 0..10 {
            put(&ub, &format!("f{i}"), b"x");
            put(&ua, &format!("g{i}"), b"x");
        }
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 3).unwrap();
        assert_eq!(list(&d), vec![added("/f0"), added("/f1"), added("/f2")]);
        assert_eq!((d.added, d.removed, d.modified), (10, 10, 0));
        // Directories compared once the list is full are still counted.
        for i in 0..5 {
            put(&ub, &format!("d1/f{i}"), b"x");
            put(&ub, &format!("d2/sub/g{i}"), b"x");
        }
        let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 3).unwrap();
        assert_eq!(
            list(&d),
            vec![added("/d1"), added("/d1/f0"), added("/d1/f1")]
        );
        assert_eq!((d.added, d.removed, d.modified), (23, 10, 0));
        assert_eq!(
            diff(&side(&ua, &[]), &side(&ub, &[]), "/", 0)
                .unwrap()
                .added,
            23
        );
    }

    /// Makes `depth` nested directories named `d` under `dir`, one descriptor at a time (their
    /// paths are too long for the host to name in one go).
    fn chain(dir: &Path, depth: usize) {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut fd = openat(nix::fcntl::AT_FDCWD, dir, flags, Mode::empty()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(&fd, c"d", Mode::from_bits_truncate(0o755)).unwrap();
            fd = openat(&fd, c"d", flags, Mode::empty()).unwrap();
        }
    }

    #[test]
    fn a_very_deep_tree_fails_cleanly_on_a_small_stack() {
        let tmp = tempfile::tempdir().unwrap();
        let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir_all(&ua).unwrap();
        fs::create_dir_all(ub.join("ok")).unwrap();
        fs::create_dir_all(ub.join("deep")).unwrap();
        // 1 000 levels fit in a path; 20 000 do not.
        chain(&ub.join("ok"), 1000);
        chain(&ub.join("deep"), 20_000);
        let (a, b) = (side(&ua, &[]), side(&ub, &[]));
        let small = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || (diff(&a, &b, "/ok", 5), diff(&a, &b, "/", 5)))
            .unwrap();
        let (ok, deep) = small.join().unwrap();
        let ok = ok.unwrap();
        assert_eq!((ok.added, ok.entries.len()), (1001, 5));
        let e = deep.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Other);
        let msg = e.to_string();
        assert!(msg.starts_with("/deep/d/d/d/"), "{msg}");
        assert!(msg.contains("…") && msg.contains("too deep"), "{msg}");
        assert!(!msg.contains(tmp.path().to_str().unwrap()), "{msg}");
        // std's remove_dir_all recurses with a descriptor per level: too many here.
        sandbox_mcp_sys::fs_tree::remove_tree(tmp.path()).unwrap();
    }

    #[test]
    fn a_later_mount_owns_everything_under_its_target() {
        let tmp = tempfile::tempdir().unwrap();
        let p = |n: &str| tmp.path().join(n);
        let (root_lower, usr_lower) = (p("root-lower"), p("usr-lower"));
        put(&root_lower, "etc/os", b"os");
        // Hidden by the /usr mount.
        put(&root_lower, "usr/old", b"old");
        put(&usr_lower, "bin/sh", b"sh");
        put(&p("ra"), "usr/ignored", b"i");
        put(&p("rb"), "usr/ignored-too", b"i");
        put(&p("ub"), "bin/new", b"n");
        fs::create_dir_all(p("ua")).unwrap();
        let two = |root_upper: &Path, usr_upper: &Path| Side {
            mounts: vec![
                mount("/", root_upper, &[&root_lower]),
                mount("/usr", usr_upper, &[&usr_lower]),
            ],
            id_base: None,
        };
        let (a, b) = (two(&p("ra"), &p("ua")), two(&p("rb"), &p("ub")));
        assert_eq!(
            list(&diff(&a, &b, "/", 100).unwrap()),
            vec![added("/usr/bin/new")]
        );
        assert_eq!(
            list(&diff(&a, &b, "/usr/bin", 100).unwrap()),
            vec![added("/usr/bin/new")]
        );
        // Against a side without the /usr mount, its /usr is the root mount's.
        let one = Side {
            mounts: vec![mount("/", &p("rb"), &[&root_lower])],
            id_base: None,
        };
        assert_eq!(
            list(&diff(&a, &one, "/", 100).unwrap()),
            vec![
                removed("/usr/bin"),
                removed("/usr/bin/sh"),
                added("/usr/ignored-too"),
                added("/usr/old"),
            ]
        );
        // Without a root mount, only what is under the others is there.
        let only_usr = |u: &Path| Side {
            mounts: vec![mount("/usr", u, &[&usr_lower])],
            id_base: None,
        };
        let (a2, b2) = (only_usr(&p("ua")), only_usr(&p("ub")));
        assert_eq!(
            list(&diff(&a2, &b2, "/usr", 100).unwrap()),
            vec![added("/usr/bin/new")]
        );
        assert_eq!(list(&diff(&a2, &b2, "/", 100).unwrap()), vec![]);
        // A mount whose target the root mount lacks still appears.
        let c = tmp.path().join("opt-lower");
        put(&c, "tool", b"t");
        let mut with_opt = two(&p("ra"), &p("ua"));
        with_opt.mounts.push(mount("/opt", &p("none"), &[&c]));
        assert_eq!(
            list(&diff(&a, &with_opt, "/", 100).unwrap()),
            vec![added("/opt"), added("/opt/tool")]
        );
    }

    #[test]
    fn shared_lowers_give_the_answer_a_full_walk_gives() {
        let tmp = tempfile::tempdir().unwrap();
        let p = |n: &str| tmp.path().join(n);
        template(&p("t1"));
        template(&p("t2"));
        let (ua, ub) = (p("a"), p("b"));
        // a: edits in a copied-up directory, a deleted tree, an opaque directory.
        put(&ua, "etc/hostname", b"alpha\n");
        put(&ua, "etc/conf.d/c", b"c = 3\n");
        layers::whiteout(&ua.join("var")).unwrap();
        put(&ua, "tmp/scratch/1", b"1");
        // b: other edits, some the same as a's.
        // (Not the same size: written within one clock tick, same-size files would have one
        // mtime and be taken as equal.)
        put(&ub, "etc/hostname", b"beta\n");
        put(&ub, "etc/conf.d/c", b"c = 3\n");
        layers::mark_opaque(&ub.join("etc/conf.d")).unwrap();
        put(&ub, "usr/bin/tool", b"#!/bin/sh\necho bye\n");
        put(&ub, "home/me/notes", b"n");
        layers::whiteout(&ub.join("bin")).unwrap();
        let shared = diff(&side(&ua, &[&p("t1")]), &side(&ub, &[&p("t1")]), "/", 100).unwrap();
        let full = diff(&side(&ua, &[&p("t1")]), &side(&ub, &[&p("t2")]), "/", 100).unwrap();
        let expected = vec![
            removed("/bin"),
            removed("/etc/conf.d/a"),
            removed("/etc/conf.d/b"),
            modified("/etc/hostname", &["content"]),
            added("/home"),
            added("/home/me"),
            added("/home/me/notes"),
            removed("/tmp/scratch"),
            removed("/tmp/scratch/1"),
            modified("/usr/bin/tool", &["content"]),
            added("/var"),
            added("/var/lib"),
            added("/var/lib/data"),
        ];
        assert_eq!(list(&shared), expected);
        assert_eq!(list(&full), expected);
        // Two sides on one template with nothing written: nothing to say.
        fs::create_dir_all(p("e1")).unwrap();
        let d = diff(
            &side(&p("e1"), &[&p("t1")]),
            &side(&p("e2"), &[&p("t1")]),
            "/",
            9,
        )
        .unwrap();
        assert_eq!((d.added, d.removed, d.modified), (0, 0, 0));
        // A snapshot's layer above the same template: the rest of the template is shared.
        let d = diff(
            &side(&p("e1"), &[&ua, &p("t1")]),
            &side(&p("e2"), &[&p("t1")]),
            "/",
            100,
        )
        .unwrap();
        assert_eq!(
            list(&d),
            vec![
                removed("/etc/conf.d/c"),
                modified("/etc/hostname", &["content"]),
                removed("/tmp/scratch"),
                removed("/tmp/scratch/1"),
                added("/var"),
                added("/var/lib"),
                added("/var/lib/data"),
            ]
        );
    }

    #[test]
    fn directories_are_never_opened_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("upper");
        fs::create_dir_all(root.join("real/sub")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        std::os::unix::fs::symlink("real", root.join("rel")).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = openat(nix::fcntl::AT_FDCWD, &root, flags, Mode::empty()).unwrap();
        assert!(open_beneath(fd.as_fd(), c"real/sub").is_ok());
        for path in [c"link", c"link/ssl", c"rel/sub", c"rel"] {
            let e = open_beneath(fd.as_fd(), path).unwrap_err();
            assert!(vanished(e), "{path:?}: {e}");
        }
    }

    /// Two forks of one parent whose upper holds 20 000 files (100 MB), each fork's upper a
    /// copy keeping mtimes, a few changes in one. Run with
    /// `cargo test --release --lib engine::diff -- --ignored --nocapture`.
    #[test]
    #[ignore = "writes 200 MB; a measurement"]
    fn timing_of_two_forks_of_a_large_upper() {
        let tmp = tempfile::tempdir().unwrap();
        let p = |n: &str| tmp.path().join(n);
        for i in 0..2000 {
            put(
                &p("template"),
                &format!("usr/lib/{}/f{i}", i % 50),
                &[1; 300],
            );
        }
        let body = vec![b'x'; 5000];
        let (ua, ub) = (p("a"), p("b"));
        let started = std::time::Instant::now();
        for i in 0..20_000u64 {
            let rel = format!("work/d{}/f{i}.txt", i % 200);
            for upper in [&ua, &ub] {
                put(upper, &rel, &body);
                set_mtime(&upper.join(&rel), 1_700_000_000 + i);
            }
        }
        eprintln!("made 2 x 20 000 files in {:?}", started.elapsed());
        for i in 0..10 {
            let rel = format!("work/d{}/f{i}.txt", i % 200);
            put(&ub, &rel, &vec![b'y'; 5000]);
            put(&ub, &format!("work/new/n{i}"), b"new");
            // Deleted in b: its upper's copy gives way to a whiteout.
            let gone = ub.join(format!("work/d{}/f{}.txt", (100 + i) % 200, 100 + i));
            fs::remove_file(&gone).unwrap();
            layers::whiteout(&gone).unwrap();
        }
        let (a, b) = (side(&ua, &[&p("template")]), side(&ub, &[&p("template")]));
        // CPU time too: on a shared machine the wall clock also measures the neighbours.
        let cpu = || {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid clock id and a timespec to fill.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        };
        for round in 0..5 {
            let (started, cpu_started) = (std::time::Instant::now(), cpu());
            let d = diff(&a, &b, "/", 1000).unwrap();
            eprintln!(
                "diff {round}: {:?} ({:?} of CPU; {} added, {} removed, {} modified)",
                started.elapsed(),
                cpu() - cpu_started,
                d.added,
                d.removed,
                d.modified
            );
            assert_eq!((d.added, d.removed, d.modified), (11, 10, 10));
        }
        // The worst case: every mtime differs, so all 2 x 100 MB are read.
        for i in 0..20_000u64 {
            let rel = format!("work/d{}/f{i}.txt", i % 200);
            if ub.join(&rel).metadata().is_ok_and(|m| m.len() > 0) {
                set_mtime(&ub.join(&rel), 1);
            }
        }
        let started = std::time::Instant::now();
        let d = diff(&a, &b, "/", 1000).unwrap();
        eprintln!("diff reading every file: {:?}", started.elapsed());
        assert_eq!((d.added, d.removed, d.modified), (11, 10, 10));
    }
}
