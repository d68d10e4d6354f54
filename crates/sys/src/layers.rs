//! Template layers: read-only trees under `<data>/layers/<id>/`, one subdirectory per overlay
//! target (`root` for `/`, `usr` for the host's /usr, …), stacked under a sandbox's own upper
//! directory. A layer is written once (by a build step, a capture or an image import), renamed
//! into place complete, and never changed after: running sandboxes share it.
//!
//! Capturing copies a sandbox's upper directories, which sandbox code wrote: the walk never
//! follows a symlink, keeps overlay whiteouts and opaque directories (so deletions carry into
//! the layer), drops setuid and setgid bits and every device node but a whiteout, and as root
//! shifts the sandbox's host ids back to the ids the sandbox saw (lower layers are id-mapped
//! into each sandbox, so a layer stores ids as seen inside).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The xattr overlayfs (mounted with `userxattr`) reads to hide a lower directory's contents.
const OPAQUE: &str = "user.overlay.opaque";
/// Paths longer than this are refused rather than half-copied.
const MAX_PATH: usize = 4000;

/// The layer store of a data dir.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("layers")
}

/// A layer id from what determines its content: 32 hex digits of SHA-256.
pub fn id_of(parts: &[&[u8]]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part);
    }
    hex(&ctx.finish().as_ref()[..16])
}

/// A mount target as the name of its directory in a layer (and in a sandbox's own directory):
/// `/` is `root`, `/usr/local` is `usr_local`. The engine's templates and the driver that mounts
/// them both name layer directories by it.
pub fn layer_name(target: &str) -> String {
    let trimmed = target.trim_matches('/');
    if trimmed.is_empty() {
        "root".into()
    } else {
        trimmed.replace('/', "_")
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How sandbox host ids map back to the ids a layer stores.
#[derive(Debug, Clone, Copy)]
pub enum Owners {
    /// As root: host ids `base..base + count` are the sandbox's 0.., others become nobody. The
    /// driver, which maps the ids, says which.
    Shift { base: u32, count: u32 },
    /// Unprivileged: everything belongs to the engine's user already; ownership is left alone.
    Keep,
    /// As root, copying one sandbox tree to another place on the host (a snapshot, a fork):
    /// every file keeps its host ids.
    Same,
}

impl Owners {
    fn map(self, id: u32) -> Option<u32> {
        match self {
            Owners::Shift { base, count } => Some(match id.checked_sub(base) {
                Some(n) if n < count => n,
                _ => 65534,
            }),
            Owners::Keep => None,
            Owners::Same => Some(id),
        }
    }
}

/// Copies `uppers` (layer subdirectory name → a sandbox's own trees for that overlay, bottom
/// first: the layers its earlier files were frozen into, then its upper directory) into `dest`,
/// a new directory, as one layer, and returns the bytes of file content copied. A tree above
/// replaces what the ones below have at a name, as the overlay shows it: its whiteouts and
/// opaque directories are kept (they hide the template's files too), and directories merge.
/// The sandbox must be stopped or frozen. Missing or empty trees are skipped.
pub fn capture(uppers: &[(String, Vec<PathBuf>)], dest: &Path, owners: Owners) -> io::Result<u64> {
    fs::DirBuilder::new().mode(0o755).create(dest)?;
    let mut copier = copy::Copier::new(owners, false);
    for (name, trees) in uppers {
        copier.stacked(trees, &dest.join(name))?;
    }
    copier.finish()
}

/// Merges a sandbox's own trees (bottom first) into `dest`, a new directory, exactly as
/// [`copy_tree`] copies one: one layer that shows what they showed stacked, whiteouts and
/// opaque directories kept for the layers beneath. Returns the bytes of file content copied.
pub fn squash(trees: &[PathBuf], dest: &Path, owners: Owners) -> io::Result<u64> {
    let mut copier = copy::Copier::new(owners, true);
    copier.stacked(trees, dest)?;
    copier.finish()
}

/// Copies a sandbox's tree `from` (its uppers, stopped or frozen, so that the copy is one
/// moment's; a volume that running sandboxes mount is copied too, and nothing outside either
/// tree is read or written even then) to `to`, which must not exist (or, refilling a volume, is
/// empty), exactly: modes with setuid and setgid, whiteouts, opaque directories, hard links and
/// (with [`Owners::Same`]) host ids are kept, and so are modification times (a diff takes a file
/// of the same size and time as unchanged without reading it), so the copy is the same filesystem. Sockets are
/// not files to copy and are left out. Returns the bytes of file content copied. The copy path
/// of snapshots and forks where the store cannot snapshot.
pub fn copy_tree(from: &Path, to: &Path, owners: Owners) -> io::Result<u64> {
    let mut copier = copy::Copier::new(owners, true);
    copier.tree(from, to)?;
    copier.finish()
}

/// A capture refused because the sandbox nests files past what a path can name. The message is
/// for the caller: it names the place as the sandbox sees it, never as a host path.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path} is nested too deep to capture (paths over {MAX_PATH} bytes); delete or move that tree in the sandbox first"
)]
pub struct TooDeep {
    path: String,
}

impl TooDeep {
    fn at(src: &Path, upper: &Path) -> Self {
        let inside = src.strip_prefix(upper).unwrap_or(src).to_string_lossy();
        // Enough of it to find; the rest is the same few names over and over.
        let mut end = inside.len().min(120);
        while !inside.is_char_boundary(end) {
            end -= 1;
        }
        let more = if end < inside.len() { "…" } else { "" };
        Self {
            path: format!("/{}{more}", &inside[..end]),
        }
    }
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

fn mknod(path: &Path, mode: libc::mode_t) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: a NUL-terminated path and plain integers.
    if unsafe { libc::mknod(p.as_ptr(), mode, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The value of xattr `name` of `path` (not following a symlink), if it has one of at most
/// 64 bytes.
pub fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = cstr(path).ok()?;
    let n = CString::new(name).ok()?;
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

/// An overlay whiteout at `path`: a 0:0 character device, which hides the name in the layers
/// below (the kernel lets anyone make one since 5.8).
pub fn whiteout(path: &Path) -> io::Result<()> {
    mknod(path, libc::S_IFCHR)
}

/// Whether `dir` is marked opaque (see [`mark_opaque`]).
pub fn is_opaque(dir: &Path) -> bool {
    get_xattr(dir, OPAQUE).is_some_and(|v| v == b"y")
}

/// Marks `dir` opaque: it hides everything below it in lower layers (overlayfs mounted with
/// `userxattr` reads `user.overlay.opaque`).
pub fn mark_opaque(dir: &Path) -> io::Result<()> {
    set_xattr(dir, OPAQUE, b"y")
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let p = cstr(path)?;
    let n = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves a finished layer into the store under `id`. Another build may have made the same
/// layer meanwhile: then theirs is kept and `tmp` deleted.
pub fn publish(tmp: &Path, store: &Path, id: &str) -> io::Result<PathBuf> {
    let dest = store.join(id);
    match fs::rename(tmp, &dest) {
        Ok(()) => Ok(dest),
        Err(_) if dest.is_dir() => {
            crate::fs_tree::remove_tree(tmp)?;
            Ok(dest)
        }
        Err(e) => Err(e),
    }
}

/// A fresh directory in the store for a layer being made (`.tmp-…`, never a layer id).
pub fn scratch(store: &Path) -> io::Result<PathBuf> {
    // 0711: a sandbox's host ids pass through to the layers it mounts; no one lists the ids.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(store)?;
    let mut random = [0u8; 12];
    getrandom::fill(&mut random).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(store.join(format!(".tmp-{}", hex(&random))))
}

/// Deletes every layer no template uses, and scratch directories left by a crash.
pub fn collect_garbage(store: &Path, used: &std::collections::HashSet<String>) {
    let Ok(entries) = fs::read_dir(store) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !used.contains(&name)
            && let Err(e) = crate::fs_tree::remove_tree(&entry.path())
        {
            tracing::warn!("cannot delete unused layer {name}: {e}");
        }
    }
}

mod copy;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
