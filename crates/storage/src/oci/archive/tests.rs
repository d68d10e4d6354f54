//! Reading the outer archive: links between its entries, truncation, and sources that are no
//! image at all.

use std::fs;

use serde_json::json;
use tar::EntryType;

use super::super::fixture::*;
use super::super::image::{host_arch, sha256};
use super::super::{Limits, import};

#[test]
fn old_docker_links_a_repeated_layer() {
    let layer = Layer::new().file("f", b"same", 0o644).bytes();
    let diff_id = sha256(&layer);
    let config = json!({"architecture": host_arch(), "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id, diff_id]}});
    let config = serde_json::to_vec(&config).unwrap();
    let manifest = json!([{"Config": "config.json", "Layers": ["a/layer.tar", "b/layer.tar"]}]);
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        if let Some(link) = link {
            h.set_entry_type(EntryType::Symlink);
            h.set_link_name(link).unwrap();
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    };
    add("a/layer.tar", &layer, None);
    add("b/layer.tar", b"", Some("../a/layer.tar"));
    add("config.json", &config, None);
    add(
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
        None,
    );
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("image.tar");
    fs::write(&source, b.into_inner().unwrap()).unwrap();
    let run = import_source(tmp, &source, &Limits::default(), false);
    run.image();
    assert_eq!(fs::read(run.layer(1).join("f")).unwrap(), b"same");
    assert!(run.image().env.is_empty() && run.image().workdir.is_none());
}

#[test]
fn refuses_truncated_archives_and_layers() {
    let layer = Layer::new().file("noise", &noise(64 << 10), 0o644).bytes();
    for form in [Form::Docker, Form::OciArchive] {
        let tmp = tempfile::tempdir().unwrap();
        let source = image(tmp.path(), form, vec![layer.clone()], false, json!({}));
        let bytes = fs::read(&source).unwrap();
        fs::write(&source, &bytes[..bytes.len() / 2]).unwrap();
        let msg = import_source(tmp, &source, &Limits::default(), false).error();
        assert!(msg.contains("is truncated or corrupt"), "{form:?}: {msg}");
    }
    // A layer cut short, its diff_id computed over what is left: the tar stream ends early.
    let cut = layer[..20 << 10].to_vec();
    let msg = run(vec![cut.clone()]).error();
    let expected = format!("layer 0 ({}) is truncated or corrupt", sha256(&cut));
    assert!(msg.contains(&expected), "{msg}");
    // The same for a gzip stream cut short.
    let blob = gz(&layer);
    let cut = blob[..blob.len() / 2].to_vec();
    let config = json!({"rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]}});
    let msg = run_with(
        Form::Docker,
        vec![cut],
        false,
        config,
        &Limits::default(),
        false,
    )
    .error();
    assert!(msg.contains("is truncated or corrupt"), "{msg}");
}

#[test]
fn refuses_what_is_not_an_image() {
    let tmp = tempfile::tempdir().unwrap();
    let three = "give a `docker save` tarball, an OCI archive (a tar of an OCI image layout) or an OCI image layout directory";
    let junk = tmp.path().join("junk");
    fs::write(&junk, noise(4096)).unwrap();
    let gzipped = tmp.path().join("image.tar.gz");
    fs::write(&gzipped, gz(&tar_of(&[("x".into(), vec![1])], false))).unwrap();
    let other_tar = tmp.path().join("other.tar");
    fs::write(&other_tar, tar_of(&[("x".into(), vec![1])], false)).unwrap();
    let empty_dir = tmp.path().join("dir");
    fs::create_dir(&empty_dir).unwrap();
    let cases = [
        (junk, "it is not a tar archive"),
        (gzipped, "it is gzip-compressed; decompress it first"),
        (other_tar, "neither manifest.json nor index.json"),
        (empty_dir, "neither manifest.json nor index.json"),
    ];
    for (source, why) in cases {
        let work = tmp.path().join("work");
        let msg = import(&source, &work, &Limits::default(), false)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(why) && msg.contains(three), "{msg}");
    }
}
