//! Watched directories: one inotify instance per watch, on the directory and (recursive) every
//! directory under it, new ones included as they appear. Events are collected as they are read
//! (by a task of the agent every few milliseconds, and before each answer about a watch or
//! after each file call, so that a directory made by a call is watched before the next call
//! writes into it) and handed to the engine when it asks.
//!
//! The agent's own writes go through a temporary file renamed over the target (see
//! [`super::files::write_file`]); a watch reports them as changes of the target, so a watcher
//! sees what it would see of any program writing the file.
//!
//! Everything is bounded: watches per sandbox, directories per watch, and events kept per watch
//! (past it, the oldest go and the watch says events were lost).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::accounts::Names;
use super::files::{existing_dir, resolve};
use super::listing;
use super::spawn::error;
use sandbox_mcp_protocol::{
    AgentError, Done, ErrorKind, FsEvent, FsEventKind, FsEvents, WatchDir, WatchEvents, Watching,
};

/// Most watches one sandbox holds at once.
const MAX_WATCHES: usize = 32;
/// Most directories one recursive watch follows.
const MAX_DIRS: usize = 4096;
/// Most events a watch keeps until they are taken.
const MAX_EVENTS: usize = 10_000;
/// How often watches are read while any exist.
const PUMP_EVERY: Duration = Duration::from_millis(20);

struct Watch {
    inotify: Inotify,
    recursive: bool,
    /// Describe what each event is about.
    entries: bool,
    /// Each watched directory, relative to the watched one ("" for itself).
    dirs: HashMap<WatchDescriptor, PathBuf>,
    root: PathBuf,
    events: VecDeque<FsEvent>,
    overflow: bool,
    ended: bool,
    /// Cookies of the agent's temporary files renamed away, whose arrival is not news.
    landing: VecDeque<u32>,
}

/// The sandbox's watches.
#[derive(Default)]
pub(crate) struct Watchers {
    watches: RefCell<HashMap<String, Watch>>,
    next: RefCell<u64>,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW
}

/// The file one of the agent's temporary files (`.NAME.sandbox-mcp-DIGITS`) stands for.
fn written_through(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?;
    let (target, digits) = rest.rsplit_once(".sandbox-mcp-")?;
    (!target.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then_some(target)
}

impl Watch {
    /// Watches `root` (an existing directory) and, `recursive`, every directory under it.
    fn new(root: PathBuf, recursive: bool, entries: bool) -> Result<Watch, AgentError> {
        existing_dir(&root, "watch", "watch the directory it is in")?;
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| error(ErrorKind::Io, format!("cannot watch: {e}")))?;
        let mut watch = Watch {
            inotify,
            recursive,
            entries,
            dirs: HashMap::new(),
            root,
            events: VecDeque::new(),
            overflow: false,
            ended: false,
            landing: VecDeque::new(),
        };
        watch.add_dir(PathBuf::new())?;
        Ok(watch)
    }

    /// Takes the events so far, and whether any were lost since the last take.
    fn take(&mut self) -> FsEvents {
        self.pump();
        FsEvents {
            events: self.events.drain(..).collect(),
            overflow: std::mem::take(&mut self.overflow),
            ended: self.ended,
        }
    }

    fn add_dir(&mut self, relative: PathBuf) -> Result<(), AgentError> {
        if self.dirs.len() >= MAX_DIRS {
            self.overflow = true;
            return Err(error(
                ErrorKind::InvalidArgument,
                format!(
                    "{} holds more than {MAX_DIRS} directories; watch a smaller tree, or not recursively",
                    self.root.display()
                ),
            ));
        }
        let wd = self
            .inotify
            .add_watch(&self.root.join(&relative), mask())
            .map_err(|e| error(ErrorKind::Io, format!("cannot watch: {e}")))?;
        self.dirs.insert(wd, relative.clone());
        if self.recursive {
            let subdirs: Vec<PathBuf> = std::fs::read_dir(self.root.join(&relative))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| relative.join(e.file_name()))
                .collect();
            for dir in subdirs {
                self.add_dir(dir)?;
            }
        }
        Ok(())
    }

    fn push(&mut self, relative: &std::path::Path, kind: FsEventKind, names: &mut Option<Names>) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
            self.overflow = true;
        }
        let path = self.root.join(relative);
        let name = relative.to_string_lossy().into_owned();
        let entry = if self.entries {
            let leaf = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            listing::describe(&path, leaf, names.get_or_insert_with(Names::load))
        } else {
            None
        };
        self.events.push_back(FsEvent {
            name,
            kind,
            path: path.to_string_lossy().into_owned(),
            entry,
        });
    }

    /// Reads what the kernel has queued (without waiting).
    fn pump(&mut self) {
        // The account files, read once for the events of this pump that describe entries.
        let mut names = None;
        // One read returns what fits its buffer (a few hundred events): read until the queue is
        // empty (EAGAIN), so nothing the kernel queued waits for the next pump.
        while let Ok(read) = self.inotify.read_events() {
            if read.is_empty() {
                break;
            }
            self.handle(read, &mut names);
        }
    }

    fn handle(&mut self, read: Vec<nix::sys::inotify::InotifyEvent>, names: &mut Option<Names>) {
        for ev in read {
            if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                self.overflow = true;
                continue;
            }
            let Some(dir) = self.dirs.get(&ev.wd).cloned() else {
                continue;
            };
            if ev.mask.contains(AddWatchFlags::IN_DELETE_SELF) {
                self.dirs.remove(&ev.wd);
                if dir.as_os_str().is_empty() {
                    self.ended = true;
                }
                continue;
            }
            let Some(name) = ev.name.as_deref().map(OsStr::to_string_lossy) else {
                continue;
            };
            let through = written_through(&name).map(str::to_string);
            // The agent's write lands with the rename of its temporary file: the create, write
            // and owner change before it were already reported as the target's.
            if through.is_some() && ev.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                // Its other half, the target's IN_MOVED_TO, carries the same cookie.
                if self.landing.len() >= 64 {
                    self.landing.pop_front();
                }
                self.landing.push_back(ev.cookie);
                continue;
            }
            if through.is_some() && ev.mask.contains(AddWatchFlags::IN_DELETE) {
                continue;
            }
            if ev.mask.contains(AddWatchFlags::IN_MOVED_TO)
                && let Some(at) = self.landing.iter().position(|c| *c == ev.cookie)
            {
                self.landing.remove(at);
                continue;
            }
            let relative = dir.join(through.as_deref().unwrap_or(&name));
            let kind = if ev
                .mask
                .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
            {
                FsEventKind::Create
            } else if ev.mask.contains(AddWatchFlags::IN_MODIFY) {
                FsEventKind::Write
            } else if ev.mask.contains(AddWatchFlags::IN_DELETE) {
                FsEventKind::Remove
            } else if ev.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                FsEventKind::Rename
            } else {
                FsEventKind::Chmod
            };
            if self.recursive
                && kind == FsEventKind::Create
                && ev.mask.contains(AddWatchFlags::IN_ISDIR)
            {
                let _ = self.add_dir(relative.clone());
            }
            self.push(&relative, kind, names);
        }
    }
}

impl Watchers {
    /// Starts watching; the watch is read every few milliseconds while it exists.
    pub(crate) fn watch(self: &Rc<Self>, req: WatchDir) -> Result<Watching, AgentError> {
        if self.watches.borrow().len() >= MAX_WATCHES {
            return Err(error(
                ErrorKind::InvalidArgument,
                format!("this sandbox already has {MAX_WATCHES} watches; remove one first"),
            ));
        }
        let watch = Watch::new(resolve(&req.path)?, req.recursive, req.entries)?;
        let root = watch.root.clone();
        let id = {
            let mut next = self.next.borrow_mut();
            *next += 1;
            format!("w{}", *next)
        };
        self.watches.borrow_mut().insert(id.clone(), watch);
        let this = self.clone();
        let key = id.clone();
        tokio::task::spawn_local(async move {
            loop {
                tokio::time::sleep(PUMP_EVERY).await;
                let mut watches = this.watches.borrow_mut();
                let Some(w) = watches.get_mut(&key) else {
                    break;
                };
                w.pump();
            }
        });
        Ok(Watching {
            watch_id: id,
            path: root.display().to_string(),
        })
    }

    /// Reads every watch now (after a file call, before its answer).
    pub(crate) fn pump(&self) {
        for w in self.watches.borrow_mut().values_mut() {
            w.pump();
        }
    }

    pub(crate) fn events(&self, req: WatchEvents) -> Result<FsEvents, AgentError> {
        let mut watches = self.watches.borrow_mut();
        let w = watches
            .get_mut(&req.watch_id)
            .ok_or_else(|| unknown(&req.watch_id))?;
        Ok(w.take())
    }

    pub(crate) fn unwatch(&self, id: &str) -> Result<Done, AgentError> {
        self.watches
            .borrow_mut()
            .remove(id)
            .map(|_| Done {})
            .ok_or_else(|| unknown(id))
    }
}

fn unknown(id: &str) -> AgentError {
    error(ErrorKind::NotFound, format!("there is no watch {id}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_keeps_its_bounds_and_says_what_it_lost() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Watch::new(dir.path().join("nope"), false, false)
            .err()
            .unwrap();
        assert_eq!(missing.kind, ErrorKind::NotFound);
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let file = Watch::new(dir.path().join("f"), false, false)
            .err()
            .unwrap();
        assert_eq!(file.kind, ErrorKind::InvalidArgument);
        // Past MAX_EVENTS unread, the oldest go and the watch says so, once.
        let mut w = Watch::new(dir.path().to_path_buf(), false, false).unwrap();
        for i in 0..MAX_EVENTS + 50 {
            std::fs::File::create(dir.path().join(format!("n{i}"))).unwrap();
            if i % 1000 == 0 {
                w.pump(); // read as the agent's task would, before the kernel's queue fills
            }
        }
        let got = w.take();
        assert_eq!((got.events.len(), got.overflow), (MAX_EVENTS, true));
        assert_eq!(
            got.events.last().unwrap().name,
            format!("n{}", MAX_EVENTS + 49)
        );
        assert!(!w.take().overflow);
        // A recursive watch follows at most MAX_DIRS directories: more is refused, saying so.
        let tree = tempfile::tempdir().unwrap();
        for i in 0..MAX_DIRS {
            std::fs::create_dir(tree.path().join(format!("d{i}"))).unwrap();
        }
        let e = Watch::new(tree.path().to_path_buf(), true, false)
            .err()
            .unwrap();
        assert!(e.message.contains("4096 directories"), "{}", e.message);
        assert!(Watch::new(tree.path().to_path_buf(), false, false).is_ok());
    }

    #[test]
    fn the_agents_temporary_files_stand_for_their_targets() {
        assert_eq!(written_through(".a.txt.sandbox-mcp-123"), Some("a.txt"));
        assert_eq!(written_through("a.txt.sandbox-mcp-123"), None);
        assert_eq!(written_through(".a.txt.sandbox-mcp-12x"), None);
        assert_eq!(written_through(".a.txt"), None);
    }
}
