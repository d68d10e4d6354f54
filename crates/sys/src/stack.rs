//! Reading a file of a layer stack from the host, as a sandbox on that stack would see it.
//!
//! The engine reads a few files of an image it imports (`/etc/passwd` for its `User`, its CA
//! bundle) before any sandbox exists, from the unpacked layers on the host. The image is
//! untrusted: a path like `etc/passwd` joined onto a layer and opened would follow an
//! intermediate symlink of the image (`etc -> /some/host/dir`) out to the host, as root. Here
//! every component is looked up with `symlink_metadata` in directories already known to be real
//! directories of a layer, and a symlink of the image is resolved by hand against the image's
//! own root (`..` stops at it, an absolute target starts over from it), like `openat2`'s
//! `RESOLVE_IN_ROOT`, but across layers: whiteouts hide what is below them, an opaque directory
//! hides the lower layers' directories of the same path, and a directory does not merge with a
//! non-directory beneath it — overlayfs's rules. The file found is opened with `O_NOFOLLOW`, must
//! be a regular file, and is read up to a bound.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// Symlinks followed in one lookup before it gives up (the kernel's own limit).
const MAX_HOPS: usize = 40;

/// The regular file at `path` in the stack `layers` (bottom first), as a sandbox would see it,
/// with its symlinks resolved inside the stack. `None` when there is no such regular file (or
/// it is hidden, or a symlink loop or a dangling link leads nowhere). Never leaves the layers.
pub fn find_file(layers: &[PathBuf], path: &str) -> io::Result<Option<PathBuf>> {
    let roots: Vec<PathBuf> = layers.iter().rev().cloned().collect();
    // The directories that make up the current directory, top layer first, and those of each
    // directory above it (for `..`).
    let mut dirs = roots.clone();
    let mut parents: Vec<Vec<PathBuf>> = Vec::new();
    let mut todo: VecDeque<OsString> = components(path.as_bytes());
    let mut hops = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if let Some(up) = parents.pop() {
                dirs = up;
            }
            continue;
        }
        match lookup(&dirs, &name)? {
            Found::Nothing => return Ok(None),
            Found::Dirs(below) => {
                parents.push(std::mem::replace(&mut dirs, below));
            }
            Found::Link(target) => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Ok(None);
                }
                if target.as_bytes().first() == Some(&b'/') {
                    dirs = roots.clone();
                    parents.clear();
                }
                let mut next = components(target.as_bytes());
                next.extend(todo);
                todo = next;
            }
            Found::Other(file, is_file) => {
                return Ok((todo.is_empty() && is_file).then_some(file));
            }
        }
    }
    // The path names a directory.
    Ok(None)
}

/// Reads the regular file at `path` in the stack (see [`find_file`]), up to `max` bytes (a
/// longer one is an error naming the limit).
pub fn read_file(layers: &[PathBuf], path: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
    let Some(found) = find_file(layers, path)? else {
        return Ok(None);
    };
    // O_NOFOLLOW and O_NONBLOCK: the last component was seen to be a regular file, and stays
    // one or fails here (the layers are the engine's own, but it costs nothing to be sure).
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&found)?;
    if !file.metadata()?.is_file() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::other(format!(
            "the image's /{} is over {max} bytes",
            path.trim_start_matches('/')
        )));
    }
    Ok(Some(bytes))
}

enum Found {
    /// No such name, or hidden by a whiteout.
    Nothing,
    /// A directory: its directories in each layer that contributes, top first.
    Dirs(Vec<PathBuf>),
    /// A symlink (the topmost entry): its target.
    Link(OsString),
    /// Anything else (the topmost entry), and whether it is a regular file.
    Other(PathBuf, bool),
}

/// Looks `name` up in a directory made of `dirs` (top layer first).
fn lookup(dirs: &[PathBuf], name: &OsString) -> io::Result<Found> {
    let mut below = Vec::new();
    for dir in dirs {
        let path = dir.join(name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            // A component that is not a directory in this layer: nothing below it here.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => continue,
            Err(e) => return Err(e),
        };
        let kind = meta.file_type();
        if kind.is_dir() {
            let opaque = crate::layers::is_opaque(&path);
            below.push(path);
            if opaque {
                break;
            }
            continue;
        }
        // A directory found above ends the merge at the first non-directory beneath it.
        if !below.is_empty() {
            break;
        }
        if kind.is_char_device() && meta.rdev() == 0 {
            return Ok(Found::Nothing);
        }
        if kind.is_symlink() {
            return Ok(Found::Link(fs::read_link(&path)?.into_os_string()));
        }
        return Ok(Found::Other(path, kind.is_file()));
    }
    Ok(if below.is_empty() {
        Found::Nothing
    } else {
        Found::Dirs(below)
    })
}

/// The names of a path, `.` and empty ones dropped; `..` kept (resolved against the stack).
fn components(path: &[u8]) -> VecDeque<OsString> {
    Path::new(std::ffi::OsStr::from_bytes(path))
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from_vec(b"..".to_vec())),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Stack {
        _tmp: tempfile::TempDir,
        layers: Vec<PathBuf>,
        /// A directory outside every layer, standing for the host's files.
        host: PathBuf,
    }

    fn stack(n: usize) -> Stack {
        let tmp = tempfile::tempdir().unwrap();
        let layers: Vec<PathBuf> = (0..n).map(|i| tmp.path().join(format!("l{i}"))).collect();
        for l in &layers {
            fs::create_dir(l).unwrap();
        }
        let host = tmp.path().join("host");
        fs::create_dir_all(host.join("etc")).unwrap();
        fs::write(host.join("etc/passwd"), "host:x:0:0:host:/host:/bin/sh\n").unwrap();
        fs::write(host.join("passwd"), "host:x:0:0:host:/host:/bin/sh\n").unwrap();
        Stack {
            _tmp: tmp,
            layers,
            host,
        }
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn read(s: &Stack, path: &str) -> Option<String> {
        read_file(&s.layers, path, 1 << 20)
            .unwrap()
            .map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn symlinks_of_the_image_never_lead_to_the_hosts_files() {
        // Every way an image can point at a host directory or file: an absolute intermediate
        // link, a relative one climbing out, a link to the file itself (absolute and relative),
        // a chain of links, and a link in a lower layer under a real directory of the upper one.
        type Plant = fn(&Stack, &str, &str);
        let top: Plant = |s, at, target| {
            let l = &s.layers[1];
            fs::create_dir_all(l.join(at).parent().unwrap()).unwrap();
            symlink(target, l.join(at)).unwrap();
        };
        let lower: Plant = |s, at, target| {
            fs::create_dir_all(s.layers[1].join("etc")).unwrap();
            let l = &s.layers[0];
            fs::create_dir_all(l.join(at).parent().unwrap()).unwrap();
            symlink(target, l.join(at)).unwrap();
        };
        for (plant, at, target) in [
            (top, "etc", "{host}/etc"),
            (top, "etc", "{up}{host}/etc"),
            (top, "etc/passwd", "{host}/passwd"),
            (top, "etc/passwd", "{up}{host}/passwd"),
            (top, "etc", "a"),
            (lower, "etc/passwd", "{host}/passwd"),
            (lower, "etc/passwd", "{up}{host}/passwd"),
        ] {
            let s = stack(2);
            let host = s.host.to_str().unwrap();
            let up = "../".repeat(s.host.components().count() + 2);
            let target = target
                .replace("{up}{host}", &format!("{up}{}", &host[1..]))
                .replace("{host}", host);
            plant(&s, at, &target);
            // The chain's second link points at the host as well.
            symlink(format!("{host}/etc"), s.layers[1].join("a")).unwrap();
            // The host's file is there, and a plain join would have read it.
            assert!(
                fs::read_to_string(s.layers[1].join("etc/passwd"))
                    .is_ok_and(|t| t.starts_with("host:"))
                    || fs::read_to_string(s.layers[0].join("etc/passwd"))
                        .is_ok_and(|t| t.starts_with("host:"))
            );
            let got = read(&s, "etc/passwd");
            assert_eq!(got, None, "{at} -> {target}");
        }
    }

    #[test]
    fn links_inside_the_image_resolve_against_its_own_root() {
        let s = stack(1);
        let l = &s.layers[0];
        write(
            &l.join("real/etc/passwd"),
            "image:x:1:1::/home/image:/bin/sh\n",
        );
        // An absolute link to the image's own directory lands in the image, not the host.
        symlink("/real/etc", l.join("etc")).unwrap();
        assert_eq!(
            read(&s, "etc/passwd").unwrap(),
            "image:x:1:1::/home/image:/bin/sh\n"
        );
        // `..` past the image's root stays at its root.
        symlink("../../../../../../real/etc/passwd", l.join("deep")).unwrap();
        assert!(read(&s, "deep").unwrap().starts_with("image:"));
        assert!(
            read(&s, "/../../real/etc/passwd")
                .unwrap()
                .starts_with("image:")
        );
        // A loop, a dangling link, a directory and a missing file are all "no file".
        symlink("loop", l.join("loop")).unwrap();
        symlink("/nowhere", l.join("dangling")).unwrap();
        assert_eq!(read(&s, "loop"), None);
        assert_eq!(read(&s, "dangling"), None);
        assert_eq!(read(&s, "real/etc"), None);
        assert_eq!(read(&s, "real/etc/passwd/x"), None);
        assert_eq!(read(&s, "etc/group"), None);
    }

    #[test]
    fn upper_layers_win_and_whiteouts_and_opaque_directories_hide() {
        let s = stack(2);
        let (lower, upper) = (&s.layers[0], &s.layers[1]);
        write(&lower.join("etc/passwd"), "lower\n");
        write(&lower.join("etc/group"), "lower group\n");
        write(&lower.join("opt/x/file"), "lower x\n");
        fs::create_dir_all(upper.join("etc")).unwrap();
        // Files of a lower layer show through a directory of the upper one.
        assert_eq!(read(&s, "etc/passwd").unwrap(), "lower\n");
        write(&upper.join("etc/passwd"), "upper\n");
        assert_eq!(read(&s, "etc/passwd").unwrap(), "upper\n");
        // A whiteout hides the lower file.
        crate::layers::whiteout(&upper.join("etc/group")).unwrap();
        assert_eq!(read(&s, "etc/group"), None);
        // An opaque directory hides the lower directory's files.
        fs::create_dir_all(upper.join("opt/x")).unwrap();
        assert_eq!(read(&s, "opt/x/file").unwrap(), "lower x\n");
        if crate::layers::mark_opaque(&upper.join("opt/x")).is_ok() {
            assert_eq!(read(&s, "opt/x/file"), None);
        }
        // A file of the upper layer hides a lower directory of that name entirely.
        write(&lower.join("srv/conf/a"), "lower a\n");
        write(&upper.join("srv"), "a file\n");
        assert_eq!(read(&s, "srv/conf/a"), None);
        // A symlink in the upper layer to a directory merged from both.
        symlink("etc", upper.join("cfg")).unwrap();
        assert_eq!(read(&s, "cfg/passwd").unwrap(), "upper\n");
    }

    #[test]
    fn files_past_the_bound_and_special_files_are_refused() {
        let s = stack(1);
        write(&s.layers[0].join("big"), &"x".repeat(100));
        assert!(read_file(&s.layers, "big", 99).is_err());
        assert_eq!(
            read_file(&s.layers, "big", 100).unwrap().unwrap().len(),
            100
        );
        nix::unistd::mkfifo(
            &s.layers[0].join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        assert_eq!(read(&s, "fifo"), None);
    }
}
