//! The fake's storage: plain directories copied file by file. A sandbox's filesystem is one
//! layer (its directory, as the upper of an overlay with no lowers), so captures, clones,
//! restores and diffs all work on what its agent wrote.

use std::path::{Path, PathBuf};

use sandbox_mcp_model::driver::{
    CloneKind, CloneMethod, DriverError, FsLayers, FsRef, Storage, TemplateLayout,
};

use super::{FakeDriver, NAME, lock};

impl Storage for FakeDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn disk_bytes(&self, id: &str) -> u64 {
        size_of(&self.inner.sandbox_dir(id))
    }

    fn capture(
        &self,
        id: &str,
        _slot: u32,
        _targets: &[String],
        dest: &Path,
    ) -> Result<u64, DriverError> {
        copy_tree(&self.inner.sandbox_dir(id), dest)
            .map_err(DriverError::io("capture the sandbox's files"))
    }

    fn clone_fs(
        &self,
        from: &FsRef,
        to: &str,
        kind: CloneKind,
    ) -> Result<CloneMethod, DriverError> {
        self.use_up_clone(to)?;
        let dest = match kind {
            CloneKind::Snapshot => self.inner.snapshot_dir(to),
            CloneKind::Sandbox { .. } => self.inner.sandbox_dir(to),
        };
        let made = copy_tree(&self.fs_dir(from), &dest);
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&dest);
            return Err(DriverError::io("copy the sandbox's files")(e));
        }
        Ok(CloneMethod::Copy)
    }

    fn replace_fs(
        &self,
        id: &str,
        from: &FsRef,
        _limit_bytes: u64,
    ) -> Result<CloneMethod, DriverError> {
        self.use_up_clone(id)?;
        let dir = self.inner.sandbox_dir(id);
        // Copied beside it, then swapped in with renames: the old files go only once the new
        // ones are complete.
        let new = dir.with_file_name(format!(".{id}.new"));
        let old = dir.with_file_name(format!(".{id}.old"));
        let _ = std::fs::remove_dir_all(&new);
        copy_tree(&self.fs_dir(from), &new)
            .map_err(DriverError::io("copy the snapshot's files"))?;
        std::fs::rename(&dir, &old).map_err(DriverError::io("move the sandbox's files aside"))?;
        std::fs::rename(&new, &dir).map_err(DriverError::io("put the copied files in place"))?;
        let _ = std::fs::remove_dir_all(&old);
        Ok(CloneMethod::Copy)
    }

    fn remove_fs(&self, name: &str) -> Result<(), DriverError> {
        match std::fs::remove_dir_all(self.inner.snapshot_dir(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(DriverError::io("remove the snapshot's files")(e))
            }
            _ => Ok(()),
        }
    }

    fn fs_layers(&self, fs: &FsRef, _template: &TemplateLayout) -> Result<FsLayers, DriverError> {
        Ok(FsLayers {
            mounts: vec![("/".to_string(), self.fs_dir(fs), Vec::new())],
            id_base: None,
            stacked: 0,
        })
    }
}

impl FakeDriver {
    /// The directory of a sandbox's filesystem (`slot` given) or a snapshot's.
    fn fs_dir(&self, fs: &FsRef) -> PathBuf {
        match fs.slot {
            Some(_) => self.inner.sandbox_dir(&fs.name),
            None => self.inner.snapshot_dir(&fs.name),
        }
    }

    /// Counts a clone against [`FakeDriver::fail_clone_after`]: the error when it is the one
    /// to fail.
    fn use_up_clone(&self, to: &str) -> Result<(), DriverError> {
        let mut state = lock(&self.inner.state);
        match &mut state.clones_left {
            Some(0) => {
                state.clones_left = None;
                Err(DriverError::Io {
                    what: "copy the sandbox's files",
                    source: std::io::Error::other(format!(
                        "the fake driver was told to fail this clone (to {to})"
                    )),
                })
            }
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// Copies the tree at `from` (missing: an empty one) to `to`, which must not exist. Returns
/// the bytes of file content copied.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<u64> {
    std::fs::create_dir_all(to)?;
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(0);
    };
    let mut bytes = 0;
    for entry in entries {
        let entry = entry?;
        let kind = entry.file_type()?;
        let dest = to.join(entry.file_name());
        if kind.is_dir() {
            bytes += copy_tree(&entry.path(), &dest)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &dest)?;
        } else if kind.is_file() {
            bytes += std::fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(bytes)
}

/// Bytes of the files under `dir`.
fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size_of(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
