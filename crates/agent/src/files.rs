//! File operations, run by the agent inside the sandbox's own root.
//!
//! Nothing here has to defend the host: the agent's `/` is the sandbox's root, so `..`, absolute
//! symlinks and `/proc/self/root` all resolve inside the sandbox. What these functions do defend
//! is the engine and the model: bounded sizes, no blocking on FIFOs or devices, symlinks never
//! followed when deleting or zipping, atomic replacement, and clear errors.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use super::accounts::{self, Account};
use super::safe_open;
use super::spawn::default_cwd;
use super::xattrs;
use sandbox_mcp_protocol::{
    AgentError, Delete, Deleted, ErrorKind, FileData, Move, Moved, ReadFile, WriteFile, Written,
    Zip, ZipDir,
};

const MAX_PATH: usize = 4096;
/// Most skipped paths reported by a zip.
const MAX_SKIPPED: usize = 100;

type Result<T> = std::result::Result<T, AgentError>;

pub(crate) fn fail(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError::new(kind, message)
}

/// Maps an I/O error on `path` to an agent error with a useful message.
pub(crate) fn io_fail(e: &io::Error, path: &Path, action: &str) -> AgentError {
    let p = path.display();
    match e.kind() {
        io::ErrorKind::NotFound => fail(ErrorKind::NotFound, format!("{p} does not exist")),
        io::ErrorKind::PermissionDenied => fail(
            ErrorKind::PermissionDenied,
            format!("permission denied: cannot {action} {p}"),
        ),
        _ => match e.raw_os_error() {
            Some(libc::ENAMETOOLONG) => fail(
                ErrorKind::InvalidArgument,
                format!(
                    "a name in {} is too long (the limit is 255 bytes per name)",
                    short(&p.to_string())
                ),
            ),
            Some(libc::EROFS) => fail(
                ErrorKind::PermissionDenied,
                format!("{p} is on a read-only filesystem"),
            ),
            Some(libc::ENOTDIR) => fail(
                ErrorKind::InvalidArgument,
                format!("a parent of {p} is not a directory"),
            ),
            Some(libc::EISDIR) => fail(ErrorKind::Conflict, format!("{p} is a directory")),
            Some(libc::ENOTEMPTY) => {
                fail(ErrorKind::Conflict, format!("directory {p} is not empty"))
            }
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => fail(
                ErrorKind::DiskFull,
                format!("the sandbox's disk is full: cannot {action} {p}"),
            ),
            Some(libc::ELOOP) => fail(
                ErrorKind::InvalidArgument,
                format!("too many levels of symbolic links in {p}"),
            ),
            _ => fail(ErrorKind::Io, format!("cannot {action} {p}: {e}")),
        },
    }
}

/// Like [`io_fail`], but a special file gets its own message.
fn special_or_io(e: &io::Error, path: &Path, action: &str) -> AgentError {
    if e.kind() == io::ErrorKind::InvalidInput {
        fail(ErrorKind::InvalidArgument, e.to_string())
    } else if e.raw_os_error() == Some(libc::ENXIO) {
        // Opening a unix socket (or a device with no driver behind it).
        fail(
            ErrorKind::InvalidArgument,
            format!(
                "{} is not a regular file (a socket or device)",
                path.display()
            ),
        )
    } else {
        io_fail(e, path, action)
    }
}

fn short(s: &str) -> String {
    if s.len() > 80 {
        let mut end = 80;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s.to_string()
    }
}

/// Resolves a request path: relative to /root, lexically normalized (so the reported path is
/// what a person would expect). Symlinks are left to the kernel, which resolves them inside the
/// sandbox.
pub fn resolve(path: &str) -> Result<PathBuf> {
    if path.is_empty() {
        return Err(fail(ErrorKind::InvalidArgument, "path is empty"));
    }
    if path.contains('\0') {
        return Err(fail(ErrorKind::InvalidArgument, "path contains a NUL byte"));
    }
    if path.len() > MAX_PATH {
        return Err(fail(
            ErrorKind::InvalidArgument,
            format!("path is {} bytes long; the limit is {MAX_PATH}", path.len()),
        ));
    }
    let joined = Path::new(default_cwd()).join(path);
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(c) => out.push(c),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

pub fn read_file(ReadFile { path, max_bytes }: ReadFile) -> Result<FileData> {
    let path = resolve(&path)?;
    if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
        return Err(fail(
            ErrorKind::InvalidArgument,
            format!(
                "{} is a directory; list it with sandbox_files_list",
                path.display()
            ),
        ));
    }
    // Never blocks: a FIFO or device is refused on the open descriptor.
    let file = safe_open::read(&path).map_err(|e| special_or_io(&e, &path, "read"))?;
    let meta = file.metadata().map_err(|e| io_fail(&e, &path, "read"))?;
    if meta.len() > max_bytes {
        return Err(fail(
            ErrorKind::PayloadTooLarge,
            format!(
                "{} is {} bytes; files_read returns at most {} bytes",
                path.display(),
                meta.len(),
                max_bytes
            ),
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    // The file may grow while it is read: never read past the limit.
    file.take(max_bytes + 1)
        .read_to_end(&mut data)
        .map_err(|e| io_fail(&e, &path, "read"))?;
    if data.len() as u64 > max_bytes {
        return Err(fail(
            ErrorKind::PayloadTooLarge,
            format!(
                "{} grew past {max_bytes} bytes while being read",
                path.display()
            ),
        ));
    }
    Ok(FileData {
        path: path.display().to_string(),
        size: data.len() as u64,
        data_b64: B64.encode(&data),
    })
}

pub fn write_file(
    WriteFile {
        path,
        data_b64,
        owner,
        metadata,
    }: WriteFile,
) -> Result<Written> {
    let path = resolve(&path)?;
    let owner = owner.as_deref().map(accounts::lookup).transpose()?;
    let metadata = xattrs::checked(metadata)?;
    let data = B64.decode(data_b64).map_err(|e| {
        fail(
            ErrorKind::InvalidArgument,
            format!("content is not valid base64: {e}"),
        )
    })?;
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(fail(ErrorKind::InvalidArgument, "cannot write to /"));
    };
    make_dirs(parent, owner.as_ref())?;
    let mode = match fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(fail(
                ErrorKind::Conflict,
                format!(
                    "{} is a directory; choose a file path inside it",
                    path.display()
                ),
            ));
        }
        Ok(m) if m.is_file() => m.permissions().mode() & 0o7777,
        _ => 0o644,
    };
    // Write beside the target and rename over it: readers see the old file or the new one. Not
    // `durable::write_atomically`: the path is the sandbox's, so the temporary file is made
    // through `safe_open` (never following a link the sandbox planted) under a name of its own.
    let tmp = parent.join(format!(
        ".{}.sandbox-mcp-{}",
        name.to_string_lossy().chars().take(100).collect::<String>(),
        std::process::id() as u64 ^ nanos()
    ));
    let write = || -> io::Result<()> {
        let mut f = safe_open::create_new(&tmp, mode)?;
        if let Some(a) = &owner {
            std::os::unix::fs::fchown(&f, Some(a.uid), Some(a.gid))?;
        }
        xattrs::set(&f, &metadata)?;
        f.write_all(&data)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        // Make the rename itself durable.
        safe_open::dir(parent)?.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        // The directory exists but refuses new files: a special or read-only filesystem
        // (/proc, /sys, /dev), not a missing path.
        if matches!(
            e.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
        ) && parent.is_dir()
        {
            return Err(fail(
                ErrorKind::PermissionDenied,
                format!(
                    "permission denied: cannot create files in {}",
                    parent.display()
                ),
            ));
        }
        return Err(io_fail(&e, &path, "write"));
    }
    Ok(Written {
        path: path.display().to_string(),
        size: data.len() as u64,
    })
}

/// Makes `dir` with its missing parents; those it makes belong to `owner` when one is named.
fn make_dirs(dir: &Path, owner: Option<&Account>) -> Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| fs::symlink_metadata(d).is_err()) {
        missing.push(d);
        at = d.parent();
    }
    fs::create_dir_all(dir).map_err(|e| io_fail(&e, dir, "create directory"))?;
    if let Some(a) = owner {
        for d in missing.iter().rev() {
            std::os::unix::fs::lchown(d, Some(a.uid), Some(a.gid))
                .map_err(|e| io_fail(&e, d, "give to its owner"))?;
        }
    }
    Ok(())
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Checks that `dir` is an existing directory before `action` (`list`, `zip`, `watch`); `hint`
/// says what to do with a file instead.
pub(crate) fn existing_dir(dir: &Path, action: &str, hint: &str) -> Result<()> {
    let meta = fs::metadata(dir).map_err(|e| io_fail(&e, dir, action))?;
    if !meta.is_dir() {
        return Err(fail(
            ErrorKind::InvalidArgument,
            format!("{} is not a directory; {hint}", dir.display()),
        ));
    }
    Ok(())
}

pub fn delete(Delete { path, recursive }: Delete) -> Result<Deleted> {
    let path = resolve(&path)?;
    if path == Path::new("/") {
        return Err(fail(
            ErrorKind::InvalidArgument,
            "refusing to delete / ; kill the sandbox instead (sandbox_kill)",
        ));
    }
    let meta = fs::symlink_metadata(&path).map_err(|e| io_fail(&e, &path, "delete"))?;
    let result = if meta.is_dir() {
        if recursive {
            // Iterative, never following symlinks: sandbox code may have built it 15 000 deep.
            sandbox_mcp_sys::fs_tree::remove_tree(&path)
        } else {
            fs::remove_dir(&path)
        }
    } else {
        fs::remove_file(&path)
    };
    result.map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTEMPTY) {
            fail(
                ErrorKind::Conflict,
                format!("directory {} is not empty", path.display()),
            )
        } else {
            io_fail(&e, &path, "delete")
        }
    })?;
    Ok(Deleted {
        path: path.display().to_string(),
    })
}

pub fn rename(Move { from, to }: Move) -> Result<Moved> {
    let from = resolve(&from)?;
    let to = resolve(&to)?;
    fs::symlink_metadata(&from).map_err(|e| io_fail(&e, &from, "move"))?;
    if to.starts_with(&from) && to != from {
        return Err(fail(
            ErrorKind::InvalidArgument,
            format!("cannot move {} into itself", from.display()),
        ));
    }
    if let Some(parent) = to.parent()
        && !parent.is_dir()
    {
        return Err(fail(
            ErrorKind::NotFound,
            format!(
                "the destination directory {} does not exist; create it first",
                parent.display()
            ),
        ));
    }
    match fs::rename(&from, &to) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => move_across(&from, &to)?,
        Err(e) => return Err(io_fail(&e, &from, "move")),
    }
    Ok(Moved {
        from: from.display().to_string(),
        to: to.display().to_string(),
    })
}

/// A move between filesystems inside the sandbox (to /dev/shm, say): a regular file is copied
/// beside the destination and renamed over it, then the source is removed. Neither end is ever
/// opened as anything but a regular file, so a FIFO on either side cannot block the agent.
fn move_across(from: &Path, to: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(from).map_err(|e| io_fail(&e, from, "move"))?;
    if meta.is_dir() {
        return Err(fail(
            ErrorKind::Conflict,
            "cannot move a directory across filesystems; copy it with sandbox_exec (cp -a) instead",
        ));
    }
    if !meta.is_file() {
        return Err(fail(
            ErrorKind::InvalidArgument,
            format!(
                "{} is not a regular file; only files move across filesystems (use sandbox_exec with mv)",
                from.display()
            ),
        ));
    }
    let (Some(parent), Some(name)) = (to.parent(), to.file_name()) else {
        return Err(fail(ErrorKind::InvalidArgument, "cannot move onto /"));
    };
    let tmp = parent.join(format!(
        ".{}.sandbox-mcp-{}",
        name.to_string_lossy().chars().take(100).collect::<String>(),
        std::process::id() as u64 ^ nanos()
    ));
    let copy = || -> io::Result<()> {
        let mut src = safe_open::read(from)?;
        let mut dst = safe_open::create_new(&tmp, meta.permissions().mode() & 0o7777)?;
        io::copy(&mut src, &mut dst)?;
        dst.sync_all()?;
        fs::rename(&tmp, to)
    };
    if let Err(e) = copy() {
        let _ = fs::remove_file(&tmp);
        return Err(special_or_io(&e, to, "move"));
    }
    fs::remove_file(from).map_err(|e| io_fail(&e, from, "move"))
}

pub(crate) fn zip_dir(ZipDir { path, max_bytes }: ZipDir) -> Result<Zip> {
    use zip::write::SimpleFileOptions;

    let root = resolve(&path)?;
    existing_dir(&root, "zip", "read single files with sandbox_files_read")?;
    let too_large = |files: u64| {
        fail(
            ErrorKind::PayloadTooLarge,
            format!(
                "the zip of {} exceeds {max_bytes} bytes (after {files} files)",
                root.display()
            ),
        )
    };
    let mut writer = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(false);
    let mut files = 0u64;
    let mut skipped = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let Ok(read) = fs::read_dir(&dir) else {
            continue;
        };
        let mut children: Vec<_> = read.flatten().collect();
        children.sort_by_key(|e| e.file_name());
        for entry in children {
            let rel_child = rel.join(entry.file_name());
            let name = rel_child.to_string_lossy().into_owned();
            // symlink_metadata: a symlink is recorded as skipped, never followed.
            let Ok(m) = entry.path().symlink_metadata() else {
                continue;
            };
            let ft = m.file_type();
            if ft.is_dir() {
                writer
                    .add_directory(format!("{name}/"), options)
                    .map_err(|e| fail(ErrorKind::Io, format!("zip: {e}")))?;
                stack.push(rel_child);
            } else if ft.is_file() {
                // The file may have become a FIFO since it was listed: never block on it.
                let Ok(mut f) = safe_open::read(&entry.path()) else {
                    if skipped.len() < MAX_SKIPPED {
                        skipped.push(name);
                    }
                    continue;
                };
                writer
                    .start_file(name, options.unix_permissions(m.mode() & 0o777))
                    .map_err(|e| fail(ErrorKind::Io, format!("zip: {e}")))?;
                // Copy in chunks and check the size as it grows: memory stays near the limit
                // even for a huge incompressible file.
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    let n = f
                        .read(&mut chunk)
                        .map_err(|e| io_fail(&e, &entry.path(), "zip"))?;
                    if n == 0 {
                        break;
                    }
                    writer
                        .write_all(&chunk[..n])
                        .map_err(|e| fail(ErrorKind::Io, format!("zip: {e}")))?;
                    if writer.get_ref().map_or(0, |c| c.get_ref().len()) as u64 > max_bytes {
                        return Err(too_large(files));
                    }
                }
                files += 1;
            } else if skipped.len() < MAX_SKIPPED {
                skipped.push(name);
            }
        }
    }
    let data = writer
        .finish()
        .map_err(|e| fail(ErrorKind::Io, format!("zip: {e}")))?
        .into_inner();
    if data.len() as u64 > max_bytes {
        return Err(too_large(files));
    }
    Ok(Zip {
        path: root.display().to_string(),
        zip_bytes: data.len() as u64,
        zip_b64: B64.encode(&data),
        files,
        skipped,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn resolve_normalizes_inside_root() {
        let p = |s: &str| resolve(s).ok().map(|p| p.display().to_string());
        assert_eq!(p("a/b").as_deref(), Some("/root/a/b"));
        assert_eq!(p("/etc/../etc/passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(p("../../../../etc").as_deref(), Some("/etc"));
        assert_eq!(p("/..").as_deref(), Some("/"));
        assert!(resolve("a\0b").is_err());
        assert!(resolve("").is_err());
        assert!(resolve(&"x".repeat(5000)).is_err());
    }
}
