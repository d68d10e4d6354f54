//! Requests on the sandbox's files, resolved by the agent inside the sandbox's root: read, write,
//! list, delete, move, and a directory as a zip. Contents travel base64-encoded, so a reply may be
//! as large as the bytes asked for, encoded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::call::encoded;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReadFile {
    pub path: String,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileData {
    pub path: String,
    pub data_b64: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WriteFile {
    pub path: String,
    pub data_b64: String,
    /// An account of the sandbox's `/etc/passwd` to own the file and the directories this write
    /// makes (the sandbox's root when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Extended attributes to set on the file, each as `user.e2b.KEY` (E2B's file metadata).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Written {
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ListDir {
    pub path: String,
    pub max_entries: u64,
}

/// One entry, described as a listing of its parent would (without listing the rest): answered
/// with a [`Dir`] of its parent's path holding that entry alone.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Stat {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Dir {
    pub path: String,
    pub entries: Vec<DirEntry>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub mtime: i64,
    /// Permission bits (with setuid, setgid and sticky).
    #[serde(default)]
    pub mode: u32,
    /// The owner's and group's names in the sandbox (their numbers when it has none).
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub group: String,
    /// Where a symlink leads: the path it resolves to in the sandbox (or, dangling, what it
    /// says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Whether a symlink leads to a directory.
    #[serde(default)]
    pub target_is_dir: bool,
    /// Its `user.e2b.*` extended attributes, without the prefix.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Delete {
    pub path: String,
    pub recursive: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Deleted {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Move {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Moved {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ZipDir {
    pub path: String,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Zip {
    pub path: String,
    pub zip_b64: String,
    pub zip_bytes: u64,
    pub files: u64,
    pub skipped: Vec<String>,
}

call!(ReadFile(ReadFile) => FileData, limit: |r: &ReadFile| encoded(r.max_bytes));
call!(WriteFile(WriteFile) => Written);
// Up to 1000 entries of names up to 255 bytes, escaped.
call!(ListDir(ListDir) => Dir, limit: |_: &ListDir| 4 * 1024 * 1024);
call!(Stat(Stat) => Dir);
call!(Delete(Delete) => Deleted);
call!(Move(Move) => Moved);
call!(ZipDir(ZipDir) => Zip, limit: |r: &ZipDir| encoded(r.max_bytes));
