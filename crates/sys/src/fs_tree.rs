//! Walking directory trees that sandbox code built: iteratively, in bounded memory, never
//! following a symlink. A sandbox can make a tree 15 000 directories deep (or a million); a
//! recursive walk would overflow the stack of whatever thread deletes it, and a walk by path
//! would fail past `PATH_MAX`. Used by the engine (deleting a killed sandbox's files, measuring
//! its disk) and by the agent (recursive deletes inside a sandbox).

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{FchmodatFlags, Mode, fchmodat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Deepest recursion, used only for directories that cannot be moved (an overlay's lower
/// directories, which templates keep shallow).
const MAX_DEPTH: usize = 64;

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Deletes `path` and everything below it without following symlinks (a symlink or a file at
/// `path` is simply unlinked). Memory stays constant whatever the depth: the directories of
/// each level are moved up next to `path`'s own entries, so the walk never goes deeper than
/// two levels (an overlay's lower directories, which cannot move, are recursed into instead).
/// A missing `path` is not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    let top: OwnedFd = open_dir(None, path.as_os_str())?;
    let mut hoisted = 0u64;
    // Each pass empties every directory found at the top, moving its subdirectories to the top;
    // the tree gets shallower every pass and the loop ends when the top is empty.
    loop {
        let mut seen_any = false;
        for (name, is_dir) in entries(top.as_fd())? {
            seen_any = true;
            if is_dir {
                let sub = open_dir_fixing(top.as_fd(), &name)?;
                empty_dir(sub.as_fd(), Some((top.as_fd(), &mut hoisted)), 0)?;
                drop(sub);
                remove_entry(top.as_fd(), &name, true)?;
            } else {
                remove_entry(top.as_fd(), &name, false)?;
            }
        }
        if !seen_any {
            break;
        }
    }
    drop(top);
    match fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Empties `dir`: files go; subdirectories move to `top` (when given) or are emptied in turn.
fn empty_dir(
    dir: BorrowedFd<'_>,
    mut top: Option<(BorrowedFd<'_>, &mut u64)>,
    depth: usize,
) -> io::Result<()> {
    loop {
        let batch = entries(dir)?;
        if batch.is_empty() {
            return Ok(());
        }
        for (name, is_dir) in batch {
            if !is_dir {
                remove_entry(dir, &name, false)?;
                continue;
            }
            if let Some((top_fd, counter)) = top.as_mut()
                && hoist(dir, &name, *top_fd, counter).is_ok()
            {
                continue;
            }
            if depth >= MAX_DEPTH {
                return Err(io::Error::other(
                    "directories nested too deep to delete (and they cannot be moved)",
                ));
            }
            let sub = open_dir_fixing(dir, &name)?;
            empty_dir(sub.as_fd(), None, depth + 1)?;
            drop(sub);
            remove_entry(dir, &name, true)?;
        }
    }
}

/// Moves directory `name` out of `dir` into `top` under a fresh name.
fn hoist(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    top: BorrowedFd<'_>,
    counter: &mut u64,
) -> io::Result<()> {
    loop {
        *counter += 1;
        let fresh = format!(".sandbox-mcp-rm.{counter}");
        match renameat2(
            dir,
            name,
            top,
            fresh.as_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => return Ok(()),
            Err(Errno::EEXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The names in `dir` (without `.` and `..`), with whether each is a directory (not a symlink
/// to one). Read in one pass from a fresh stream.
fn entries(dir: BorrowedFd<'_>) -> io::Result<Vec<(OsString, bool)>> {
    let mut stream = Dir::openat(dir, ".", dir_flags(), Mode::empty())?;
    let mut out = Vec::new();
    for entry in stream.iter() {
        let entry = entry?;
        let name: &CStr = entry.file_name();
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            Some(Type::Directory) => true,
            Some(_) => false,
            // Filesystems that do not fill d_type: ask without following links.
            None => fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
        };
        out.push((OsStr::from_bytes(bytes).to_os_string(), is_dir));
        // Bounded per pass: the caller loops until the directory is empty.
        if out.len() >= 4096 {
            break;
        }
    }
    Ok(out)
}

fn open_dir(dir: Option<BorrowedFd<'_>>, name: &OsStr) -> io::Result<OwnedFd> {
    let name = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name contains a NUL byte"))?;
    let fd = match dir {
        Some(dir) => openat(dir, name.as_c_str(), dir_flags(), Mode::empty()),
        None => openat(
            nix::fcntl::AT_FDCWD,
            name.as_c_str(),
            dir_flags(),
            Mode::empty(),
        ),
    }?;
    Ok(fd)
}

/// Opens subdirectory `name`, making it searchable first if it is not (a sandbox may have left
/// a directory at mode 000; as its owner, or as root, we may change that).
fn open_dir_fixing(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    match open_dir(Some(dir), name) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            fchmodat(
                dir,
                name,
                Mode::from_bits_truncate(0o700),
                FchmodatFlags::NoFollowSymlink,
            )
            .or_else(|_| {
                fchmodat(
                    dir,
                    name,
                    Mode::from_bits_truncate(0o700),
                    FchmodatFlags::FollowSymlink,
                )
            })?;
            open_dir(Some(dir), name)
        }
        other => other,
    }
}

/// Unlinks `name` (a directory when `is_dir`), making `dir` writable first if it is not.
fn remove_entry(dir: BorrowedFd<'_>, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    match unlinkat(dir, name, flags) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EACCES) => {
            nix::sys::stat::fchmod(dir, Mode::from_bits_truncate(0o700))?;
            match unlinkat(dir, name, flags) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Bytes allocated under `dir` (st_blocks, so sparse files count what they use), without
/// following symlinks or recursing. Stops counting after `max_entries` entries; unreadable
/// parts (too deep for a path, say) are skipped.
pub fn disk_usage(dir: &Path, max_entries: usize) -> u64 {
    disk_usage_within(dir, max_entries, MAX_PENDING_PATH_BYTES)
}

/// Most bytes of directory paths waiting to be read during [`disk_usage`]. The tree belongs to
/// the sandbox, so its shape is hostile: a million directories side by side below a long path
/// would otherwise queue gigabytes of paths in the engine.
const MAX_PENDING_PATH_BYTES: usize = 16 << 20;

fn disk_usage_within(dir: &Path, max_entries: usize, max_pending: usize) -> u64 {
    let Ok(root) = open_dir(None, dir.as_os_str()) else {
        return 0;
    };
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut pending = 0usize;
    // Directories still to read, by their path below `dir`: each is opened from `root` by a
    // lookup that refuses every symlink on the way ([`open_dir_beneath`]), so a directory the
    // sandbox swaps for a link while the walk runs is not followed out of its tree.
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        pending -= rel.as_os_str().len();
        let fd = match rel.as_os_str().is_empty() {
            true => root.try_clone(),
            false => open_dir_beneath_path(Some(&root), &rel),
        };
        let Some(mut stream) = fd.ok().and_then(|fd| Dir::from_fd(fd).ok()) else {
            continue;
        };
        let at = stream.as_fd().try_clone_to_owned();
        let Ok(at) = at else {
            continue;
        };
        for entry in stream.iter().flatten() {
            let name: &CStr = entry.file_name();
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            seen += 1;
            if seen > max_entries {
                return total;
            }
            // Looked up by name in the open directory, never following a link.
            let Ok(st) = fstatat(&at, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            total += (st.st_blocks as u64).saturating_mul(512);
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                continue;
            }
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            // A path past PATH_MAX cannot be looked up: not worth queueing.
            let len = child.as_os_str().len();
            if len < libc::PATH_MAX as usize {
                if pending + len > max_pending {
                    return total;
                }
                pending += len;
                stack.push(child);
            }
        }
    }
    total
}

/// [`open_dir_beneath`] by path: `rel` below `root`, or without a root, the directory at `rel`
/// itself (a path the engine chose; only its last name is not followed). An empty `rel` is
/// `root` itself.
pub fn open_dir_beneath_path(root: Option<&OwnedFd>, rel: &Path) -> io::Result<OwnedFd> {
    match root {
        None => open_dir(None, rel.as_os_str()),
        Some(root) if rel.as_os_str().is_empty() => root.try_clone(),
        Some(root) => {
            let rel = CString::new(rel.as_os_str().as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a name contains a NUL byte")
            })?;
            Ok(open_dir_beneath(root.as_fd(), &rel)?)
        }
    }
}

/// Opens directory `rel` below `root` without crossing a symlink or leaving `root` (openat2's
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; without openat2, one `O_NOFOLLOW` open per name).
/// Sandbox code may be renaming and relinking the tree meanwhile: a directory swapped for a
/// link is an error, never followed.
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &CStr) -> nix::Result<OwnedFd> {
    use nix::fcntl::{OpenHow, ResolveFlag, openat2};
    let how = OpenHow::new()
        .flags(dir_flags())
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
    let mut fd = openat(root, c".", dir_flags(), Mode::empty())?;
    for name in rel.to_bytes().split(|&c| c == b'/') {
        if !name.is_empty() && name != b"." {
            fd = openat(&fd, name, dir_flags(), Mode::empty())?;
        }
    }
    Ok(fd)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A chain of `depth` directories below `root`, built by descending with relative paths
    /// (the full path is far past PATH_MAX), with a file and a symlink at every 1000th level.
    fn deep_chain(root: &Path, depth: usize) {
        let mut fd = open_dir(None, root.as_os_str()).unwrap();
        for i in 0..depth {
            nix::sys::stat::mkdirat(fd.as_fd(), "d", Mode::from_bits_truncate(0o755)).unwrap();
            if i % 1000 == 0 {
                let f = openat(
                    fd.as_fd(),
                    "f",
                    OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o644),
                )
                .unwrap();
                drop(f);
                nix::unistd::symlinkat("/etc", fd.as_fd(), "link").unwrap();
            }
            fd = open_dir(Some(fd.as_fd()), OsStr::new("d")).unwrap();
        }
    }

    /// Runs `f` on a small stack, like a blocking-pool thread's or less, where a recursive walk
    /// of a deep tree would overflow.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_tree_deeper_than_any_stack_or_path_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir(&root).unwrap();
        deep_chain(&root, 20_000);
        let r = root.clone();
        on_small_stack(move || remove_tree(&r).unwrap());
        assert!(!root.exists());
        assert!(Path::new("/etc/hostname").exists() || Path::new("/etc").exists());
    }

    #[test]
    fn symlinks_are_unlinked_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), "x").unwrap();
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/b/to-outside")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("top-link")).unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert!(outside.join("keep").exists());
        // A symlink given as the path itself is removed, not its target.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(outside.join("keep").exists() && !link.exists());
        remove_tree(&dir.path().join("missing")).unwrap();
    }

    #[test]
    fn unsearchable_and_unwritable_directories_are_fixed_up() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("locked/inner")).unwrap();
        fs::write(root.join("locked/inner/file"), "x").unwrap();
        fs::set_permissions(root.join("locked/inner"), fs::Permissions::from_mode(0o500)).unwrap();
        fs::set_permissions(root.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
        if nix::unistd::geteuid().is_root() {
            // As root, permissions never refuse: act as the files' unprivileged owner instead.
            // A filesystem id other than 0 drops the DAC capabilities of this thread only.
            let nobody = 65534;
            let parent = dir.path().to_path_buf();
            for p in [
                &parent,
                &root,
                &root.join("locked"),
                &root.join("locked/inner"),
            ] {
                std::os::unix::fs::lchown(p, Some(nobody), Some(nobody)).unwrap();
            }
            std::os::unix::fs::lchown(root.join("locked/inner/file"), Some(nobody), Some(nobody))
                .unwrap();
            let r = root.clone();
            std::thread::spawn(move || {
                // SAFETY: per-thread filesystem ids (raw syscalls, not the process-wide wrappers).
                unsafe {
                    libc::syscall(libc::SYS_setfsgid, nobody);
                    libc::syscall(libc::SYS_setfsuid, nobody);
                }
                assert!(
                    fs::read_dir(r.join("locked")).is_err(),
                    "fsuid must not be root"
                );
                remove_tree(&r).unwrap();
            })
            .join()
            .unwrap();
        } else {
            remove_tree(&root).unwrap();
        }
        assert!(!root.exists());
    }

    #[test]
    fn wide_directories_are_emptied_across_passes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("sub")).unwrap();
        for i in 0..10_000 {
            fs::write(root.join(format!("f{i}")), "").unwrap();
            if i % 10 == 0 {
                fs::create_dir(root.join(format!("sub/d{i}"))).unwrap();
            }
        }
        remove_tree(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn disk_usage_survives_a_deep_tree_and_counts_what_it_can_reach() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir(&root).unwrap();
        deep_chain(&root, 15_000);
        let r = root.clone();
        let used = on_small_stack(move || disk_usage(&r, 1_000_000));
        // The file written at the top level takes a block on every filesystem.
        assert!(used > 0, "nothing counted");
        // (The temporary directory's own removal is recursive.)
        remove_tree(&root).unwrap();
    }

    #[test]
    fn directories_are_never_opened_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("upper");
        fs::create_dir_all(root.join("real/sub")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        std::os::unix::fs::symlink("real", root.join("rel")).unwrap();
        let fd = open_dir(None, root.as_os_str()).unwrap();
        assert!(open_dir_beneath(fd.as_fd(), c"real/sub").is_ok());
        for path in [c"link", c"link/ssl", c"rel/sub", c"rel"] {
            let e = open_dir_beneath(fd.as_fd(), path).unwrap_err();
            assert!(
                matches!(e, Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP),
                "{path:?}: {e}"
            );
        }
    }

    /// A sandbox swapping one of its directories for a link to a host directory while the
    /// engine measures it: the walk never counts what the link leads to.
    #[test]
    fn disk_usage_never_follows_a_directory_swapped_for_a_link() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let (tree, outside) = (dir.path().join("tree"), dir.path().join("outside"));
        fs::create_dir_all(tree.join("d/e")).unwrap();
        fs::create_dir_all(outside.join("e")).unwrap();
        fs::write(outside.join("e/big"), vec![1u8; 8 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("l")).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, tree) = (stop.clone(), tree.clone());
            std::thread::spawn(move || {
                let at = open_dir(None, tree.as_os_str()).unwrap();
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    renameat2(&at, "d", &at, "l", RenameFlags::RENAME_EXCHANGE).unwrap();
                    swaps += 1;
                }
                swaps
            })
        };
        let most = (0..3000)
            .map(|_| disk_usage(&tree, 1_000_000))
            .max()
            .unwrap();
        stop.store(true, Ordering::Relaxed);
        assert!(
            swapper.join().unwrap() > 0,
            "the directory was never swapped"
        );
        assert!(most < 8 << 20, "counted {most} bytes from outside the tree");
    }

    #[test]
    fn disk_usage_stops_at_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..200 {
            let d = dir.path().join(format!("{i:0>100}"));
            fs::create_dir(&d).unwrap();
            fs::write(d.join("f"), vec![1u8; 8192]).unwrap();
        }
        let all = disk_usage(dir.path(), 1_000_000);
        assert!(all >= 200 * 8192, "{all}");
        // The entry bound.
        assert!(disk_usage(dir.path(), 100) < all);
        // The bound on queued paths: 200 paths of ~100 bytes do not fit in 2 KiB, so fewer
        // directories are read (a lower bound is reported), and nothing grows past it.
        let bounded = disk_usage_within(dir.path(), 1_000_000, 2048);
        assert!(bounded < all, "{bounded} of {all}");
    }
}
