//! Copies, captures and squashes of layer trees.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use super::copy::keep_times;
use super::*;

/// An upper as a sandbox leaves it: a setuid file `a/b/f` ("hello") hard-linked as `a/g`,
/// and a whiteout `gone`.
fn sample_upper(tmp: &Path) -> PathBuf {
    let upper = tmp.join("upper");
    fs::create_dir_all(upper.join("a/b")).unwrap();
    fs::write(upper.join("a/b/f"), "hello").unwrap();
    fs::set_permissions(upper.join("a/b/f"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::hard_link(upper.join("a/b/f"), upper.join("a/g")).unwrap();
    whiteout(&upper.join("gone")).unwrap();
    upper
}

#[test]
fn a_capture_keeps_content_links_and_whiteouts_and_drops_setuid() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = sample_upper(tmp.path());
    std::os::unix::fs::symlink("/etc/passwd", upper.join("a/link")).unwrap();
    fs::set_permissions(upper.join("a"), fs::Permissions::from_mode(0o555)).unwrap();
    let dest = tmp.path().join("layer");
    let bytes = capture(&[("root".into(), vec![upper])], &dest, Owners::Keep).unwrap();
    assert_eq!(bytes, 5);
    let f = dest.join("root/a/b/f");
    assert_eq!(fs::read_to_string(&f).unwrap(), "hello");
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o755);
    assert_eq!(
        fs::metadata(&f).unwrap().ino(),
        fs::metadata(dest.join("root/a/g")).unwrap().ino()
    );
    assert_eq!(
        fs::read_link(dest.join("root/a/link")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        fs::metadata(dest.join("root/a")).unwrap().mode() & 0o777,
        0o555
    );
    let gone = fs::symlink_metadata(dest.join("root/gone")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
}

#[test]
fn a_capture_of_stacked_trees_is_what_the_overlay_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let (below, above) = (tmp.path().join("below"), tmp.path().join("above"));
    for d in ["keep", "merged", "hidden/deep", "replaced"] {
        fs::create_dir_all(below.join(d)).unwrap();
    }
    fs::write(below.join("keep/f"), "old").unwrap();
    fs::write(below.join("merged/a"), "a").unwrap();
    fs::write(below.join("hidden/deep/x"), "x").unwrap();
    fs::write(below.join("deleted"), "d").unwrap();
    fs::write(below.join("changed"), "1").unwrap();
    fs::set_permissions(below.join("hidden/deep"), fs::Permissions::from_mode(0o555)).unwrap();
    fs::create_dir_all(above.join("merged")).unwrap();
    fs::write(above.join("merged/b"), "b").unwrap();
    fs::set_permissions(above.join("merged"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::create_dir_all(above.join("hidden")).unwrap();
    mark_opaque(&above.join("hidden")).unwrap();
    fs::write(above.join("hidden/new"), "n").unwrap();
    whiteout(&above.join("deleted")).unwrap();
    fs::write(above.join("changed"), "22").unwrap();
    fs::write(above.join("replaced"), "a file now").unwrap();
    let dest = tmp.path().join("layer");
    let trees = vec![below.clone(), tmp.path().join("missing"), above];
    capture(&[("root".into(), trees)], &dest, Owners::Keep).unwrap();
    let root = dest.join("root");
    let read = |p: &str| fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(read("keep/f"), "old");
    assert_eq!(
        (read("merged/a"), read("merged/b")),
        ("a".into(), "b".into())
    );
    assert_eq!(
        fs::metadata(root.join("merged")).unwrap().mode() & 0o777,
        0o750
    );
    // The opaque directory replaced the one below, and stays opaque over the template.
    assert!(is_opaque(&root.join("hidden")));
    assert_eq!(read("hidden/new"), "n");
    assert!(!root.join("hidden/deep").exists());
    let gone = fs::symlink_metadata(root.join("deleted")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
    assert_eq!(read("changed"), "22");
    assert_eq!(read("replaced"), "a file now");
}

#[test]
fn a_squash_is_exact_and_the_top_tree_wins() {
    let tmp = tempfile::tempdir().unwrap();
    let (below, above) = (tmp.path().join("below"), tmp.path().join("above"));
    fs::create_dir_all(below.join("d")).unwrap();
    fs::write(below.join("d/old"), "o").unwrap();
    fs::write(below.join("gone"), "g").unwrap();
    fs::create_dir_all(above.join("d")).unwrap();
    fs::write(above.join("d/suid"), "s").unwrap();
    fs::set_permissions(above.join("d/suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    whiteout(&above.join("gone")).unwrap();
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    fs::File::open(above.join("d"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    let dest = tmp.path().join("squashed");
    squash(&[below, above], &dest, Owners::Keep).unwrap();
    assert_eq!(fs::read_to_string(dest.join("d/old")).unwrap(), "o");
    assert_eq!(
        fs::metadata(dest.join("d/suid")).unwrap().mode() & 0o7777,
        0o4755
    );
    let gone = fs::symlink_metadata(dest.join("gone")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
    assert_eq!(fs::metadata(dest.join("d")).unwrap().mtime(), 1_000_000);
}

#[test]
fn an_exact_copy_keeps_setuid_times_links_whiteouts_and_opaque_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = sample_upper(tmp.path());
    std::os::unix::fs::symlink("loop", upper.join("a/loop")).unwrap();
    mknod(&upper.join("a/fifo"), libc::S_IFIFO | 0o640).unwrap();
    std::os::unix::net::UnixListener::bind(upper.join("a/sock")).unwrap();
    let opaque = mark_opaque(&upper.join("a/b")).is_ok();
    // Times from the past, on a file, a link and a directory.
    for p in ["a/b/f", "a/loop", "a"] {
        keep_times(&upper.join(p), &fs::symlink_metadata("/").unwrap()).unwrap();
    }
    let dest = tmp.path().join("copy");
    assert_eq!(copy_tree(&upper, &dest, Owners::Keep).unwrap(), 5);
    let f = fs::metadata(dest.join("a/b/f")).unwrap();
    assert_eq!(f.mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!(f.ino(), fs::metadata(dest.join("a/g")).unwrap().ino());
    for p in ["a/b/f", "a/loop", "a"] {
        let (was, is) = (
            fs::symlink_metadata(upper.join(p)).unwrap(),
            fs::symlink_metadata(dest.join(p)).unwrap(),
        );
        assert_eq!(
            (is.mtime(), is.mtime_nsec()),
            (was.mtime(), was.mtime_nsec()),
            "{p}"
        );
    }
    assert_eq!(
        fs::read_link(dest.join("a/loop")).unwrap(),
        Path::new("loop")
    );
    assert!(
        fs::symlink_metadata(dest.join("a/fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!dest.join("a/sock").exists(), "sockets are left out");
    let gone = fs::symlink_metadata(dest.join("gone")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
    if opaque {
        assert_eq!(
            get_xattr(&dest.join("a/b"), OPAQUE).as_deref(),
            Some(&b"y"[..])
        );
    }
}

#[test]
fn ids_outside_the_sandbox_range_become_nobody() {
    let o = Owners::Shift {
        base: 10_000_000,
        count: 65_535,
    };
    assert_eq!(o.map(10_000_000), Some(0));
    assert_eq!(o.map(10_001_000), Some(1000));
    assert_eq!(o.map(10_000_000 + 65_535), Some(65534));
    assert_eq!(o.map(0), Some(65534));
    assert_eq!(Owners::Keep.map(5), None);
}

#[test]
fn ids_are_stable_and_never_paths() {
    let a = id_of(&[b"parent", b"step"]);
    assert_eq!(a, id_of(&[b"parent", b"step"]));
    assert_ne!(a, id_of(&[b"parents", b"tep"]));
    assert_eq!(a.len(), 32);
    assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
}

/// Exchanges directory `name` in `dir` with the symlink `link` beside it, over and over, until
/// told to stop: sandbox code bending a tree the engine is copying. Returns how many swaps it
/// made.
fn swapping(
    dir: &Path,
    name: &'static str,
    link: &'static str,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<u64>,
) {
    use std::sync::atomic::Ordering;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, dir) = (stop.clone(), dir.to_path_buf());
    let swapper = std::thread::spawn(move || {
        let at = crate::fs_tree::open_dir_beneath_path(None, &dir).unwrap();
        let mut swaps = 0;
        while !flag.load(Ordering::Relaxed) {
            let swapped = nix::fcntl::renameat2(
                &at,
                name,
                &at,
                link,
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            );
            swaps += u64::from(swapped.is_ok());
        }
        swaps
    });
    (stop, swapper)
}

/// The source may be a tree sandbox code still changes (a volume other sandboxes mount): a
/// directory swapped for a link to a host directory while it is copied never brings that
/// directory's files into the copy.
#[test]
fn a_copy_never_reads_through_a_directory_swapped_for_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (tree, outside) = (tmp.path().join("tree"), tmp.path().join("outside"));
    fs::create_dir_all(tree.join("d/e")).unwrap();
    fs::write(tree.join("d/e/mine"), "mine").unwrap();
    fs::create_dir_all(outside.join("e")).unwrap();
    fs::write(outside.join("e/host-secret"), "secret").unwrap();
    std::os::unix::fs::symlink(&outside, tree.join("l")).unwrap();
    let (stop, swapper) = swapping(&tree, "d", "l");
    for i in 0..300 {
        let dest = tmp.path().join(format!("copy{i}"));
        // What was bent meanwhile is left out; the copy itself does not fail.
        copy_tree(&tree, &dest, Owners::Keep).unwrap();
        let copied = String::from_utf8(
            std::process::Command::new("find")
                .arg(&dest)
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(
            !copied.contains("host-secret"),
            "copied from outside: {copied}"
        );
        crate::fs_tree::remove_tree(&dest).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        swapper.join().unwrap() > 0,
        "the directory was never swapped"
    );
}

/// A volume's sandboxes keep writing while the engine copies it (a snapshot that keeps
/// volumes): files and directories made and deleted meanwhile, and hard links among them, never
/// make the copy fail; what it holds is from the tree.
#[test]
fn a_copy_of_a_tree_being_written_and_deleted_succeeds() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    fs::create_dir_all(tree.join("keep")).unwrap();
    fs::write(tree.join("keep/a"), "a").unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, tree) = (stop.clone(), tree.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let d = tree.join(format!("d{}", rounds % 4));
                let _ = fs::create_dir_all(d.join("sub"));
                for i in 0..8 {
                    let _ = fs::write(d.join(format!("sub/f{i}")), "x");
                    let _ = fs::hard_link(d.join(format!("sub/f{i}")), d.join(format!("h{i}")));
                    let _ = std::os::unix::fs::symlink("sub", d.join(format!("l{i}")));
                }
                let _ = crate::fs_tree::remove_tree(&d);
                rounds += 1;
            }
            rounds
        })
    };
    for i in 0..200 {
        let dest = tmp.path().join(format!("copy{i}"));
        copy_tree(&tree, &dest, Owners::Keep).unwrap();
        assert_eq!(fs::read_to_string(dest.join("keep/a")).unwrap(), "a");
        crate::fs_tree::remove_tree(&dest).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(writer.join().unwrap() > 0, "the tree was never written");
}

/// The destination may be such a tree too (a volume refilled from a snapshot): a directory the
/// copy made, swapped for a link to a host directory, never has a file written through it.
#[test]
fn a_copy_never_writes_through_a_directory_swapped_for_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dest, outside) = (
        tmp.path().join("src"),
        tmp.path().join("dest"),
        tmp.path().join("outside"),
    );
    fs::create_dir_all(src.join("x")).unwrap();
    for i in 0..20 {
        fs::write(src.join(format!("x/planted{i}")), "#!/bin/sh\n").unwrap();
    }
    fs::create_dir_all(&outside).unwrap();
    fs::create_dir_all(&dest).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("l")).unwrap();
    let (stop, swapper) = swapping(&dest, "x", "l");
    for _ in 0..300 {
        let _ = copy_tree(&src, &dest, Owners::Keep);
        // Empty it again as a refill does, but for the link the swapper needs. The swapper
        // keeps running, so a directory listed here may be the link by the time it is removed
        // (the removal then refuses it): list and remove again until only links are left.
        let mut passes = 0;
        loop {
            let dirs: Vec<_> = fs::read_dir(&dest)
                .unwrap()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| !t.is_symlink()))
                .collect();
            if dirs.is_empty() {
                break;
            }
            passes += 1;
            assert!(passes < 10_000, "the copy could not be emptied: {dirs:?}");
            for entry in dirs {
                let _ = crate::fs_tree::remove_tree(&entry.path());
            }
        }
        if !dest.join("l").exists() && fs::symlink_metadata(dest.join("l")).is_err() {
            std::os::unix::fs::symlink(&outside, dest.join("l")).unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        swapper.join().unwrap() > 0,
        "the directory was never swapped"
    );
    let written: Vec<_> = fs::read_dir(&outside).unwrap().flatten().collect();
    assert!(written.is_empty(), "written outside: {written:?}");
}
