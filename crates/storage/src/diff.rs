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
//!
//! `path` names and escapes sandbox paths; `side` opens one side's mounts and shows its ids as
//! the sandbox sees them; `overlay` resolves names through a side's layers as overlayfs would;
//! `open` is every call that touches a layer's files; `walk` compares the two sides in path
//! order.

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod fixture;
mod open;
mod overlay;
mod path;
mod side;
mod walk;

use std::io;
use std::path::PathBuf;

use path::{components, escape_path, located};
use side::Layers;
use walk::Walk;

/// Longest path (as the sandbox sees it, in bytes) compared; a deeper one fails the diff.
const MAX_PATH: usize = 4096;

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
    /// How many of each mount's lowers, the first ones, hold the sandbox's own files as its
    /// upper does (layers a fork or snapshot froze), so with its owners.
    pub stacked: usize,
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
    let mut walk = Walk::new(&a, &b, max_entries);
    let esc = escape_path(&under);
    walk.start(&under).map_err(|e| located(&esc, e))?;
    walk.run()?;
    Ok(walk.diff)
}
