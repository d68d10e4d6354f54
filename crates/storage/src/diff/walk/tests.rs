//! Comparing two sides end to end: what counts as a change of each kind, in what order changes
//! are listed, how many are kept, and trees too deep to name.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use sandbox_mcp_sys::layers;

use super::super::fixture::*;
use super::super::{Kind, diff};
use super::CHUNK;

/// A small template layer, the same every time it is made.
fn template(dir: &Path) {
    put(dir, "etc/hostname", b"box\n");
    put(dir, "etc/passwd", b"root:x:0:0::/root:/bin/sh\n");
    put(dir, "etc/conf.d/a", b"a = 1\n");
    put(dir, "etc/conf.d/b", b"b = 2\n");
    put(dir, "usr/bin/tool", b"#!/bin/sh\necho hi\n");
    put(dir, "var/lib/data", &[7; 100_000]);
    fs::create_dir_all(dir.join("tmp")).unwrap();
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
}

#[test]
fn files_added_removed_and_modified_are_listed_in_path_order() {
    let tmp = tempfile::tempdir().unwrap();
    let (lower, ua, ub) = (
        tmp.path().join("lower"),
        tmp.path().join("a"),
        tmp.path().join("b"),
    );
    put(&lower, "same.txt", b"x");
    put(&lower, "edit.txt", b"1");
    put(&ua, "old.txt", b"old");
    put(&ub, "new.txt", b"new");
    put(&ub, "edit.txt", b"22");
    put(&ua, "dir/f", b"f");
    put(&ub, "dir/f", b"f");
    set_mtime(&ua.join("dir/f"), 1000);
    set_mtime(&ub.join("dir/f"), 1000);
    put(&ub, "newdir/x/y", b"yy");
    // `a-b` sorts between `a` and `a/c`.
    put(&ub, "a/c", b"");
    put(&ub, "a-b", b"");
    // A directory replaced by a file: its contents are gone.
    put(&ua, "t/1", b"1");
    put(&ub, "t", b"t");
    let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![
            added("/a"),
            added("/a-b"),
            added("/a/c"),
            modified("/edit.txt", &["content"]),
            added("/new.txt"),
            added("/newdir"),
            added("/newdir/x"),
            added("/newdir/x/y"),
            removed("/old.txt"),
            // A directory (0755) became a file (0644).
            modified("/t", &["type", "mode"]),
            removed("/t/1"),
        ]
    );
    assert_eq!((d.added, d.removed, d.modified), (7, 2, 2));
    let new = &d.entries[4];
    assert_eq!((new.kind, new.size), (Kind::File, 3));
    let dir = &d.entries[5];
    assert_eq!((dir.kind, dir.size), (Kind::Dir, 0));
    let t = &d.entries[9];
    assert_eq!((t.kind, t.size), (Kind::File, 1));
    let gone = &d.entries[10];
    assert_eq!((gone.kind, gone.size), (Kind::File, 1));

    // An upper that does not exist yet is an empty one.
    let none = tmp.path().join("missing");
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let d = diff(&side(&none, &[&lower]), &side(&empty, &[&lower]), "/", 100).unwrap();
    assert_eq!((d.added, d.removed, d.modified), (0, 0, 0));
    let d = diff(&side(&none, &[&lower]), &side(&ub, &[&lower]), "/", 0).unwrap();
    assert_eq!(
        (d.added, d.removed, d.modified, d.entries.len()),
        (10, 0, 1, 0)
    );
}

#[test]
fn a_permission_change_alone_is_a_mode_change() {
    let tmp = tempfile::tempdir().unwrap();
    let (lower, ua, ub) = (
        tmp.path().join("lower"),
        tmp.path().join("a"),
        tmp.path().join("b"),
    );
    put(&lower, "run.sh", b"#!/bin/sh\n");
    put(&ub, "run.sh", b"#!/bin/sh\n");
    fs::set_permissions(lower.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(ub.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(lower.join("dir")).unwrap();
    fs::create_dir_all(ub.join("dir")).unwrap();
    fs::set_permissions(ub.join("dir"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::create_dir_all(&ua).unwrap();
    let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![modified("/dir", &["mode"]), modified("/run.sh", &["mode"])]
    );
}

#[test]
fn symlinks_are_compared_by_target_and_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir_all(&ua).unwrap();
    fs::create_dir_all(&ub).unwrap();
    let link = |target: &str, at: &Path| std::os::unix::fs::symlink(target, at).unwrap();
    link("b", &ub.join("a"));
    link("a", &ub.join("b"));
    link("x", &ua.join("link"));
    link("yy", &ub.join("link"));
    link("same", &ua.join("keep"));
    link("same", &ub.join("keep"));
    link("/etc", &ub.join("etc"));
    put(&ua, "f", b"f");
    link("f", &ub.join("f"));
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![
            added("/a"),
            added("/b"),
            added("/etc"),
            modified("/f", &["type", "mode"]),
            modified("/link", &["target"]),
        ]
    );
    assert!(d.entries.iter().all(|e| e.kind == Kind::Symlink));
    assert_eq!(d.entries[4].size, 2);
    // Under a symlink there is nothing to walk.
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/etc", 100).unwrap();
    assert_eq!(list(&d), vec![added("/etc")]);
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/etc/passwd", 100).unwrap();
    assert!(d.entries.is_empty());
}

#[test]
fn fifos_are_compared_without_being_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir_all(&ua).unwrap();
    fs::create_dir_all(&ub).unwrap();
    let fifo = |p: &Path, mode: u32| {
        nix::unistd::mkfifo(p, Mode::from_bits_truncate(mode)).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    };
    fifo(&ua.join("p"), 0o644);
    fifo(&ub.join("p"), 0o644);
    fifo(&ub.join("q"), 0o644);
    fifo(&ua.join("r"), 0o644);
    put(&ub, "r", b"");
    fs::set_permissions(ub.join("r"), fs::Permissions::from_mode(0o644)).unwrap();
    fifo(&ua.join("s"), 0o600);
    fifo(&ub.join("s"), 0o644);
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![
            added("/q"),
            modified("/r", &["type"]),
            modified("/s", &["mode"]),
        ]
    );
    assert_eq!(d.entries[0].kind, Kind::Other);
    assert_eq!(d.entries[1].kind, Kind::File);
}

#[test]
fn contents_are_read_only_when_size_and_mtime_do_not_settle_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    // Same size, different bytes, same mtime: taken as unchanged (what a copy keeps).
    put(&ua, "trusted", b"aaaa");
    put(&ub, "trusted", b"bbbb");
    set_mtime(&ua.join("trusted"), 10);
    set_mtime(&ub.join("trusted"), 10);
    // Same size, different bytes, different mtimes: read, and different.
    put(&ua, "read", b"aaaa");
    put(&ub, "read", b"bbbb");
    set_mtime(&ua.join("read"), 10);
    set_mtime(&ub.join("read"), 11);
    // Same bytes, different mtimes: read, and the same.
    put(&ua, "touched", b"same");
    put(&ub, "touched", b"same");
    set_mtime(&ua.join("touched"), 10);
    set_mtime(&ub.join("touched"), 11);
    // Several chunks, differing only in the last byte; and identical ones.
    let mut big = vec![1u8; 3 * CHUNK + 17];
    put(&ua, "big", &big);
    put(&ua, "big-same", &big);
    put(&ub, "big-same", &big);
    *big.last_mut().unwrap() = 2;
    put(&ub, "big", &big);
    for name in ["big", "big-same"] {
        set_mtime(&ua.join(name), 10);
        set_mtime(&ub.join(name), 11);
    }
    // Hard links: one inode seen from both sides.
    put(&ua, "linked", b"L");
    fs::hard_link(ua.join("linked"), ub.join("linked")).unwrap();
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![
            modified("/big", &["content"]),
            modified("/read", &["content"]),
        ]
    );
}

#[test]
fn max_entries_caps_the_list_but_not_the_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir_all(&ua).unwrap();
    for i in 0..10 {
        put(&ub, &format!("f{i}"), b"x");
        put(&ua, &format!("g{i}"), b"x");
    }
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 3).unwrap();
    assert_eq!(list(&d), vec![added("/f0"), added("/f1"), added("/f2")]);
    assert_eq!((d.added, d.removed, d.modified), (10, 10, 0));
    // Directories compared once the list is full are still counted.
    for i in 0..5 {
        put(&ub, &format!("d1/f{i}"), b"x");
        put(&ub, &format!("d2/sub/g{i}"), b"x");
    }
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 3).unwrap();
    assert_eq!(
        list(&d),
        vec![added("/d1"), added("/d1/f0"), added("/d1/f1")]
    );
    assert_eq!((d.added, d.removed, d.modified), (23, 10, 0));
    assert_eq!(
        diff(&side(&ua, &[]), &side(&ub, &[]), "/", 0)
            .unwrap()
            .added,
        23
    );
}

/// Makes `depth` nested directories named `d` under `dir`, one descriptor at a time (their
/// paths are too long for the host to name in one go).
fn chain(dir: &Path, depth: usize) {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fd = openat(nix::fcntl::AT_FDCWD, dir, flags, Mode::empty()).unwrap();
    for _ in 0..depth {
        nix::sys::stat::mkdirat(&fd, c"d", Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(&fd, c"d", flags, Mode::empty()).unwrap();
    }
}

#[test]
fn a_very_deep_tree_fails_cleanly_on_a_small_stack() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir_all(&ua).unwrap();
    fs::create_dir_all(ub.join("ok")).unwrap();
    fs::create_dir_all(ub.join("deep")).unwrap();
    // 1 000 levels fit in a path; 20 000 do not.
    chain(&ub.join("ok"), 1000);
    chain(&ub.join("deep"), 20_000);
    let (a, b) = (side(&ua, &[]), side(&ub, &[]));
    let small = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || (diff(&a, &b, "/ok", 5), diff(&a, &b, "/", 5)))
        .unwrap();
    let (ok, deep) = small.join().unwrap();
    let ok = ok.unwrap();
    assert_eq!((ok.added, ok.entries.len()), (1001, 5));
    let e = deep.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Other);
    let msg = e.to_string();
    assert!(msg.starts_with("/deep/d/d/d/"), "{msg}");
    assert!(msg.contains("…") && msg.contains("too deep"), "{msg}");
    assert!(!msg.contains(tmp.path().to_str().unwrap()), "{msg}");
    // std's remove_dir_all recurses with a descriptor per level: too many here.
    sandbox_mcp_sys::fs_tree::remove_tree(tmp.path()).unwrap();
}

#[test]
fn shared_lowers_give_the_answer_a_full_walk_gives() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n);
    template(&p("t1"));
    template(&p("t2"));
    let (ua, ub) = (p("a"), p("b"));
    // a: edits in a copied-up directory, a deleted tree, an opaque directory.
    put(&ua, "etc/hostname", b"alpha\n");
    put(&ua, "etc/conf.d/c", b"c = 3\n");
    layers::whiteout(&ua.join("var")).unwrap();
    put(&ua, "tmp/scratch/1", b"1");
    // b: other edits, some the same as a's.
    // (Not the same size: written within one clock tick, same-size files would have one
    // mtime and be taken as equal.)
    put(&ub, "etc/hostname", b"beta\n");
    put(&ub, "etc/conf.d/c", b"c = 3\n");
    layers::mark_opaque(&ub.join("etc/conf.d")).unwrap();
    put(&ub, "usr/bin/tool", b"#!/bin/sh\necho bye\n");
    put(&ub, "home/me/notes", b"n");
    layers::whiteout(&ub.join("bin")).unwrap();
    let shared = diff(&side(&ua, &[&p("t1")]), &side(&ub, &[&p("t1")]), "/", 100).unwrap();
    let full = diff(&side(&ua, &[&p("t1")]), &side(&ub, &[&p("t2")]), "/", 100).unwrap();
    let expected = vec![
        removed("/bin"),
        removed("/etc/conf.d/a"),
        removed("/etc/conf.d/b"),
        modified("/etc/hostname", &["content"]),
        added("/home"),
        added("/home/me"),
        added("/home/me/notes"),
        removed("/tmp/scratch"),
        removed("/tmp/scratch/1"),
        modified("/usr/bin/tool", &["content"]),
        added("/var"),
        added("/var/lib"),
        added("/var/lib/data"),
    ];
    assert_eq!(list(&shared), expected);
    assert_eq!(list(&full), expected);
    // Two sides on one template with nothing written: nothing to say.
    fs::create_dir_all(p("e1")).unwrap();
    let d = diff(
        &side(&p("e1"), &[&p("t1")]),
        &side(&p("e2"), &[&p("t1")]),
        "/",
        9,
    )
    .unwrap();
    assert_eq!((d.added, d.removed, d.modified), (0, 0, 0));
    // A snapshot's layer above the same template: the rest of the template is shared.
    let d = diff(
        &side(&p("e1"), &[&ua, &p("t1")]),
        &side(&p("e2"), &[&p("t1")]),
        "/",
        100,
    )
    .unwrap();
    assert_eq!(
        list(&d),
        vec![
            removed("/etc/conf.d/c"),
            modified("/etc/hostname", &["content"]),
            removed("/tmp/scratch"),
            removed("/tmp/scratch/1"),
            added("/var"),
            added("/var/lib"),
            added("/var/lib/data"),
        ]
    );
}

/// Two forks of one parent whose upper holds 20 000 files (100 MB), each fork's upper a
/// copy keeping mtimes, a few changes in one. Run with
/// `cargo test --release -p sandbox-mcp-storage diff::walk -- --ignored --nocapture`.
#[test]
#[ignore = "writes 200 MB; a measurement"]
fn timing_of_two_forks_of_a_large_upper() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n);
    for i in 0..2000 {
        put(
            &p("template"),
            &format!("usr/lib/{}/f{i}", i % 50),
            &[1; 300],
        );
    }
    let body = vec![b'x'; 5000];
    let (ua, ub) = (p("a"), p("b"));
    let started = std::time::Instant::now();
    for i in 0..20_000u64 {
        let rel = format!("work/d{}/f{i}.txt", i % 200);
        for upper in [&ua, &ub] {
            put(upper, &rel, &body);
            set_mtime(&upper.join(&rel), 1_700_000_000 + i);
        }
    }
    eprintln!("made 2 x 20 000 files in {:?}", started.elapsed());
    for i in 0..10 {
        let rel = format!("work/d{}/f{i}.txt", i % 200);
        put(&ub, &rel, &vec![b'y'; 5000]);
        put(&ub, &format!("work/new/n{i}"), b"new");
        // Deleted in b: its upper's copy gives way to a whiteout.
        let gone = ub.join(format!("work/d{}/f{}.txt", (100 + i) % 200, 100 + i));
        fs::remove_file(&gone).unwrap();
        layers::whiteout(&gone).unwrap();
    }
    let (a, b) = (side(&ua, &[&p("template")]), side(&ub, &[&p("template")]));
    // CPU time too: on a shared machine the wall clock also measures the neighbours.
    let cpu = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    };
    for round in 0..5 {
        let (started, cpu_started) = (std::time::Instant::now(), cpu());
        let d = diff(&a, &b, "/", 1000).unwrap();
        eprintln!(
            "diff {round}: {:?} ({:?} of CPU; {} added, {} removed, {} modified)",
            started.elapsed(),
            cpu() - cpu_started,
            d.added,
            d.removed,
            d.modified
        );
        assert_eq!((d.added, d.removed, d.modified), (11, 10, 10));
    }
    // The worst case: every mtime differs, so all 2 x 100 MB are read.
    for i in 0..20_000u64 {
        let rel = format!("work/d{}/f{i}.txt", i % 200);
        if ub.join(&rel).metadata().is_ok_and(|m| m.len() > 0) {
            set_mtime(&ub.join(&rel), 1);
        }
    }
    let started = std::time::Instant::now();
    let d = diff(&a, &b, "/", 1000).unwrap();
    eprintln!("diff reading every file: {:?}", started.elapsed());
    assert_eq!((d.added, d.removed, d.modified), (11, 10, 10));
}
