//! Stacked layers: how a fork or snapshot on the plain store (no btrfs) costs no copy.
//!
//! A stopped sandbox's upper directory is renamed into `.layers/<name>`, a read-only layer, and
//! the sandbox and each copy get a new empty upper over it. Which layers a sandbox's (or
//! snapshot's) files stack on is its directory's `stack` file, top first; the launcher puts them
//! between its upper and the template's layers. A layer is deleted once no stack names it.
//!
//! Crash safety: the stack file naming the new layer is written (and synced) before the upper
//! is renamed into it, so after a crash either nothing changed, or the stack names a layer whose
//! files are still the upper ([`NamespacesDriver::finish_stacking`] renames them at the next
//! start), or the move is done. A copy's directory is made after that; its record says
//! `creating` (or its snapshot `ready: false`) until the engine has it, and recovery deletes it.

use std::collections::HashSet;
use std::io::Write;

use super::*;

/// In a sandbox's (or snapshot's) directory: the layers its files stack on, one name a line,
/// top first.
pub(in crate::driver) const STACK_FILE: &str = "stack";
/// Most layers a sandbox's own files stack on. A fork or snapshot of one already this deep
/// copies its files instead (which keeps the depth): overlayfs reads each lower on every
/// lookup that misses above it, and a mount's options must fit a page.
pub const MAX_STACK: usize = 8;
/// In a layer's directory, beside the mounts' trees: the bytes its files take, measured once
/// (a layer never changes).
const BYTES_FILE: &str = ".bytes";

impl NamespacesDriver {
    pub(super) fn layers_dir(&self) -> PathBuf {
        self.sandboxes_dir.join(".layers")
    }

    pub(super) fn layer_dir(&self, layer: &str) -> PathBuf {
        self.layers_dir().join(layer)
    }

    /// The layers under sandbox (or snapshot) `name`'s files, top first; none when it has no
    /// stack file. A name that is not one this driver makes is an error, never a path.
    pub(super) fn stack_of(&self, name: &str) -> io::Result<Vec<String>> {
        read_stack(&self.dir(name))
    }

    /// The directories of `name`'s stacked layers for the overlay at `target`, top first.
    pub(super) fn stacked_dirs(&self, name: &str, target: &str) -> io::Result<Vec<PathBuf>> {
        Ok(self
            .stack_of(name)?
            .iter()
            .map(|l| self.layer_dir(l).join(plan::layer_name(target)))
            .collect())
    }

    /// Bytes of `name`'s stacked layers, each measured once and remembered in the layer.
    pub(super) fn stacked_bytes(&self, name: &str) -> u64 {
        let Ok(stack) = self.stack_of(name) else {
            return 0;
        };
        stack
            .iter()
            .map(|layer| {
                let dir = self.layer_dir(layer);
                let noted = fs::read_to_string(dir.join(BYTES_FILE))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                noted.unwrap_or_else(|| {
                    let bytes = sandbox_mcp_sys::fs_tree::disk_usage(&dir, 1_000_000);
                    let _ = fs::write(dir.join(BYTES_FILE), bytes.to_string());
                    bytes
                })
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Whether `from`'s files can be stacked, and it runs nothing but its agent (which is its
    /// pid namespace's init: every other process there, orphans too, descends from it), so
    /// that stopping it for that ends nothing of the caller's.
    pub(super) fn stackable(&self, from: &FsRef) -> bool {
        self.stackable_files(from)
            && self
                .agent_pid(&from.name)
                .is_none_or(|pid| !has_children(pid))
    }

    /// Whether `from`'s files can be stacked (once it is stopped): the plain store, and a stack
    /// this driver can read.
    pub(super) fn stackable_files(&self, from: &FsRef) -> bool {
        matches!(self.store, Store::Plain(_))
            && self.dir(&from.name).is_dir()
            && self.stack_of(&from.name).is_ok()
    }

    /// See [`Storage::stack_fs`](sandbox_mcp_model::driver::Storage::stack_fs). Three ways, by
    /// what the stopped sandbox wrote since its last layer:
    /// - nothing: its stack is shared as it is, and no layer is made;
    /// - something, under [`MAX_STACK`] layers: its upper is renamed into a new layer;
    /// - something, at [`MAX_STACK`]: its upper and its top layer are merged into a new layer
    ///   that replaces the top one (a copy of its latest changes only), so the depth stays.
    pub(super) fn stack(
        &self,
        from: &FsRef,
        to: &[(String, CloneKind)],
    ) -> Result<Option<CloneMethod>, DriverError> {
        if !self.stackable(from) {
            return Ok(None);
        }
        let _guard = sandbox_mcp_sys::lock(&self.stacking);
        let src = self.dir(&from.name);
        let old = self
            .stack_of(&from.name)
            .map_err(DriverError::io("read the sandbox's layers"))?;
        self.ensure_ids(from)
            .map_err(DriverError::io("record the ids of the sandbox's files"))?;
        fs::DirBuilder::new()
            .mode(0o711)
            .create(self.layers_dir())
            .or_else(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .map_err(DriverError::io("create the layers directory"))?;
        let upper = src.join("upper");
        let roots = mount_roots(&upper).map_err(DriverError::io("read the sandbox's files"))?;
        let stack = if roots.iter().all(|r| r.empty) {
            old
        } else if old.len() < MAX_STACK {
            let layer = new_layer_name(&from.name);
            let mut stack = vec![layer.clone()];
            stack.extend(old);
            // The commit point: from here the layer is the sandbox's, moved or not yet.
            write_stack(&src, &stack).map_err(DriverError::io("write the sandbox's layers"))?;
            move_upper(&src, &self.layer_dir(&layer), &roots)
                .map_err(DriverError::io("make the sandbox's files a layer"))?;
            stack
        } else {
            self.squash_top(from, &old, &roots)?
        };
        let made = to.iter().try_for_each(|(name, kind)| {
            let dir = self.dir(name);
            match kind {
                CloneKind::Snapshot => fs::DirBuilder::new().mode(0o700).create(&dir),
                CloneKind::Sandbox { limit_bytes } => {
                    disk::create_dir(&self.store, &self.sandboxes_dir, name, *limit_bytes)
                        .and_then(|()| make_roots(&dir.join("upper"), &roots))
                }
            }?;
            write_stack(&dir, &stack)?;
            if src.join(IDS_FILE).exists() {
                fs::copy(src.join(IDS_FILE), dir.join(IDS_FILE))?;
            }
            sync_dir(&dir)
        });
        let synced = made.and_then(|()| {
            sync_dir(&self.layers_dir())?;
            sync_dir(&src)?;
            sync_dir(&self.sandboxes_dir)
        });
        if let Err(e) = synced {
            for (name, _) in to {
                let _ = disk::remove_dir(&self.store, &self.sandboxes_dir, name);
            }
            return Err(DriverError::io("make the copies' directories")(e));
        }
        Ok(Some(CloneMethod::Layers))
    }

    /// The third way of [`Self::stack`]: a new layer, the sandbox's top layer with its upper
    /// over it, replaces the top layer. Crash-safe without recovery: until the upper is
    /// emptied, it only repeats what the new layer holds.
    fn squash_top(
        &self,
        from: &FsRef,
        old: &[String],
        roots: &[Root],
    ) -> Result<Vec<String>, DriverError> {
        let src = self.dir(&from.name);
        let layer = new_layer_name(&from.name);
        let owners = if self.uid == 0 {
            sandbox_mcp_sys::layers::Owners::Same
        } else {
            sandbox_mcp_sys::layers::Owners::Keep
        };
        let scratch = self.layers_dir().join(format!(".{layer}"));
        let trees = [self.layer_dir(&old[0]), src.join("upper")];
        let merged = sandbox_mcp_sys::layers::squash(&trees, &scratch, owners)
            .and_then(|_| fs::rename(&scratch, self.layer_dir(&layer)));
        if let Err(e) = merged {
            let _ = sandbox_mcp_sys::fs_tree::remove_tree(&scratch);
            return Err(tree_error("merge the sandbox's latest files into a layer")(
                e,
            ));
        }
        let mut stack = vec![layer];
        stack.extend(old[1..].iter().cloned());
        write_stack(&src, &stack).map_err(DriverError::io("write the sandbox's layers"))?;
        // Emptied by a rename aside: what is deleted after is no longer the sandbox's.
        let aside = self
            .layers_dir()
            .join(format!(".{}", new_layer_name(&from.name)));
        fs::rename(src.join("upper"), &aside)
            .and_then(|()| make_roots(&src.join("upper"), roots))
            .map_err(DriverError::io("empty the sandbox's writable layer"))?;
        let _ = sandbox_mcp_sys::fs_tree::remove_tree(&aside);
        Ok(stack)
    }

    /// At start: a stack whose newest layer is still the sandbox's upper (a crash between the
    /// two steps of [`Self::stack`]) gets it moved; then layers no stack names are deleted.
    /// Only the sandbox the layer is made of (its name's prefix) moves anything: its copies
    /// name the same layer over uppers of their own.
    pub(super) fn finish_stacking(&self) {
        for (name, stack) in self.stacks() {
            let Some(top) = stack.first() else { continue };
            let (upper, layer) = (self.dir(&name).join("upper"), self.layer_dir(top));
            if top
                .strip_prefix(name.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
                && !layer.exists()
                && upper.is_dir()
                && let Err(e) = mount_roots(&upper)
                    .and_then(|roots| move_upper(&self.dir(&name), &layer, &roots))
            {
                tracing::warn!(sandbox = %name, "cannot finish making a layer of its files: {e}");
            }
        }
        self.collect_layers();
    }

    /// Deletes every layer no sandbox's or snapshot's stack names.
    pub(super) fn collect_layers(&self) {
        let _guard = sandbox_mcp_sys::lock(&self.stacking);
        let Ok(entries) = fs::read_dir(self.layers_dir()) else {
            return;
        };
        let used: HashSet<String> = self.stacks().into_iter().flat_map(|(_, s)| s).collect();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !used.contains(&name)
                && let Err(e) = sandbox_mcp_sys::fs_tree::remove_tree(&entry.path())
            {
                tracing::warn!(layer = %name, "cannot delete an unused layer: {e}");
            }
        }
    }

    /// Every sandbox's and snapshot's stack (hidden directories are the driver's own).
    fn stacks(&self) -> Vec<(String, Vec<String>)> {
        let Ok(entries) = fs::read_dir(&self.sandboxes_dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                if name.starts_with('.') {
                    return None;
                }
                match read_stack(&e.path()) {
                    Ok(stack) if !stack.is_empty() => Some((name, stack)),
                    Ok(_) => None,
                    Err(err) => {
                        // Its layers cannot be told apart from unused ones: keep them all.
                        tracing::warn!(sandbox = %name, "unreadable stack file: {err}");
                        Some((name, vec![String::from("*")]))
                    }
                }
            })
            .collect()
    }
}

/// Whether process `pid` has a child (any of its threads'). Unknown counts as yes.
fn has_children(pid: i32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().any(|task| {
        fs::read_to_string(task.path().join("children")).map_or(true, |c| !c.trim().is_empty())
    })
}

/// A new layer's name: the sandbox it came from and the time, which no other layer has.
fn new_layer_name(from: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{from}.{now:x}")
}

pub(super) fn read_stack(dir: &Path) -> io::Result<Vec<String>> {
    match fs::read_to_string(dir.join(STACK_FILE)) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let ok = l
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
                    && !l.starts_with('.');
                if ok {
                    Ok(l.to_string())
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{l:?} is not a layer name"),
                    ))
                }
            })
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Replaces `dir`'s stack file in one rename, synced.
fn write_stack(dir: &Path, stack: &[String]) -> io::Result<()> {
    let tmp = dir.join(format!("{STACK_FILE}.tmp"));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(stack.join("\n").as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(STACK_FILE))?;
    sync_dir(dir)
}

/// Moves the sandbox directory `dir`'s upper to `layer`, leaving an empty upper with each
/// overlay's root as it was.
fn move_upper(dir: &Path, layer: &Path, roots: &[Root]) -> io::Result<()> {
    let upper = dir.join("upper");
    match fs::rename(&upper, layer) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new().mode(0o755).create(layer)?
        }
        r => r?,
    }
    make_roots(&upper, roots)
}

/// An overlay's root directory in an upper: a stacked layer cannot pass its owner and mode on
/// (the overlay's root is always the upper's), so a new upper starts with them.
pub(super) struct Root {
    name: std::ffi::OsString,
    mode: u32,
    uid: u32,
    gid: u32,
    /// Nothing written under it.
    empty: bool,
}

fn mount_roots(upper: &Path) -> io::Result<Vec<Root>> {
    use std::os::unix::fs::MetadataExt;
    let entries = match fs::read_dir(upper) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut roots = Vec::new();
    for entry in entries {
        let entry = entry?;
        let meta = fs::symlink_metadata(entry.path())?;
        let empty = meta.is_dir() && fs::read_dir(entry.path())?.next().is_none();
        roots.push(Root {
            name: entry.file_name(),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            empty,
        });
    }
    Ok(roots)
}

fn make_roots(upper: &Path, roots: &[Root]) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o755).create(upper)?;
    for root in roots {
        let dir = upper.join(&root.name);
        fs::DirBuilder::new().mode(0o755).create(&dir)?;
        std::os::unix::fs::lchown(&dir, Some(root.uid), Some(root.gid))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(root.mode))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}
