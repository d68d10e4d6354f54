//! Where the namespaces driver keeps sandboxes' files (a btrfs store, or plain directories) and
//! what the engine does with them from outside: measure, capture, snapshot, fork, restore, diff.

use super::*;

impl Storage for NamespacesDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn create_volume(&self, key: &str, quota_bytes: Option<u64>) -> Result<(), DriverError> {
        let parent = self.volumes_dir();
        // Only the engine reaches volumes by path: sandboxes get them as mounts.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parent)
            .map_err(DriverError::io("create the volumes directory"))?;
        let made = match quota_bytes {
            Some(limit) => disk::create_dir(&self.store, &parent, key, limit),
            None => disk::create_dir(&disk::Store::Plain(String::new()), &parent, key, 0),
        };
        made.map_err(DriverError::io("create the volume"))?;
        // Everyone inside may write it (a template's user as much as its root), as /tmp.
        fs::set_permissions(self.volume_dir(key), fs::Permissions::from_mode(0o1777))
            .map_err(DriverError::io("set the volume's mode"))
    }

    fn copy_volume(
        &self,
        from: &str,
        to: &str,
        quota_bytes: Option<u64>,
    ) -> Result<(), DriverError> {
        let parent = self.volumes_dir();
        // A btrfs volume (a subvolume with its quota) is snapshotted, writable; a plain one
        // copied, exactly. (Without a limit the store's snapshot would be read-only.)
        let snapped = match quota_bytes {
            Some(limit) => disk::snapshot(&self.store, &parent, from, to, Some(limit))
                .map_err(DriverError::io("snapshot the volume"))?,
            None => false,
        };
        if !snapped {
            sandbox_mcp_sys::layers::copy_tree(
                &self.volume_dir(from),
                &self.volume_dir(to),
                sandbox_mcp_sys::layers::Owners::Same,
            )
            .map_err(DriverError::io("copy the volume"))?;
        }
        Ok(())
    }

    fn refill_volume(&self, key: &str, from: &str) -> Result<(), DriverError> {
        let (dir, source) = (self.volume_dir(key), self.volume_dir(from));
        if !source.is_dir() {
            return Ok(());
        }
        let emptied = fs::read_dir(&dir).and_then(|entries| {
            entries
                .into_iter()
                .try_for_each(|e| sandbox_mcp_sys::fs_tree::remove_tree(&e?.path()))
        });
        emptied.map_err(DriverError::io("empty the volume"))?;
        sandbox_mcp_sys::layers::copy_tree(&source, &dir, sandbox_mcp_sys::layers::Owners::Same)
            .map_err(DriverError::io("put the volume's files back"))?;
        Ok(())
    }

    fn volume_bytes(&self, key: &str) -> u64 {
        sandbox_mcp_sys::fs_tree::disk_usage(&self.volume_dir(key), 1_000_000)
    }

    fn remove_volume(&self, key: &str) -> Result<(), DriverError> {
        if !self.volume_dir(key).exists() {
            return Ok(());
        }
        disk::remove_dir(&self.store, &self.volumes_dir(), key)
            .map_err(DriverError::io("delete the volume"))
    }

    fn capture(
        &self,
        id: &str,
        slot: u32,
        targets: &[String],
        dest: &std::path::Path,
    ) -> Result<u64, DriverError> {
        let dir = self.dir(id);
        // Each overlay's own files: its stacked layers, bottom first, then its upper.
        let uppers = targets
            .iter()
            .map(|t| {
                let mut trees = self.stacked_dirs(id, t)?;
                trees.reverse();
                trees.push(plan::upper_dir(&dir, t));
                Ok((plan::layer_name(t), trees))
            })
            .collect::<io::Result<Vec<(String, Vec<PathBuf>)>>>()
            .map_err(DriverError::io("read the sandbox's layers"))?;
        // As root the upper holds the sandbox's host ids; a layer holds the ids it saw.
        let owners = match self.disk_ids(&FsRef {
            name: id.to_string(),
            slot: Some(slot),
        }) {
            Some(base) => sandbox_mcp_sys::layers::Owners::Shift {
                base,
                count: plan::MAPPED_IDS,
            },
            None => sandbox_mcp_sys::layers::Owners::Keep,
        };
        sandbox_mcp_sys::layers::capture(&uppers, dest, owners)
            .map_err(tree_error("copy the sandbox's files into a layer"))
    }

    fn clone_fs(
        &self,
        from: &FsRef,
        to: &str,
        kind: CloneKind,
    ) -> Result<CloneMethod, DriverError> {
        let limit = match kind {
            CloneKind::Snapshot => None,
            CloneKind::Sandbox { limit_bytes } => Some(limit_bytes),
        };
        if self.snapshot_tree(from, to, limit)? {
            return Ok(CloneMethod::Snapshot);
        }
        let parent = &self.sandboxes_dir;
        let made = match limit {
            None => fs::DirBuilder::new().mode(0o700).create(self.dir(to)),
            Some(limit) => disk::create_dir(&self.store, parent, to, limit),
        };
        made.map_err(DriverError::io("create the copy's directory"))?;
        if let Err(e) = self.copy_fs(from, to) {
            let _ = disk::remove_dir(&self.store, parent, to);
            return Err(match e.kind() {
                io::ErrorKind::InvalidData => DriverError::Unsupported(e.to_string()),
                _ => DriverError::io("copy the sandbox's files")(e),
            });
        }
        // A stacked snapshot has no files of its own: its layers were shared, nothing copied.
        let stacked_only = !self.dir(&from.name).join("upper").exists()
            && self.dir(to).join(stack::STACK_FILE).exists();
        Ok(if stacked_only {
            CloneMethod::Layers
        } else {
            CloneMethod::Copy
        })
    }

    fn replace_fs(
        &self,
        id: &str,
        from: &FsRef,
        limit_bytes: u64,
    ) -> Result<CloneMethod, DriverError> {
        let parent = &self.sandboxes_dir;
        let new = format!("{id}{NEW_SUFFIX}");
        let _ = disk::remove_dir(&self.store, parent, &new);
        if let Store::Btrfs = self.store {
            // The old tree is renamed aside and the snapshot made under the sandbox's name: the
            // snapshot's own transaction commit makes the rename durable with it. Swapping two
            // names instead needs a second commit (a directory fsync after renaming subvolumes
            // commits the whole transaction: ~10 ms here). A crash before that commit leaves the
            // old tree, under its name or aside, which the next engine start puts back.
            fs::rename(self.dir(id), self.dir(&new))
                .map_err(DriverError::io("put the sandbox's files aside"))?;
            let put_back = || fs::rename(self.dir(&new), self.dir(id));
            match self.snapshot_tree(from, id, Some(limit_bytes)) {
                Ok(true) => {
                    if let Err(e) = disk::remove_dir(&self.store, parent, &new) {
                        tracing::warn!(sandbox = %id, "cannot delete the replaced files: {e}");
                    }
                    return Ok(CloneMethod::Snapshot);
                }
                // Not a subvolume (made before the store was): copied below.
                Ok(false) => {
                    put_back().map_err(DriverError::io("put the sandbox's files back in place"))?
                }
                Err(e) => {
                    put_back().map_err(DriverError::io("put the sandbox's files back in place"))?;
                    return Err(e);
                }
            }
        }
        let method = self.clone_fs(from, &new, CloneKind::Sandbox { limit_bytes })?;
        if let Err(e) = disk::exchange(parent, id, &new) {
            let _ = disk::remove_dir(&self.store, parent, &new);
            return Err(DriverError::io("put the copied files in place")(e));
        }
        // `new` now names the old tree.
        if let Err(e) = disk::remove_dir(&self.store, parent, &new) {
            tracing::warn!(sandbox = %id, "cannot delete the replaced files: {e}");
        }
        self.collect_layers();
        Ok(method)
    }

    fn can_stack(&self, from: &FsRef) -> bool {
        self.stackable(from)
    }

    fn can_stack_stopped(&self, from: &FsRef) -> bool {
        self.stackable_files(from)
    }

    fn stack_fs(
        &self,
        from: &FsRef,
        to: &[(String, CloneKind)],
    ) -> Result<Option<CloneMethod>, DriverError> {
        self.stack(from, to)
    }

    fn remove_fs(&self, name: &str) -> Result<(), DriverError> {
        disk::remove_dir(&self.store, &self.sandboxes_dir, name)
            .map_err(DriverError::io("delete the snapshot's files"))?;
        self.collect_layers();
        // The copies of volumes the snapshot kept (`<snapshot>.<index>`) go with it.
        let prefix = format!("{name}.");
        let kept = fs::read_dir(self.volumes_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix));
        for e in kept {
            let key = e.file_name().to_string_lossy().into_owned();
            self.remove_volume(&key)?;
        }
        Ok(())
    }

    fn disk_charge(&self, id: &str) -> Option<u64> {
        match self.store {
            Store::Btrfs => disk::simple_quota_bytes(&self.dir(id)),
            Store::Plain(_) => None,
        }
    }

    fn fs_layers(&self, fs: &FsRef, template: &TemplateLayout) -> Result<FsLayers, DriverError> {
        let dir = self.dir(&fs.name);
        let stacked = self
            .stack_of(&fs.name)
            .map_err(DriverError::io("read the sandbox's layers"))?;
        let mounts = template
            .mounts
            .iter()
            .map(|m| {
                let mut lowers = self.stacked_dirs(&fs.name, &m.target)?;
                lowers.extend(m.lowers.iter().cloned());
                Ok((m.target.clone(), plan::upper_dir(&dir, &m.target), lowers))
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(DriverError::io("read the sandbox's layers"))?;
        Ok(FsLayers {
            mounts,
            id_base: self.disk_ids(fs),
            stacked: stacked.len(),
        })
    }

    fn disk_bytes(&self, id: &str) -> u64 {
        // Its layers count in full for each sandbox that stacks on them: what it would take
        // alone, as its copies would have.
        sandbox_mcp_sys::fs_tree::disk_usage(&self.dir(id).join("upper"), 1_000_000)
            .saturating_add(self.stacked_bytes(id))
    }

    /// The first alone (it writes down the ids of the parent's files once), the rest side by
    /// side: btrfs commits snapshots made together in one transaction.
    fn clone_many(&self, from: &FsRef, to: &[(String, u64)]) -> Result<CloneMethod, DriverError> {
        let clone = |(child, limit_bytes): &(String, u64)| {
            self.clone_fs(
                from,
                child,
                CloneKind::Sandbox {
                    limit_bytes: *limit_bytes,
                },
            )
        };
        let Some((first, rest)) = to.split_first() else {
            return Ok(CloneMethod::Snapshot);
        };
        let method = clone(first)?;
        std::thread::scope(|scope| {
            let copies: Vec<_> = rest.iter().map(|t| scope.spawn(move || clone(t))).collect();
            for copy in copies {
                copy.join().map_err(|_| {
                    DriverError::Agent("a copy of the parent's files panicked".into())
                })??;
            }
            Ok(method)
        })
    }
}
