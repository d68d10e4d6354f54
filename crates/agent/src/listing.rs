//! Listing directories: each entry as it is (a symlink as a link, with where it leads), with
//! its owner's and group's names from the sandbox's own account files and its E2B metadata.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::accounts::Names;
use super::files::{existing_dir, io_fail, resolve};
use super::xattrs;
use sandbox_mcp_protocol::{AgentError, Dir, DirEntry, ErrorKind, FileKind, ListDir, Stat};

use super::files::fail;

/// Most entries read from one directory before giving up on sorting all of them.
const MAX_SCAN: usize = 100_000;

type Result<T> = std::result::Result<T, AgentError>;

/// Where a symlink leads inside the sandbox: the path it resolves to, or (dangling, or a loop)
/// what it says.
fn link_target(link: &Path) -> String {
    fs::canonicalize(link)
        .or_else(|_| fs::read_link(link))
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn kind_of(ft: fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

pub(crate) fn list_dir(ListDir { path, max_entries }: ListDir) -> Result<Dir> {
    let path = resolve(&path)?;
    existing_dir(&path, "list", "read it with sandbox_files_read")?;
    let mut entries = Vec::new();
    let mut more = false;
    let names = Names::load();
    for entry in fs::read_dir(&path).map_err(|e| io_fail(&e, &path, "list"))? {
        let Ok(entry) = entry else { continue };
        if entries.len() >= MAX_SCAN {
            more = true;
            break;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(e) = describe(&entry.path(), name, &names) {
            entries.push(e);
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let truncated = more || entries.len() as u64 > max_entries;
    entries.truncate(max_entries as usize);
    Ok(Dir {
        path: path.display().to_string(),
        entries,
        truncated,
    })
}

/// What is at `path` (called `name`), a symlink described as a link; `None` when nothing is.
pub(crate) fn describe(path: &Path, name: String, names: &Names) -> Option<DirEntry> {
    // symlink_metadata: report links as links, never follow them.
    let m = path.symlink_metadata().ok()?;
    Some(DirEntry {
        name,
        kind: kind_of(m.file_type()),
        size: m.len(),
        mtime: m.mtime(),
        mode: m.mode() & 0o7777,
        owner: names.user(m.uid()),
        group: names.group(m.gid()),
        target: m.is_symlink().then(|| link_target(path)),
        target_is_dir: m.is_symlink() && path.is_dir(),
        metadata: xattrs::get(path),
    })
}

/// One entry, as its parent's listing would describe it.
pub(crate) fn stat(Stat { path }: Stat) -> Result<Dir> {
    let path = resolve(&path)?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned());
    let entry = describe(&path, name, &Names::load()).ok_or_else(|| {
        fail(
            ErrorKind::NotFound,
            format!("{} does not exist", path.display()),
        )
    })?;
    Ok(Dir {
        path: parent.display().to_string(),
        entries: vec![entry],
        truncated: false,
    })
}
