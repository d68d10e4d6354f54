//! The comparison: both sides' merged trees walked together in path order, iteratively (an
//! explicit stack, so a sandbox nesting directories 100 000 deep cannot exhaust the thread's),
//! with paths bounded by [`MAX_PATH`]. Where both sides take a directory from the very same
//! lower directories only the uppers' names are looked at; regular files of one size and one
//! mtime, or two names of one host inode, are taken as equal without being read.

use std::io;
use std::os::fd::BorrowedFd;
use std::rc::Rc;

use nix::fcntl::readlinkat;

use super::open::{fill, open_file};
use super::overlay::{Found, OpenDir, View, entry_at};
use super::path::{child, clip, escape, escape_child, escape_path, join, join_escaped, located};
use super::side::Layers;
use super::{Change, Diff, Entry, Kind, MAX_PATH, TooDeep};

/// How much of each file is read at a time when contents must be compared.
const CHUNK: usize = 64 * 1024;

/// A directory's sandbox path, raw (to open it) and escaped (to show it), shared by everything
/// queued from it: a wide directory deep down costs its names, not its names times its path.
struct Place {
    raw: Vec<u8>,
    esc: String,
}

impl Place {
    /// The parent of "/" (so that the root is its child "").
    fn above_root() -> Rc<Self> {
        Rc::new(Self {
            raw: Vec::new(),
            esc: String::new(),
        })
    }

    fn child(&self, name: &[u8], esc_name: &str) -> Self {
        Self {
            raw: child(&self.raw, name),
            esc: join_escaped(&self.esc, esc_name),
        }
    }
}

enum Item {
    /// A change, its name escaped.
    Entry {
        parent: Rc<Place>,
        name: String,
        change: Change,
        kind: Kind,
        size: u64,
        what: Vec<&'static str>,
    },
    /// A directory to compare, and where each side takes it from (None: absent on that side,
    /// so everything in it is added or removed).
    Dir {
        parent: Rc<Place>,
        name: Vec<u8>,
        esc_name: String,
        a: Option<View>,
        b: Option<View>,
    },
}

impl Item {
    /// Sorting one directory's items by this yields every path in byte order of the escaped
    /// paths: a directory's contents sort as if its name ended in `/` (after `a-b` for `a`).
    fn key(&self) -> impl Iterator<Item = u8> + '_ {
        match self {
            Item::Entry { name, .. } => name.bytes().chain(None),
            Item::Dir { esc_name, .. } => esc_name.bytes().chain(Some(b'/')),
        }
    }
}

pub(crate) struct Walk<'l> {
    a: &'l Layers,
    b: &'l Layers,
    max: usize,
    pub(crate) diff: Diff,
    /// Pending work, the next in path order on top (an explicit stack: no recursion).
    stack: Vec<Item>,
    buf_a: Vec<u8>,
    buf_b: Vec<u8>,
}

impl<'l> Walk<'l> {
    pub(crate) fn new(a: &'l Layers, b: &'l Layers, max: usize) -> Self {
        Walk {
            a,
            b,
            max,
            diff: Diff::default(),
            stack: Vec::new(),
            buf_a: vec![0; CHUNK],
            buf_b: vec![0; CHUNK],
        }
    }

    /// Compares the entry at `under` itself, which queues its contents.
    pub(crate) fn start(&mut self, under: &[Vec<u8>]) -> io::Result<()> {
        let parent = match under.split_last() {
            None => Place::above_root(),
            Some((_, parent)) => Rc::new(Place {
                raw: join(parent),
                esc: escape_path(parent),
            }),
        };
        let name = under.last().map_or(&[][..], |n| n.as_slice());
        if child(&parent.raw, name).len() > MAX_PATH {
            let path = clip(&escape_child(&parent.esc, name));
            return Err(io::Error::other(TooDeep { path }));
        }
        let (fa, oa) = entry_at(self.a, under)?;
        let (fb, ob) = entry_at(self.b, under)?;
        let mut items = Vec::new();
        let dirs = (oa.as_ref(), ob.as_ref());
        self.judge(&parent, name, fa, fb, dirs, &mut items)?;
        self.stack.extend(items.into_iter().rev());
        Ok(())
    }

    pub(crate) fn run(&mut self) -> io::Result<()> {
        while let Some(item) = self.stack.pop() {
            match item {
                Item::Entry {
                    parent,
                    name,
                    change,
                    kind,
                    size,
                    what,
                } => {
                    self.count(change);
                    if self.diff.entries.len() < self.max {
                        self.diff.entries.push(Entry {
                            path: join_escaped(&parent.esc, &name),
                            change,
                            kind,
                            size,
                            what,
                        });
                    }
                }
                Item::Dir {
                    parent,
                    name,
                    esc_name,
                    a,
                    b,
                } => {
                    let place = Rc::new(parent.child(&name, &esc_name));
                    drop(parent);
                    self.dir(&place, a, b).map_err(|e| located(&place.esc, e))?;
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, change: Change) {
        match change {
            Change::Added => self.diff.added += 1,
            Change::Removed => self.diff.removed += 1,
            Change::Modified => self.diff.modified += 1,
        }
    }

    /// Whether every entry to keep is kept: what is found from now on is only counted.
    fn full(&self) -> bool {
        self.diff.entries.len() >= self.max
    }

    /// Compares the contents of one directory and queues what it finds in path order.
    fn dir(&mut self, place: &Rc<Place>, a: Option<View>, b: Option<View>) -> io::Result<()> {
        let open =
            |l: &'l Layers, v: Option<View>| v.map(|v| OpenDir::new(l, v, &place.raw)).transpose();
        let (mut oa, mut ob) = (open(self.a, a)?, open(self.b, b)?);
        // The uppers first: an opaque one means the lowers contribute nothing here.
        for o in [&mut oa, &mut ob].into_iter().flatten() {
            if o.has_upper() {
                o.fd(0)?;
            }
        }
        // Same lowers on both sides: a name in neither upper is the same name on both.
        let shared = matches!((&oa, &ob), (Some(x), Some(y)) if x.same_lowers(y));
        let mut names = Vec::new();
        for o in [&mut oa, &mut ob].into_iter().flatten() {
            let upto = if shared {
                usize::from(o.has_upper())
            } else {
                usize::MAX
            };
            let mut k = 0;
            while k < upto.min(o.chain.len()) {
                names.extend_from_slice(o.names(k)?);
                k += 1;
            }
            o.layers.mount_children(&place.raw, &mut names);
        }
        names.sort_unstable();
        names.dedup();
        let mut items = Vec::new();
        for name in &names {
            self.name(place, name, &mut oa, &mut ob, &mut items)?;
        }
        if !self.full() {
            items.sort_by(|x, y| x.key().cmp(y.key()));
        }
        self.stack.extend(items.into_iter().rev());
        Ok(())
    }

    /// Resolves `name` of directory `parent` on both sides and compares it.
    fn name(
        &mut self,
        parent: &Rc<Place>,
        name: &[u8],
        oa: &mut Option<OpenDir<'l>>,
        ob: &mut Option<OpenDir<'l>>,
        items: &mut Vec<Item>,
    ) -> io::Result<()> {
        let path = child(&parent.raw, name);
        if path.len() > MAX_PATH {
            let path = clip(&escape_child(&parent.esc, name));
            return Err(io::Error::other(TooDeep { path }));
        }
        let fa = match oa {
            Some(o) => o.lookup(name, &path)?,
            None => None,
        };
        let fb = match ob {
            Some(o) => o.lookup(name, &path)?,
            None => None,
        };
        self.judge(parent, name, fa, fb, (oa.as_ref(), ob.as_ref()), items)
    }

    /// Queues what differs between `fa` and `fb`, the two sides' entries for `name`, and the
    /// directory below it if there is one.
    fn judge(
        &mut self,
        parent: &Rc<Place>,
        name: &[u8],
        fa: Option<Found>,
        fb: Option<Found>,
        (oa, ob): (Option<&OpenDir<'_>>, Option<&OpenDir<'_>>),
        items: &mut Vec<Item>,
    ) -> io::Result<()> {
        let (change, what, st) = match (&fa, &fb) {
            (None, None) => return Ok(()),
            (None, Some(b)) => (Change::Added, Vec::new(), b.st),
            (Some(a), None) => (Change::Removed, Vec::new(), a.st),
            (Some(a), Some(b)) => {
                let what = self.differences(name, a, oa, b, ob)?;
                (Change::Modified, what, b.st)
            }
        };
        let (a, b) = (fa.and_then(|f| f.child), fb.and_then(|f| f.child));
        let changed = change != Change::Modified || !what.is_empty();
        if !changed && a.is_none() && b.is_none() {
            return Ok(());
        }
        let mut esc_name = String::with_capacity(name.len());
        escape(&mut esc_name, name);
        if changed && self.full() {
            // Nothing more is kept: no order to keep either.
            self.count(change);
        } else if changed {
            let kind = st.kind();
            items.push(Item::Entry {
                parent: parent.clone(),
                name: esc_name.clone(),
                change,
                kind,
                size: if kind == Kind::Dir { 0 } else { st.size },
                what,
            });
        }
        if a.is_some() || b.is_some() {
            items.push(Item::Dir {
                parent: parent.clone(),
                name: name.to_vec(),
                esc_name,
                a,
                b,
            });
        }
        Ok(())
    }

    fn differences(
        &mut self,
        name: &[u8],
        a: &Found,
        oa: Option<&OpenDir<'_>>,
        b: &Found,
        ob: Option<&OpenDir<'_>>,
    ) -> io::Result<Vec<&'static str>> {
        let mut what = Vec::new();
        let format = a.st.format();
        let same_type = format == b.st.format() && (!a.st.is_device() || a.st.rdev == b.st.rdev);
        if !same_type {
            what.push("type");
        }
        // A mount root's own mode and owner are the engine's: it makes the upper directory
        // (or has not yet), the sandbox did not.
        if a.mount_root || b.mount_root {
            return Ok(what);
        }
        let (da, db) = (parent_of(oa, a), parent_of(ob, b));
        if same_type && format == libc::S_IFREG && !self.same_content(name, a, da, b, db)? {
            what.push("content");
        }
        if a.st.mode & 0o7777 != b.st.mode & 0o7777 {
            what.push("mode");
        }
        if (a.st.uid, a.st.gid) != (b.st.uid, b.st.gid) {
            what.push("owner");
        }
        if same_type && format == libc::S_IFLNK && !same_target(name, da, db) {
            what.push("target");
        }
        Ok(what)
    }

    fn same_content(
        &mut self,
        name: &[u8],
        a: &Found,
        da: Option<BorrowedFd<'_>>,
        b: &Found,
        db: Option<BorrowedFd<'_>>,
    ) -> io::Result<bool> {
        if (a.st.dev, a.st.ino) == (b.st.dev, b.st.ino) {
            return Ok(true);
        }
        if a.st.size != b.st.size {
            return Ok(false);
        }
        if a.st.mtime == b.st.mtime {
            return Ok(true);
        }
        let (Some(da), Some(db)) = (da, db) else {
            return Ok(false);
        };
        // Replaced since it was looked at: something changed, whatever it was.
        let (Some(mut fa), Some(mut fb)) = (open_file(da, name)?, open_file(db, name)?) else {
            return Ok(false);
        };
        loop {
            let na = fill(&mut fa, &mut self.buf_a)?;
            let nb = fill(&mut fb, &mut self.buf_b)?;
            if self.buf_a[..na] != self.buf_b[..nb] {
                return Ok(false);
            }
            if na < CHUNK {
                return Ok(true);
            }
        }
    }
}

/// The directory `f` was found in.
fn parent_of<'o>(o: Option<&'o OpenDir<'_>>, f: &Found) -> Option<BorrowedFd<'o>> {
    o.zip(f.pos).and_then(|(o, k)| o.opened(k))
}

fn same_target(name: &[u8], da: Option<BorrowedFd<'_>>, db: Option<BorrowedFd<'_>>) -> bool {
    match (da, db) {
        (Some(da), Some(db)) => match (readlinkat(da, name), readlinkat(db, name)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
