//! The fake agent's file requests, on the sandbox's directory: a path resolves as the real
//! agent resolves it (relative ones from the working directory, `..` stopping at `/`), then
//! lands under the directory instead of the sandbox's root.

use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use sandbox_mcp_protocol::{
    AgentError, Delete, Deleted, Dir, DirEntry, ErrorKind, FileData, FileKind, ListDir, Move,
    Moved, ReadFile, WriteFile, Written,
};

use super::AgentContext;

type Result<T> = std::result::Result<T, AgentError>;

/// `path` as the sandbox sees it (absolute, normalized) from `cwd`.
pub(crate) fn in_sandbox(cwd: &str, path: &str) -> Result<String> {
    if path.is_empty() || path.contains('\0') {
        return Err(AgentError::new(
            ErrorKind::InvalidArgument,
            "path is empty or contains a NUL byte",
        ));
    }
    let mut parts: Vec<String> = Vec::new();
    for component in Path::new(cwd).join(path).components() {
        match component {
            Component::ParentDir => {
                parts.pop();
            }
            Component::Normal(c) => parts.push(c.to_string_lossy().into_owned()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Where the sandbox path `path` (from `cwd`) is on the host, and its sandbox form.
pub(crate) fn resolve(files: &Path, cwd: &str, path: &str) -> Result<(PathBuf, String)> {
    let inside = in_sandbox(cwd, path)?;
    Ok((files.join(inside.trim_start_matches('/')), inside))
}

/// An I/O error on the sandbox path `path`, as the real agent words it.
pub(crate) fn io_error(e: &std::io::Error, path: &str, action: &str) -> AgentError {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            AgentError::new(ErrorKind::NotFound, format!("{path} does not exist"))
        }
        std::io::ErrorKind::IsADirectory => {
            AgentError::new(ErrorKind::Conflict, format!("{path} is a directory"))
        }
        std::io::ErrorKind::DirectoryNotEmpty => AgentError::new(
            ErrorKind::Conflict,
            format!("directory {path} is not empty"),
        ),
        _ => AgentError::new(ErrorKind::Io, format!("cannot {action} {path}: {e}")),
    }
}

pub(crate) fn read(ctx: &AgentContext, r: &ReadFile) -> Result<FileData> {
    let (host, path) = resolve(&ctx.files, &ctx.workdir, &r.path)?;
    if host.is_dir() {
        return Err(AgentError::new(
            ErrorKind::Conflict,
            format!("{path} is a directory"),
        ));
    }
    let data = std::fs::read(&host).map_err(|e| io_error(&e, &path, "read"))?;
    if data.len() as u64 > r.max_bytes {
        return Err(AgentError::new(
            ErrorKind::PayloadTooLarge,
            format!(
                "{path} is {} bytes; at most {} can be read",
                data.len(),
                r.max_bytes
            ),
        ));
    }
    Ok(FileData {
        path,
        size: data.len() as u64,
        data_b64: B64.encode(&data),
    })
}

pub(crate) fn write(ctx: &AgentContext, w: &WriteFile) -> Result<Written> {
    let (host, path) = resolve(&ctx.files, &ctx.workdir, &w.path)?;
    let data = B64
        .decode(w.data_b64.as_bytes())
        .map_err(|e| AgentError::new(ErrorKind::InvalidArgument, format!("data_b64: {e}")))?;
    if let Some(parent) = host.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_error(&e, &path, "write"))?;
    }
    std::fs::write(&host, &data).map_err(|e| io_error(&e, &path, "write"))?;
    Ok(Written {
        path,
        size: data.len() as u64,
    })
}

pub(crate) fn list(ctx: &AgentContext, l: &ListDir) -> Result<Dir> {
    let (host, path) = resolve(&ctx.files, &ctx.workdir, &l.path)?;
    let read = std::fs::read_dir(&host).map_err(|e| io_error(&e, &path, "list"))?;
    let mut entries: Vec<DirEntry> = read
        .flatten()
        .map(|e| {
            let meta = e.metadata().ok();
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => FileKind::Dir,
                Ok(t) if t.is_symlink() => FileKind::Symlink,
                Ok(t) if t.is_file() => FileKind::File,
                _ => FileKind::Other,
            };
            DirEntry {
                name: e.file_name().to_string_lossy().into_owned(),
                kind,
                size: meta.as_ref().map_or(0, |m| m.len()),
                mtime: meta
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs() as i64),
                mode: 0o644,
                owner: "root".into(),
                group: "root".into(),
                target: None,
                target_is_dir: false,
                metadata: Default::default(),
            }
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let truncated = entries.len() as u64 > l.max_entries;
    entries.truncate(l.max_entries as usize);
    Ok(Dir {
        path,
        entries,
        truncated,
    })
}

pub(crate) fn delete(ctx: &AgentContext, d: &Delete) -> Result<Deleted> {
    let (host, path) = resolve(&ctx.files, &ctx.workdir, &d.path)?;
    if path == "/" {
        return Err(AgentError::new(
            ErrorKind::PermissionDenied,
            "the sandbox's root cannot be deleted",
        ));
    }
    let meta = std::fs::symlink_metadata(&host).map_err(|e| io_error(&e, &path, "delete"))?;
    let deleted = if !meta.is_dir() {
        std::fs::remove_file(&host)
    } else if d.recursive {
        std::fs::remove_dir_all(&host)
    } else {
        std::fs::remove_dir(&host)
    };
    deleted.map_err(|e| io_error(&e, &path, "delete"))?;
    Ok(Deleted { path })
}

pub(crate) fn rename(ctx: &AgentContext, m: &Move) -> Result<Moved> {
    let (from_host, from) = resolve(&ctx.files, &ctx.workdir, &m.from)?;
    let (to_host, to) = resolve(&ctx.files, &ctx.workdir, &m.to)?;
    std::fs::rename(&from_host, &to_host).map_err(|e| io_error(&e, &from, "move"))?;
    Ok(Moved { from, to })
}
