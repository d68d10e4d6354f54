//! Watching directories: the agent keeps an inotify watch on a directory (and, recursive, on
//! every directory under it, including those made later) and collects what happens there until
//! the engine takes the events or removes the watch.

use serde::{Deserialize, Serialize};

use crate::Done;

/// Start watching `path` (a directory).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WatchDir {
    pub path: String,
    pub recursive: bool,
    /// Describe what each event is about (when it still exists).
    #[serde(default)]
    pub entries: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Watching {
    pub watch_id: String,
    /// The directory watched, resolved.
    pub path: String,
}

/// The events of a watch since the last time they were taken.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WatchEvents {
    pub watch_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FsEvents {
    pub events: Vec<FsEvent>,
    /// Events were lost (more happened than the watch keeps, or than the kernel queued).
    pub overflow: bool,
    /// The watched directory itself is gone: no more events will come.
    pub ended: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FsEvent {
    /// The path that changed, relative to the watched directory.
    pub name: String,
    pub kind: FsEventKind,
    /// The path that changed, in full.
    pub path: String,
    /// What is at `path` now, when the watch asked for entries and something is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<crate::DirEntry>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// Stop watching.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Unwatch {
    pub watch_id: String,
}

call!(WatchDir(WatchDir) => Watching);
call!(WatchEvents(WatchEvents) => FsEvents, limit: |_: &WatchEvents| 8 * 1024 * 1024);
call!(Unwatch(Unwatch) => Done);
