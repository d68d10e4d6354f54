//! Unpacking layers: what each entry type becomes, whiteouts, and every entry that would write
//! outside the layer, through a link, or past the limits.

use std::fs::{self, Permissions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use serde_json::json;
use tar::EntryType;

use sandbox_mcp_sys::layers;

use super::super::Limits;
use super::super::fixture::*;
use super::*;

#[test]
fn whiteouts_and_opaque_directories() {
    let probe = tempfile::tempdir().unwrap();
    let xattrs = layers::mark_opaque(probe.path());
    let bottom = Layer::new()
        .file("a/gone", b"1", 0o644)
        .file("a/kept", b"1", 0o644)
        .file("a/link", b"1", 0o644)
        .file("d/old", b"2", 0o644)
        .file("s/x", b"3", 0o644)
        .bytes();
    let mut top = Layer::new()
        .file("a/.wh.gone", b"", 0o644)
        // A whiteout is one whatever its entry type, and never counts as a device.
        .symlink("a/.wh.link", "anything")
        .raw(EntryType::Char, b"s/.wh.x", b"", 0o600, b"", |_| {})
        .file(".wh.top", b"", 0o644);
    if xattrs.is_ok() {
        top = top
            .file("d/.wh..wh..opq", b"", 0o644)
            .file("d/new", b"3", 0o644);
    }
    let run = run(vec![bottom, top.bytes()]);
    run.image();
    let l1 = run.layer(1);
    for hidden in ["a/gone", "a/link", "s/x", "top"] {
        let meta = fs::symlink_metadata(l1.join(hidden)).unwrap();
        assert!(meta.file_type().is_char_device(), "{hidden}");
        assert_eq!(meta.rdev(), 0, "{hidden}");
    }
    assert!(!l1.join("a/.wh.gone").exists() && !l1.join("a/kept").exists());
    match xattrs {
        Ok(()) => {
            assert_eq!(
                layers::get_xattr(&l1.join("d"), "user.overlay.opaque").as_deref(),
                Some(&b"y"[..])
            );
            assert!(l1.join("d/new").is_file() && !l1.join("d/.wh..wh..opq").exists());
            assert_eq!(
                layers::get_xattr(&run.layer(0).join("d"), "user.overlay.opaque"),
                None
            );
        }
        Err(e) => eprintln!(
            "skipping the opaque-directory check: this filesystem refuses user xattrs ({e})"
        ),
    }
}

#[test]
fn refuses_entries_that_leave_the_root() {
    for name in ["../../escaped", "a/../../../escaped", "./.."] {
        let run = run(vec![Layer::new().file(name, b"x", 0o644).bytes()]);
        let msg = run.error();
        assert!(
            msg.contains(&format!("entry {name} leaves the image root")),
            "{msg}"
        );
        assert!(!run.work.join("escaped").exists());
        assert!(!run.work.parent().unwrap().join("escaped").exists());
    }
    for name in [".wh..", "a/.wh..."] {
        let msg = run(vec![Layer::new().file(name, b"", 0o644).bytes()]).error();
        assert!(msg.contains("is a whiteout that names no file"), "{msg}");
    }
}

#[test]
fn absolute_names_land_inside_the_layer() {
    let before = fs::read("/etc/passwd").ok();
    let marker = b"sandbox-mcp oci test: must never reach the host\n";
    let run = run(vec![
        Layer::new().file("/etc/passwd", marker, 0o644).bytes(),
    ]);
    run.image();
    assert_eq!(fs::read(run.layer(0).join("etc/passwd")).unwrap(), marker);
    assert_eq!(fs::read("/etc/passwd").ok(), before);
}

#[test]
fn refuses_writes_through_symlinks() {
    let name = format!("sandbox-mcp-oci-test-{}", std::process::id());
    let cases = [
        (Layer::new().symlink("evil", "/etc"), "evil", "evil"),
        (Layer::new().symlink("up", "../../../../.."), "up", "up"),
        (
            Layer::new().dir("a", 0o755).symlink("a/b", "/etc"),
            "a/b/c",
            "a/b",
        ),
        (Layer::new().dir("d", 0o755).symlink("d", "/etc"), "d", "d"),
    ];
    for (layer, dir, link) in cases {
        let entry = format!("{dir}/{name}");
        let run = run(vec![layer.file(&entry, b"x", 0o644).bytes()]);
        let msg = run.error();
        assert!(
            msg.contains(&format!("entry {entry} writes through the symlink {link}")),
            "{msg}"
        );
        assert!(!Path::new("/etc").join(&name).exists());
        assert!(!run.work.parent().unwrap().join(&name).exists());
    }
    let msg = run(vec![
        Layer::new()
            .file("f", b"", 0o644)
            .file("f/g", b"", 0o644)
            .bytes(),
    ])
    .error();
    assert!(msg.contains("entry f/g needs f to be a directory"), "{msg}");
}

#[test]
fn directory_modes_never_land_through_a_later_symlink() {
    let target = tempfile::tempdir().unwrap();
    fs::set_permissions(target.path(), Permissions::from_mode(0o755)).unwrap();
    let target_name = target.path().to_str().unwrap();
    let run = run(vec![
        Layer::new()
            .dir("d", 0o700)
            .symlink("d", target_name)
            .bytes(),
    ]);
    run.image();
    assert!(
        fs::symlink_metadata(run.layer(0).join("d"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(mode_of(target.path()), 0o755);
}

#[test]
fn refuses_hard_links_outside_the_layer() {
    let not_ours = "is not a file of this layer";
    let cases = [
        ("/etc/shadow", not_ours),
        ("../../x", "leaves the image root"),
        ("missing", not_ours),
        ("s/passwd", not_ours),
        ("lnk", not_ours),
        ("dir", not_ours),
    ];
    for (target, why) in cases {
        let layer = Layer::new()
            .file("file", b"f", 0o644)
            .symlink("s", "/etc")
            .symlink("lnk", "file")
            .dir("dir", 0o755)
            .link("h", target);
        let run = run(vec![layer.bytes()]);
        let msg = run.error();
        let expected = format!("entry h is a hard link to {target}, which {why}");
        assert!(msg.contains(&expected), "{msg}");
        assert!(!run.layer(0).join("h").exists());
    }
    let lower = Layer::new().file("f", b"f", 0o644).bytes();
    let msg = run(vec![lower, Layer::new().link("h", "f").bytes()]).error();
    assert!(
        msg.contains("layer 1 (sha256:") && msg.contains(not_ours),
        "{msg}"
    );
}

#[test]
fn refuses_device_nodes() {
    for kind in [EntryType::Char, EntryType::Block] {
        let layer = Layer::new().raw(kind, b"dev/sda", b"", 0o660, b"", |h| {
            h.set_device_major(8).unwrap();
            h.set_device_minor(0).unwrap();
        });
        let run = run(vec![layer.bytes()]);
        let msg = run.error();
        assert!(msg.starts_with("layer 0 (sha256:"), "{msg}");
        assert!(msg.contains("entry dev/sda is a device node, and images may not carry devices"));
        assert!(fs::symlink_metadata(run.layer(0).join("dev/sda")).is_err());
    }
}

#[test]
fn strips_setuid_setgid_and_xattrs() {
    let records = [
        pax("SCHILY.xattr.user.evil", "1"),
        pax("SCHILY.xattr.security.capability", "x"),
    ];
    let layer = Layer::new()
        .file("bin/su", b"x", 0o4755)
        .file("bin/wall", b"x", 0o2755)
        .dir("shared", 0o2775)
        .dir("tmp", 0o1777)
        .raw(
            EntryType::XHeader,
            b"PaxHeaders/cap",
            b"",
            0o644,
            &records.concat(),
            |_| {},
        )
        .file("bin/ping", b"x", 0o755);
    let run = run(vec![layer.bytes()]);
    run.image();
    let l0 = run.layer(0);
    for (path, mode) in [
        ("bin/su", 0o755),
        ("bin/wall", 0o755),
        ("shared", 0o775),
        ("tmp", 0o1777),
    ] {
        assert_eq!(mode_of(&l0.join(path)), mode, "{path}");
    }
    assert_eq!(layers::get_xattr(&l0.join("bin/ping"), "user.evil"), None);
    assert_eq!(
        layers::get_xattr(&l0.join("bin/ping"), "security.capability"),
        None
    );
}

#[test]
fn sizes_count_before_any_data_is_read() {
    // The archive simply ends after the header: nothing may be read or written for it.
    let big = Layer::new().raw(EntryType::Regular, b"big", b"", 0o644, b"", |h| {
        h.set_size(10 << 30)
    });
    let run = run(vec![big.bytes()]);
    let msg = run.error();
    assert!(
        msg.contains("the image holds more than 8 GiB of files (the import limit"),
        "{msg}"
    );
    assert!(msg.contains("entry big of layer 0"), "{msg}");
    assert!(fs::symlink_metadata(run.layer(0).join("big")).is_err());

    // A sparse file counts at its apparent size (2 GiB here, 512 bytes in the archive).
    let sparse = |real: u64| {
        Layer::new().raw(
            EntryType::GNUSparse,
            b"sparse",
            b"",
            0o644,
            &[7; 512],
            |h| {
                let g = h.as_gnu_mut().unwrap();
                octal(&mut g.sparse[0].offset, real - 512);
                octal(&mut g.sparse[0].numbytes, 512);
                octal(&mut g.realsize, real);
            },
        )
    };
    let limits = Limits {
        max_bytes: 1 << 30,
        ..Limits::default()
    };
    let run = run_with(
        Form::Docker,
        vec![sparse(2 << 30).bytes()],
        false,
        json!({}),
        &limits,
        false,
    );
    let msg = run.error();
    assert!(msg.contains("more than 1 GiB of files"), "{msg}");
    assert!(fs::symlink_metadata(run.layer(0).join("sparse")).is_err());

    // Under the limit it unpacks, holes included.
    let run = run_with(
        Form::Docker,
        vec![sparse(1 << 20).bytes()],
        false,
        json!({}),
        &limits,
        false,
    );
    run.image();
    let data = fs::read(run.layer(0).join("sparse")).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(data[..(1 << 20) - 512].iter().all(|b| *b == 0) && data.ends_with(&[7; 512]));
    assert_eq!(run.image().bytes, 1 << 20);
}

#[test]
fn counts_entries_against_the_limit() {
    let limits = Limits {
        max_files: 1000,
        ..Limits::default()
    };
    let layer = |n: usize| {
        (0..n)
            .fold(Layer::new(), |l, i| l.file(&format!("f{i}"), b"", 0o644))
            .bytes()
    };
    let ok = run_with(
        Form::Docker,
        vec![layer(1000)],
        false,
        json!({}),
        &limits,
        false,
    );
    assert_eq!(ok.image().files, 1000);
    let msg = run_with(
        Form::Docker,
        vec![layer(1001)],
        false,
        json!({}),
        &limits,
        false,
    )
    .error();
    assert!(
        msg.contains("more than 1000 files and directories"),
        "{msg}"
    );
}

#[test]
fn root_and_metadata_entries() {
    let layer = Layer::new()
        .raw(
            EntryType::XGlobalHeader,
            b"pax_global_header",
            b"",
            0o644,
            &pax("comment", "x"),
            |_| {},
        )
        .dir("./", 0o750)
        .file("/", b"not the root", 0o644)
        .file("f", b"f", 0o644);
    let ok = run(vec![layer.bytes()]);
    ok.image();
    assert_eq!(mode_of(&ok.layer(0)), 0o750);
    assert_eq!(fs::read(ok.layer(0).join("f")).unwrap(), b"f");

    let unknown = Layer::new().raw(EntryType::new(b'D'), b"dumpdir", b"", 0o755, b"", |_| {});
    let msg = run(vec![unknown.bytes()]).error();
    assert!(
        msg.contains("entry dumpdir has the tar entry type 'D', which this importer does not know"),
        "{msg}"
    );
}

#[test]
fn refuses_zstd_and_unknown_layers() {
    let zstd = [&ZSTD_MAGIC[..], &[0; 64]].concat();
    let msg = run(vec![zstd]).error();
    assert!(
        msg.contains("zstd layers are not supported yet: re-save the image with gzip"),
        "{msg}"
    );
    let msg = run(vec![b"BZh91AY&SY not a tar".to_vec()]).error();
    assert!(
        msg.contains("is neither a tar archive nor a gzip-compressed one"),
        "{msg}"
    );
}

#[test]
fn chown_takes_header_ids_clamped_to_nobody() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping the chown test: it needs root");
        return;
    }
    let ids = |uid: u64| {
        move |h: &mut tar::Header| {
            h.set_uid(uid);
            h.set_gid(uid);
        }
    };
    let layer = Layer::new()
        .raw(EntryType::Regular, b"mine", b"", 0o4755, b"x", ids(1000))
        .raw(EntryType::Regular, b"far", b"", 0o644, b"x", ids(70_000))
        .raw(EntryType::Directory, b"d", b"", 0o755, b"", ids(1000))
        .raw(EntryType::Symlink, b"l", b"mine", 0o777, b"", ids(1000))
        .bytes();
    let run = run_with(
        Form::Docker,
        vec![layer.clone()],
        false,
        json!({}),
        &Limits::default(),
        true,
    );
    run.image();
    for (path, id) in [("mine", 1000), ("far", 65534), ("d", 1000), ("l", 1000)] {
        let meta = fs::symlink_metadata(run.layer(0).join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (id, id), "{path}");
    }
    assert_eq!(mode_of(&run.layer(0).join("mine")), 0o755);
    let run = run_with(
        Form::Docker,
        vec![layer],
        false,
        json!({}),
        &Limits::default(),
        false,
    );
    run.image();
    assert_eq!(
        fs::symlink_metadata(run.layer(0).join("far"))
            .unwrap()
            .uid(),
        0
    );
}
