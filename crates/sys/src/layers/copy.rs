//! The copier behind [`capture`](super::capture), [`squash`](super::squash) and
//! [`copy_tree`](super::copy_tree): one walk for all three, reaching every entry through an open
//! directory (a tree it copies may be one that sandbox code still changes).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{MAX_PATH, Owners, TooDeep, cstr, is_opaque, mark_opaque, mknod, whiteout};

pub(super) struct Copier {
    owners: Owners,
    /// Keep setuid and setgid bits (a copy of a sandbox for itself, not a template).
    exact: bool,
    bytes: u64,
    /// Hard-linked files already copied: (device, inode) → the copy (its tree's root and its
    /// path below it).
    links: HashMap<(u64, u64), Below>,
    modes: Vec<(Below, u32)>,
    /// Directories whose times are set once everything in them is written (exact copies).
    dir_times: Vec<(Below, fs::Metadata)>,
    /// Copying a tree over the trees below it: what they left at a name is replaced.
    over: bool,
}

impl Copier {
    pub(super) fn new(owners: Owners, exact: bool) -> Self {
        Self {
            owners,
            exact,
            bytes: 0,
            links: HashMap::new(),
            modes: Vec::new(),
            dir_times: Vec::new(),
            over: false,
        }
    }

    /// Copies `trees` (bottom first) to `dest`, each over the ones before it.
    pub(super) fn stacked(&mut self, trees: &[PathBuf], dest: &Path) -> io::Result<()> {
        let mut first = true;
        for tree in trees {
            if fs::symlink_metadata(tree).is_ok_and(|m| m.is_dir()) {
                self.over = !first;
                self.tree(tree, dest)?;
                first = false;
            }
        }
        Ok(())
    }

    /// Directory modes and times last (a read-only directory must not stop its own copy, and
    /// writing entries changes times), each the topmost tree's. A directory a tree above
    /// replaced is gone.
    pub(super) fn finish(self) -> io::Result<u64> {
        let mut modes: HashMap<&Below, u32> = HashMap::new();
        for (dir, mode) in &self.modes {
            modes.insert(dir, *mode);
        }
        for (dir, _) in self.modes.iter().rev() {
            if let Some(mode) = modes.remove(dir)
                && let Some(fd) = dir.open()?
            {
                nix::sys::stat::fchmod(&fd, nix::sys::stat::Mode::from_bits_truncate(mode))?;
            }
        }
        let mut times: HashMap<&Below, &fs::Metadata> = HashMap::new();
        for (dir, meta) in &self.dir_times {
            times.insert(dir, meta);
        }
        for (dir, _) in self.dir_times.iter().rev() {
            if let Some(meta) = times.remove(dir)
                && let Some(fd) = dir.open()?
            {
                dir_times(&fd, meta)?;
            }
        }
        Ok(self.bytes)
    }

    /// Copying over lower trees: what they left at `dst` goes, unless both are directories and
    /// `src`'s is not opaque (then their entries merge).
    fn replace(&self, src: &Path, meta: &fs::Metadata, dst: &Path) -> io::Result<()> {
        let Ok(below) = fs::symlink_metadata(dst) else {
            return Ok(());
        };
        if below.is_dir() && meta.is_dir() && !is_opaque(src) {
            return Ok(());
        }
        crate::fs_tree::remove_tree(dst)
    }

    /// Copies the tree at `from` iteratively (a sandbox can make trees deep enough to overflow a
    /// recursive walk's stack). Either tree may be one that sandbox code can still change (a
    /// volume other sandboxes mount): every directory is opened beneath its tree's root without
    /// crossing a symlink, and every entry is reached through its open directory
    /// (`/proc/self/fd/N/name`), one name the calls below never follow. What changes while it
    /// is copied (deleted, or a directory swapped for a link, or the other way round) is left
    /// out, as if the copy had reached it a moment earlier or later: the copy of a live volume
    /// does not fail for what its sandboxes do, and nothing is read or written outside the two
    /// trees.
    pub(super) fn tree(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let src_root = crate::fs_tree::open_dir_beneath_path(None, from)?;
        let mut dst_root: Option<std::os::fd::OwnedFd> = None;
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            if to.join(&rel).as_os_str().len() > MAX_PATH {
                return Err(io::Error::other(TooDeep::at(&from.join(&rel), from)));
            }
            // The directory itself, named through its open parent (the roots by their paths,
            // which are the engine's).
            let (parents, src, dst) = match (rel.parent(), rel.file_name(), &dst_root) {
                (Some(parent), Some(name), Some(dst_root)) => {
                    let sp = crate::fs_tree::open_dir_beneath_path(Some(&src_root), parent);
                    let dp = crate::fs_tree::open_dir_beneath_path(Some(dst_root), parent);
                    let (Some(sp), Some(dp)) = (left_out(sp)?, left_out(dp)?) else {
                        continue;
                    };
                    let (src, dst) = (at(&sp, name), at(&dp, name));
                    (Some((sp, dp)), src, dst)
                }
                _ => (None, from.to_path_buf(), to.to_path_buf()),
            };
            let Some(meta) = left_out(fs::symlink_metadata(&src))? else {
                continue;
            };
            if !meta.is_dir() {
                // Replaced since its parent was read: not this tree's any more.
                continue;
            }
            if self.over {
                self.replace(&src, &meta, &dst)?;
            }
            self.dir(&src, &dst, &meta, to, &rel)?;
            drop(parents);
            let dst_root = match &mut dst_root {
                Some(fd) => &*fd,
                None => dst_root.insert(crate::fs_tree::open_dir_beneath_path(None, to)?),
            };
            let sdir = crate::fs_tree::open_dir_beneath_path(Some(&src_root), &rel);
            let ddir = crate::fs_tree::open_dir_beneath_path(Some(dst_root), &rel);
            let (Some(sdir), Some(ddir)) = (left_out(sdir)?, left_out(ddir)?) else {
                continue;
            };
            let mut listing = nix::dir::Dir::openat(
                &sdir,
                c".",
                nix::fcntl::OFlag::O_RDONLY
                    | nix::fcntl::OFlag::O_DIRECTORY
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )?;
            for entry in listing.iter() {
                let entry = entry?;
                let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes());
                if name == "." || name == ".." {
                    continue;
                }
                let (s, d) = (at(&sdir, name), at(&ddir, name));
                let Ok(meta) = fs::symlink_metadata(&s) else {
                    // Gone since the directory was read.
                    continue;
                };
                let ft = meta.file_type();
                // A directory is looked at when it is taken off the stack.
                if self.over && !ft.is_dir() {
                    self.replace(&s, &meta, &d)?;
                }
                if ft.is_dir() {
                    stack.push(rel.join(name));
                } else if ft.is_file() {
                    self.file(&s, &d, &meta, to, &rel.join(name))?;
                } else if ft.is_symlink() {
                    let target = match fs::read_link(&s) {
                        // No longer a link.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => continue,
                        r => left_out(r)?,
                    };
                    let Some(target) = target else { continue };
                    std::os::unix::fs::symlink(target, &d)?;
                    self.chown(&d, &meta)?;
                    if self.exact {
                        keep_times(&d, &meta)?;
                    }
                } else if ft.is_char_device() && meta.rdev() == 0 {
                    // An overlay whiteout: the file was deleted in the sandbox.
                    whiteout(&d)?;
                } else if ft.is_fifo() {
                    mknod(&d, libc::S_IFIFO | (meta.mode() & 0o777))?;
                    self.chown(&d, &meta)?;
                    if self.exact {
                        keep_times(&d, &meta)?;
                    }
                }
                // Sockets and real device nodes are not part of a filesystem image.
            }
        }
        Ok(())
    }

    fn dir(
        &mut self,
        src: &Path,
        dst: &Path,
        meta: &fs::Metadata,
        root: &Path,
        rel: &Path,
    ) -> io::Result<()> {
        match fs::DirBuilder::new().mode(0o700).create(dst) {
            // Made by a tree below, or there already (the root); a link someone put there is
            // refused when the directory is opened beneath the root.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            r => r?,
        }
        if is_opaque(src) {
            mark_opaque(dst)?;
        }
        self.chown(dst, meta)?;
        let keep = if self.exact { 0o7777 } else { 0o1777 };
        let below = Below::new(root, rel);
        self.modes.push((below.clone(), meta.mode() & keep));
        if self.exact {
            self.dir_times.push((below, meta.clone()));
        }
        Ok(())
    }

    fn file(
        &mut self,
        src: &Path,
        dst: &Path,
        meta: &fs::Metadata,
        root: &Path,
        rel: &Path,
    ) -> io::Result<()> {
        if meta.nlink() > 1
            && let Some(first) = self.links.get(&(meta.dev(), meta.ino()))
        {
            let (Some(parent), Some(name)) = (first.rel.parent(), first.rel.file_name()) else {
                return Err(io::Error::other("a hard link's first copy has no name"));
            };
            let root = crate::fs_tree::open_dir_beneath_path(None, &first.root)?;
            let dir = crate::fs_tree::open_dir_beneath_path(Some(&root), parent);
            // Its first copy is out of reach when sandbox code bent the destination since (a
            // refilled volume): this one is copied on its own below.
            if let Some(dir) = left_out(dir)?
                && let Some(linked) = left_out(fs::hard_link(at(&dir, name), dst))?
            {
                return Ok(linked);
            }
        }
        let input = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(src);
        let Some(mut input) = left_out(input)? else {
            return Ok(());
        };
        if !input.metadata()?.is_file() {
            // Replaced by a directory or something else since it was looked at.
            return Ok(());
        }
        let mut output = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)?;
        self.bytes += io::copy(&mut input, &mut output)?;
        self.chown(dst, meta)?;
        // setuid and setgid go from a template: it is never a way to gain ids. (A sandbox's
        // own copy keeps them: it only ever runs them as ids the sandbox already has.)
        let keep = if self.exact { 0o7777 } else { 0o1777 };
        output.set_permissions(fs::Permissions::from_mode(meta.mode() & keep))?;
        if self.exact {
            keep_times(dst, meta)?;
        }
        if meta.nlink() > 1 {
            self.links
                .entry((meta.dev(), meta.ino()))
                .or_insert_with(|| Below::new(root, rel));
        }
        Ok(())
    }

    fn chown(&self, path: &Path, meta: &fs::Metadata) -> io::Result<()> {
        if let (Some(uid), Some(gid)) = (self.owners.map(meta.uid()), self.owners.map(meta.gid())) {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        }
        Ok(())
    }
}

/// A directory or file of a copy: the copy's root and its path below it, opened again beneath
/// the root when needed (never by the whole path, which sandbox code could bend).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Below {
    root: PathBuf,
    rel: PathBuf,
}

impl Below {
    fn new(root: &Path, rel: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            rel: rel.to_path_buf(),
        }
    }

    /// The directory, open; `None` when it is gone or no longer a directory (a tree above
    /// replaced it, or something else did).
    fn open(&self) -> io::Result<Option<std::os::fd::OwnedFd>> {
        let opened = crate::fs_tree::open_dir_beneath_path(None, &self.root).and_then(|root| {
            match self.rel.as_os_str().is_empty() {
                true => Ok(root),
                false => crate::fs_tree::open_dir_beneath_path(Some(&root), &self.rel),
            }
        });
        left_out(opened)
    }
}

/// `None` for what a tree sandbox code still changes may do to an entry between its lookup
/// and its use: deleted, or no longer a directory (`ENOTDIR`), or now a link (`ELOOP`, never
/// followed). Such an entry is left out of the copy.
fn left_out<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `name` in the open directory `dir`, as a path the kernel resolves through the descriptor
/// (not by the directory's own path).
fn at(dir: &std::os::fd::OwnedFd, name: &std::ffi::OsStr) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

/// The access and modification times of `meta`, as `utimensat` and `futimens` take them.
fn times_of(meta: &fs::Metadata) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec(),
        },
        libc::timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec(),
        },
    ]
}

/// Gives the open directory `dir` the access and modification times of `meta`.
fn dir_times(dir: &std::os::fd::OwnedFd, meta: &fs::Metadata) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let times = times_of(meta);
    // SAFETY: an open descriptor and an array of two timespecs.
    if unsafe { libc::futimens(dir.as_raw_fd(), times.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives `path` (never followed) the access and modification times of `meta`.
pub(super) fn keep_times(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    let p = cstr(path)?;
    let times = times_of(meta);
    // SAFETY: a NUL-terminated path and an array of two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
