//! Sides made of temporary directories, and the shorthand the diff's tests compare lists with.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::{Change, Diff, Mount, Side};

pub(crate) fn put(root: &Path, rel: &str, content: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

pub(crate) fn set_mtime(path: &Path, secs: u64) {
    let t = SystemTime::UNIX_EPOCH + Duration::new(secs, 123_456_789);
    fs::File::open(path).unwrap().set_modified(t).unwrap();
}

pub(crate) fn mount(target: &str, upper: &Path, lowers: &[&Path]) -> Mount {
    Mount {
        target: target.into(),
        upper: upper.to_path_buf(),
        lowers: lowers.iter().map(|l| l.to_path_buf()).collect(),
    }
}

pub(crate) fn side(upper: &Path, lowers: &[&Path]) -> Side {
    Side {
        mounts: vec![mount("/", upper, lowers)],
        id_base: None,
        stacked: 0,
    }
}

pub(crate) fn list(d: &Diff) -> Vec<(String, Change, Vec<&'static str>)> {
    d.entries
        .iter()
        .map(|e| (e.path.clone(), e.change, e.what.clone()))
        .collect()
}

pub(crate) fn added(p: &str) -> (String, Change, Vec<&'static str>) {
    (p.into(), Change::Added, vec![])
}

pub(crate) fn removed(p: &str) -> (String, Change, Vec<&'static str>) {
    (p.into(), Change::Removed, vec![])
}

pub(crate) fn modified(p: &str, what: &[&'static str]) -> (String, Change, Vec<&'static str>) {
    (p.into(), Change::Modified, what.to_vec())
}
