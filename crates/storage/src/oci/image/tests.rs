//! Importing each accepted form end to end, and refusing images whose metadata is for another
//! platform, too large, or does not match the digests that name it.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde_json::json;
use tar::EntryType;

use super::super::fixture::*;
use super::super::{Limits, import};
use super::*;

#[test]
fn imports_each_form() {
    let forms = [
        (Form::Docker, false),
        (Form::OciArchive, true),
        (Form::OciLayout, false),
        (Form::OciLayout, true),
    ];
    for (form, gzip) in forms {
        let bottom = Layer::new()
            .dir("./", 0o755)
            .dir("etc", 0o755)
            .file("etc/hello", b"hello", 0o644)
            .dir("bin/", 0o755)
            .file("bin/tool", b"#!/bin/sh\n", 0o755)
            .symlink("bin/alias", "tool")
            .link("bin/same", "./bin/tool")
            .file("deep//./implicit/file", b"x", 0o600)
            .dir("private", 0o700)
            .raw(EntryType::Fifo, b"run/pipe", b"", 0o620, b"", |_| {})
            .raw(
                EntryType::Regular,
                b"caf\xe9",
                b"",
                0o644,
                b"latin-1",
                |_| {},
            )
            .bytes();
        let top = Layer::new()
            .file("./etc/hello", b"bye", 0o640)
            .dir("readonly", 0o555)
            .file("readonly/f", b"r", 0o444)
            .bytes();
        let run = run_with(
            form,
            vec![bottom, top],
            gzip,
            json!({}),
            &Limits::default(),
            false,
        );
        let image = run.image();
        assert_eq!(image.layers, vec![run.layer(0), run.layer(1)], "{form:?}");
        let (l0, l1) = (&image.layers[0], &image.layers[1]);
        assert_eq!(fs::read(l0.join("etc/hello")).unwrap(), b"hello");
        assert_eq!(fs::read(l1.join("etc/hello")).unwrap(), b"bye");
        assert_eq!(mode_of(&l1.join("etc/hello")), 0o640);
        assert_eq!(mode_of(&l0.join("bin/tool")), 0o755);
        assert_eq!(
            fs::read_link(l0.join("bin/alias")).unwrap(),
            Path::new("tool")
        );
        let ino = |p: &str| fs::symlink_metadata(l0.join(p)).unwrap().ino();
        assert_eq!(ino("bin/same"), ino("bin/tool"));
        assert_eq!(fs::read(l0.join("deep/implicit/file")).unwrap(), b"x");
        assert_eq!(mode_of(&l0.join("deep/implicit")), 0o755);
        assert_eq!(mode_of(&l0.join("private")), 0o700);
        assert_eq!(mode_of(&l1.join("readonly")), 0o555);
        assert_eq!(fs::read(l1.join("readonly/f")).unwrap(), b"r");
        let pipe = fs::symlink_metadata(l0.join("run/pipe")).unwrap();
        assert!(pipe.file_type().is_fifo());
        assert_eq!(pipe.mode() & 0o7777, 0o620);
        assert_eq!(
            fs::read(l0.join(OsStr::from_bytes(b"caf\xe9"))).unwrap(),
            b"latin-1"
        );
        for p in ["etc/hello", "etc", "bin"] {
            let mtime = fs::symlink_metadata(l0.join(p)).unwrap().mtime();
            assert_eq!(mtime as u64, MTIME, "{p}");
        }

        let env = [("PATH", "/usr/bin:/bin"), ("EQ", "a=b")].map(|(k, v)| (k.into(), v.into()));
        assert_eq!(image.env, env);
        assert_eq!(image.workdir.as_deref(), Some("/app"));
        assert_eq!(image.user.as_deref(), Some("1000:1000"));
        assert_eq!(image.architecture, host_arch());
        assert_eq!(image.files, 11 + 3);
        assert_eq!(image.bytes, 5 + 10 + 1 + 7 + 3 + 1);
    }
}

#[test]
fn refuses_blobs_whose_digest_does_not_match() {
    let layer = Layer::new().file("f", b"data", 0o644).bytes();
    let digest = sha256(&gz(&layer));
    let tmp = tempfile::tempdir().unwrap();
    let source = image(
        tmp.path(),
        Form::OciLayout,
        vec![layer.clone()],
        true,
        json!({}),
    );
    let blob = source.join("blobs/sha256").join(&digest["sha256:".len()..]);
    let mut bytes = fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&blob, bytes).unwrap();
    let run = import_source(tmp, &source, &Limits::default(), false);
    let msg = run.error();
    assert!(
        msg.contains(&format!("layer 0 ({digest}) has the digest sha256:")),
        "{msg}"
    );
    assert!(!run.layer(0).exists(), "verified before unpacking");

    let wrong = format!("sha256:{}", "0".repeat(64));
    let config = json!({"rootfs": {"type": "layers", "diff_ids": [wrong]}});
    let run = run_with(
        Form::Docker,
        vec![layer],
        false,
        config,
        &Limits::default(),
        false,
    );
    let msg = run.error();
    assert!(
        msg.contains(&format!("not to {wrong}, the diff_id its config gives")),
        "{msg}"
    );
}

#[test]
fn refuses_other_platforms() {
    let other = if host_arch() == "arm64" {
        "amd64"
    } else {
        "arm64"
    };
    for form in [Form::Docker, Form::OciArchive] {
        let layer = Layer::new().file("f", b"", 0o644).bytes();
        let config = json!({"architecture": other});
        let msg = run_with(form, vec![layer], false, config, &Limits::default(), false).error();
        let expected = format!(
            "the image is for linux/{other}; this engine runs linux/{}",
            host_arch()
        );
        assert!(msg.starts_with(&expected), "{form:?}: {msg}");
    }
    let config = json!({"os": "windows"});
    let msg = run_with(
        Form::Docker,
        vec![],
        false,
        config,
        &Limits::default(),
        false,
    )
    .error();
    assert!(msg.starts_with("the image is for windows/"), "{msg}");
}

#[test]
fn refuses_oversized_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["manifest.json", "index.json"] {
        let source = tmp.path().join(format!("{name}.tar"));
        fs::write(
            &source,
            tar_of(&[(name.to_string(), vec![b' '; 5 << 20])], false),
        )
        .unwrap();
        let work = tmp.path().join("work");
        let msg = import(&source, &work, &Limits::default(), false)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("{name} is 5242880 bytes, larger than the 4 MiB")),
            "{msg}"
        );
    }
    // A GNU long name the tar crate would read into memory whole.
    let long = [vec![b'a'; 2 << 20], vec![0]].concat();
    let layer = Layer::new()
        .file("first", b"", 0o644)
        .raw(
            EntryType::GNULongName,
            b"././@LongLink",
            b"",
            0o644,
            &long,
            |_| {},
        )
        .file("short", b"", 0o644);
    let msg = run(vec![layer.bytes()]).error();
    assert!(msg.contains("more than 1 MiB of tar metadata"), "{msg}");

    let layers = vec![Layer::new().bytes(); MAX_LAYERS + 1];
    let msg = run(layers).error();
    assert!(
        msg.contains("the image has 129 layers and at most 128 can be imported"),
        "{msg}"
    );
}
