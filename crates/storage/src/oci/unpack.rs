//! Unpacking one layer tar into its directory, as root on the host while the image is untrusted.
//!
//! Every entry path is normalised lexically (`..` refused); every parent is checked with
//! `symlink_metadata` to be a real directory of this layer; files are created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW`, hard links only to files this layer wrote, and directory modes
//! applied last through `O_NOFOLLOW` descriptors: no symlink is ever followed while writing.
//! Devices are refused, setuid/setgid bits and the image's xattrs dropped, ids clamped to
//! `nobody`; whiteouts become overlayfs's. Sizes count against the limits before data is read,
//! and the uncompressed stream must hash to the layer's `diff_id`.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, FileTimes, OpenOptions, Permissions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tar::EntryType;

use sandbox_mcp_model::ids::hex;
use sandbox_mcp_sys::layers;

use super::archive::{Blob, GZIP_MAGIC, is_tar, read_full};
use super::meter::{MAX_META, Meter};
use super::{ImportError, Limits, corrupt, io_err};

/// Ids at or above `nobody` are clamped to it: they would fall outside the sandbox's id map.
const NOBODY: u64 = 65534;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) entries: u64,
    /// Declared sizes, counted before any data is read.
    declared: u64,
    pub(crate) written: u64,
}

pub(crate) struct Unpacker<'a> {
    root: &'a Path,
    label: &'a str,
    limits: &'a Limits,
    chown: bool,
    totals: &'a mut Totals,
    /// Directories' modes and mtimes, applied once the layer is complete (see `finish_dirs`).
    dirs: Vec<(PathBuf, u32, Option<SystemTime>)>,
    buf: Vec<u8>,
}

impl<'a> Unpacker<'a> {
    pub(crate) fn new(
        root: &'a Path,
        label: &'a str,
        limits: &'a Limits,
        chown: bool,
        totals: &'a mut Totals,
    ) -> Self {
        Unpacker {
            root,
            label,
            limits,
            chown,
            totals,
            // The layer root is 0755 unless the layer says otherwise (`./`).
            dirs: vec![(PathBuf::new(), 0o755, None)],
            buf: vec![0; 256 << 10],
        }
    }
}

impl Unpacker<'_> {
    pub(crate) fn run(mut self, blob: Blob<'_>, diff_id: &str) -> Result<(), ImportError> {
        let label = self.label;
        let mut reader = blob.reader;
        let mut head = [0; 512];
        let n = read_full(&mut reader, &mut head).map_err(corrupt(label))?;
        let head = io::Cursor::new(head[..n].to_vec());
        // Compression is told by magic bytes: media types are often wrong in the wild.
        let stream: Box<dyn Read + '_> = if head.get_ref().starts_with(&GZIP_MAGIC) {
            // Multi-member streams are read whole, as docker's (Go's) gzip reader does.
            Box::new(flate2::read::MultiGzDecoder::new(head.chain(reader)))
        } else if head.get_ref().starts_with(&ZSTD_MAGIC) {
            return Err(ImportError::Zstd {
                layer: label.to_string(),
            });
        } else if is_tar(head.get_ref()) {
            Box::new(head.chain(reader))
        } else {
            return Err(ImportError::Format(format!(
                "{label} is neither a tar archive nor a gzip-compressed one (it starts with {}): \
                 only uncompressed and gzip layers can be imported; re-save the image",
                hex(&head.get_ref()[..n.min(4)])
            )));
        };

        let meter = Meter::new(stream, MAX_META);
        let budget = meter.budget.clone();
        let mut archive = tar::Archive::new(meter);
        for entry in archive.entries().map_err(corrupt(label))? {
            let mut entry = entry.map_err(corrupt(label))?;
            budget.set(entry.size().saturating_add(MAX_META));
            self.entry(&mut entry)?;
        }
        // diff_id covers the whole stream, padding after the end-of-archive marker included.
        let mut meter = archive.into_inner();
        budget.set(MAX_META);
        io::copy(&mut meter, &mut io::sink()).map_err(corrupt(label))?;
        let actual = meter.digest();
        if actual != diff_id {
            return Err(ImportError::Integrity {
                what: label.to_string(),
                problem: format!(
                    "unpacks to {actual}, not to {diff_id}, the diff_id its config gives"
                ),
            });
        }
        self.finish_dirs()
    }

    fn refuse(&self, entry: &str, why: impl Into<String>) -> ImportError {
        ImportError::Unsafe {
            layer: self.label.to_string(),
            entry: entry.to_string(),
            why: why.into(),
        }
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImportError> {
        let label = self.label;
        let header = entry.header();
        let kind = header.entry_type();
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();

        self.totals.entries += 1;
        if self.totals.entries > self.limits.max_files {
            return Err(ImportError::Limit(format!(
                "the image holds more than {} files and directories (the import limit; {label} \
                 passed it): use a smaller image",
                self.limits.max_files
            )));
        }
        // Counted before any data is read, so a 10 GB entry is refused without writing a byte.
        // A sparse file counts at its apparent size: that is what reading it in the sandbox costs.
        let mut size = entry.size();
        if kind.is_gnu_sparse() {
            let real = header.as_gnu().map(|g| g.real_size()).transpose();
            size = size.max(real.map_err(corrupt(label))?.unwrap_or(0));
        }
        self.totals.declared = self.totals.declared.saturating_add(size);
        if self.totals.declared > self.limits.max_bytes {
            return Err(ImportError::Limit(format!(
                "the image holds more than {} of files (the import limit; entry {shown} of {label} \
                 passed it): use a smaller image",
                human(self.limits.max_bytes)
            )));
        }
        // Metadata the tar crate has applied already, or that carries nothing we keep (global
        // PAX records, volume labels).
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) || kind.as_byte() == b'V'
        {
            return Ok(());
        }

        let rel = entry_path(&raw).map_err(|why| self.refuse(&shown, why))?;
        let Some(name) = rel.file_name() else {
            // The image root itself: only its mode (and owner) can be taken.
            return match kind {
                EntryType::Directory => self.dir(header, &rel, &shown),
                _ => Ok(()),
            };
        };
        if let Some(hidden) = name.as_bytes().strip_prefix(b".wh.") {
            // Whiteouts, whatever their entry type (OCI image spec, "Whiteouts").
            return match hidden {
                b".wh..opq" => self.opaque(&rel, &shown),
                // Other `.wh..wh.` names are aufs bookkeeping, as docker skips them.
                h if h.starts_with(b".wh.") => Ok(()),
                b"" | b"." | b".." => Err(self.refuse(&shown, "is a whiteout that names no file")),
                h => self.whiteout(&rel.with_file_name(OsStr::from_bytes(h)), &shown),
            };
        }
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(entry, &rel, &shown)
            }
            EntryType::Directory => self.dir(header, &rel, &shown),
            EntryType::Symlink => self.symlink(entry, &rel, &shown),
            EntryType::Link => self.hard_link(entry, &rel, &shown),
            EntryType::Fifo => self.fifo(header, &rel, &shown),
            EntryType::Char | EntryType::Block => {
                Err(self.refuse(&shown, "is a device node, and images may not carry devices"))
            }
            other => Err(self.refuse(
                &shown,
                format!(
                    "has the tar entry type {:?}, which this importer does not know",
                    other.as_byte() as char
                ),
            )),
        }
    }

    /// Makes every parent of `rel` a real directory of this layer (creating missing ones), then
    /// clears `rel` for the new entry: later entries replace earlier ones, as in docker. Returns
    /// the host path and whether a directory is kept there (only when `dir`).
    fn prepare(
        &mut self,
        rel: &Path,
        shown: &str,
        dir: bool,
    ) -> Result<(PathBuf, bool), ImportError> {
        let mut host = self.root.to_path_buf();
        let mut walked = PathBuf::new();
        for part in rel.parent().into_iter().flat_map(Path::iter) {
            host.push(part);
            walked.push(part);
            match fs::symlink_metadata(&host) {
                Ok(m) if m.is_dir() => {}
                // Writing through a symlink could reach any path on the host.
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.refuse(
                        shown,
                        format!("writes through the symlink {}", walked.display()),
                    ));
                }
                Ok(_) => {
                    return Err(self.refuse(
                        shown,
                        format!(
                            "needs {} to be a directory, but it is not",
                            walked.display()
                        ),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    (fs::DirBuilder::new().mode(0o700))
                        .create(&host)
                        .map_err(io_err(format!("create {}", host.display())))?;
                    // 0755 like docker's, set in `finish_dirs` (mkdir's mode is under the umask).
                    self.dirs.push((walked.clone(), 0o755, None));
                }
                Err(e) => return Err(io_err(format!("read {}", host.display()))(e)),
            }
        }
        let path = self.root.join(rel);
        let cleared = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() && dir => return Ok((path, true)),
            // remove_dir_all does not follow symlinks inside the tree it removes.
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        cleared.map_err(io_err(format!("replace {}", path.display())))?;
        Ok((path, false))
    }

    /// What `rel` is in this layer, reached without passing through a symlink (`None` if it is
    /// missing or only reachable through one).
    fn lookup(&self, rel: &Path) -> Result<Option<fs::FileType>, ImportError> {
        let mut host = self.root.to_path_buf();
        for part in rel.iter() {
            if !fs::symlink_metadata(&host).is_ok_and(|m| m.is_dir()) {
                return Ok(None);
            }
            host.push(part);
        }
        match fs::symlink_metadata(&host) {
            Ok(m) => Ok(Some(m.file_type())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("read {}", host.display()))(e)),
        }
    }

    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ImportError> {
        let (path, _) = self.prepare(rel, shown, false)?;
        let write = || format!("write {}", path.display());
        // O_EXCL fails rather than open whatever is at `path`; O_NOFOLLOW says it twice.
        let mut file = (OpenOptions::new().write(true).create_new(true).mode(0o600))
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err(write()))?;
        let mut len = 0u64;
        loop {
            let n = entry.read(&mut self.buf).map_err(corrupt(self.label))?;
            if n == 0 {
                break;
            }
            let chunk = &self.buf[..n];
            // Zero runs become holes, so sparse files stay sparse on disk.
            let done = if chunk.iter().all(|b| *b == 0) {
                file.seek(SeekFrom::Current(n as i64)).map(drop)
            } else {
                file.write_all(chunk)
            };
            done.map_err(io_err(write()))?;
            len += n as u64;
        }
        if len != entry.size() {
            // The stream ended inside the entry's data.
            return Err(ImportError::Corrupt {
                layer: self.label.to_string(),
                detail: format!(
                    "the data of {shown} ends after {len} of {} bytes",
                    entry.size()
                ),
            });
        }
        file.set_len(len).map_err(io_err(write()))?;
        self.totals.written += len;
        let header = entry.header();
        if self.chown {
            let (uid, gid) = owner(header).map_err(corrupt(self.label))?;
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_err(write()))?;
        }
        // After chown, which clears setuid/setgid anyway.
        let mode = mode(header).map_err(corrupt(self.label))?;
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(io_err(write()))?;
        if let Some(t) = mtime(header) {
            let times = FileTimes::new().set_accessed(t).set_modified(t);
            file.set_times(times).map_err(io_err(write()))?;
        }
        Ok(())
    }

    fn dir(&mut self, header: &tar::Header, rel: &Path, shown: &str) -> Result<(), ImportError> {
        let (path, kept) = self.prepare(rel, shown, true)?;
        let write = || format!("create {}", path.display());
        if !kept {
            // Owner-writable until `finish_dirs`, so its entries can be written.
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(io_err(write()))?;
        }
        self.own(&path, header)?;
        let mode = mode(header).map_err(corrupt(self.label))?;
        self.dirs.push((rel.to_path_buf(), mode, mtime(header)));
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ImportError> {
        let target = entry.link_name_bytes().filter(|t| !t.is_empty());
        let Some(target) = target else {
            return Err(self.refuse(shown, "is a symlink without a target"));
        };
        let (path, _) = self.prepare(rel, shown, false)?;
        // Any target is fine: it resolves inside the sandbox's root, and nothing here follows it.
        std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
            .map_err(io_err(format!("create {}", path.display())))?;
        self.own(&path, entry.header())
    }

    fn hard_link<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ImportError> {
        let raw = entry.link_name_bytes().unwrap_or_default();
        let target_shown = String::from_utf8_lossy(&raw).into_owned();
        let target = entry_path(&raw).map_err(|why| {
            self.refuse(
                shown,
                format!("is a hard link to {target_shown}, which {why}"),
            )
        })?;
        if target == rel {
            return Ok(());
        }
        let (path, _) = self.prepare(rel, shown, false)?;
        // Only a file this layer wrote: a link to anything else could pull a host file (or one
        // reached through a symlink) into the image.
        if !self.lookup(&target)?.is_some_and(|t| t.is_file()) {
            return Err(self.refuse(
                shown,
                format!("is a hard link to {target_shown}, which is not a file of this layer"),
            ));
        }
        // std's hard_link is linkat without AT_SYMLINK_FOLLOW.
        fs::hard_link(self.root.join(&target), &path)
            .map_err(io_err(format!("create {}", path.display())))
    }

    fn fifo(&mut self, header: &tar::Header, rel: &Path, shown: &str) -> Result<(), ImportError> {
        let (path, _) = self.prepare(rel, shown, false)?;
        let write = || format!("create {}", path.display());
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| io_err(write())(e.into()))?;
        self.own(&path, header)?;
        // `path` is the FIFO just made and its parents real directories: chmod follows nothing.
        let mode = mode(header).map_err(corrupt(self.label))?;
        fs::set_permissions(&path, Permissions::from_mode(mode)).map_err(io_err(write()))
    }

    /// `dir/.wh.NAME`: an overlayfs whiteout (a 0:0 character device, which the kernel lets
    /// anyone make since 5.8) hides NAME of the layers below.
    fn whiteout(&mut self, rel: &Path, shown: &str) -> Result<(), ImportError> {
        let (path, _) = self.prepare(rel, shown, false)?;
        layers::whiteout(&path).map_err(io_err(format!("create the whiteout {}", path.display())))
    }

    /// `dir/.wh..wh..opq`: `dir` hides everything below it in lower layers. overlayfs mounted
    /// with `userxattr` reads `user.overlay.opaque`.
    fn opaque(&mut self, rel: &Path, shown: &str) -> Result<(), ImportError> {
        // Creates the marker's parents, `dir` included.
        self.prepare(rel, shown, false)?;
        let dir = self.root.join(rel.parent().unwrap_or(Path::new("")));
        layers::mark_opaque(&dir).map_err(io_err(format!(
            "mark {} opaque (the filesystem under the work dir must support user xattrs)",
            dir.display()
        )))
    }

    fn own(&self, path: &Path, header: &tar::Header) -> Result<(), ImportError> {
        if !self.chown {
            return Ok(());
        }
        let (uid, gid) = owner(header).map_err(corrupt(self.label))?;
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(io_err(format!("chown {}", path.display())))
    }

    /// Applies directory modes and mtimes last: a read-only directory (0555) would otherwise stop
    /// an unprivileged engine writing its entries, and each entry written bumps its mtime. Later
    /// entries win; children go before parents; a directory a later entry replaced is skipped, and
    /// each is opened with O_NOFOLLOW, so no chmod lands through a symlink.
    fn finish_dirs(&mut self) -> Result<(), ImportError> {
        let mut seen = HashSet::new();
        for (rel, mode, mtime) in std::mem::take(&mut self.dirs).into_iter().rev() {
            if !seen.insert(rel.clone()) || !self.lookup(&rel)?.is_some_and(|t| t.is_dir()) {
                continue;
            }
            let path = self.root.join(&rel);
            let write = || format!("set the mode of {}", path.display());
            let dir = (OpenOptions::new().read(true))
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io_err(write()))?;
            dir.set_permissions(Permissions::from_mode(mode))
                .map_err(io_err(write()))?;
            if let Some(t) = mtime {
                let times = FileTimes::new().set_accessed(t).set_modified(t);
                dir.set_times(times).map_err(io_err(write()))?;
            }
        }
        Ok(())
    }
}

/// An entry path relative to the layer root: `./` and `/` prefixes stripped (an absolute name
/// means the same file of the image root), `.` and empty components dropped; any `..` refused,
/// since nothing may be reached outside the layer.
fn entry_path(raw: &[u8]) -> Result<PathBuf, &'static str> {
    let mut path = PathBuf::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("leaves the image root"),
            part if part.contains(&0) => return Err("has a NUL byte in its name"),
            part => path.push(OsStr::from_bytes(part)),
        }
    }
    Ok(path)
}

/// The permission bits kept: setuid and setgid are dropped (a setuid binary would be a way up
/// for whoever runs in the sandbox); sticky stays.
fn mode(header: &tar::Header) -> io::Result<u32> {
    Ok(header.mode()? & 0o1777)
}

fn owner(header: &tar::Header) -> io::Result<(u32, u32)> {
    let clamp = |id: u64| id.min(NOBODY) as u32;
    Ok((clamp(header.uid()?), clamp(header.gid()?)))
}

fn mtime(header: &tar::Header) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(header.mtime().ok()?))
}

fn human(n: u64) -> String {
    for (unit, name) in [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{} {name}", n / unit);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
