//! OCI images built by the tests themselves (no registry is reachable): `docker save` archives
//! of layers made here, with real digests.

use std::path::Path;

use serde_json::{Value, json};
use sha2::Digest;

/// A layer tar: `(path, contents)` files, `(path, target)` symlinks, directories implied.
pub fn layer(files: &[(&str, &[u8], u32)], links: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut h = header();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data).unwrap();
    }
    for (path, target) in links {
        let mut h = header();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, path, target).unwrap();
    }
    b.into_inner().unwrap()
}

/// A tar entry as written: name, type, link target, data.
pub type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8], &'a [u8]);

/// A layer of entries written as given, names and link targets unchecked (the `tar` crate's
/// builder refuses `..` and absolute paths).
pub fn raw_layer(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, target, data) in entries {
        let mut h = header();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A header with the owner and time fields every real archive has.
fn header() -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

/// The SHA-256 of `data`, in lowercase hex (as digests are written in an image).
fn hex(data: &[u8]) -> String {
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A `docker save` archive of `layers` (bottom first) with `config` (`Env`, `WorkingDir`…).
pub fn docker_save(layers: &[Vec<u8>], config: Value) -> Vec<u8> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", hex(l)))
        .collect();
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config_bytes = serde_json::to_vec(&config).unwrap();
    let config_name = format!("{}.json", hex(&config_bytes));
    let layer_names: Vec<String> = layers
        .iter()
        .map(|l| format!("{}/layer.tar", hex(l)))
        .collect();
    let manifest =
        json!([{"Config": config_name, "RepoTags": ["test:latest"], "Layers": layer_names}]);
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = header();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    add(&config_name, &config_bytes);
    for (name, data) in layer_names.iter().zip(layers) {
        add(name, data);
    }
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    b.into_inner().unwrap()
}

/// A minimal busybox userland (statically linked): `/bin/sh` and the usual applets.
pub fn busybox_layer() -> Vec<u8> {
    let busybox = std::fs::read(Path::new("/bin/busybox")).expect("busybox-static is installed");
    let applets = [
        "sh", "ls", "cat", "echo", "id", "pwd", "mkdir", "rm", "env", "printf", "test", "sleep",
        "wc", "head", "uname", "true",
    ];
    let links: Vec<(String, &str)> = applets
        .iter()
        .map(|a| (format!("bin/{a}"), "busybox"))
        .collect();
    let links: Vec<(&str, &str)> = links.iter().map(|(p, t)| (p.as_str(), *t)).collect();
    layer(
        &[
            ("bin/busybox", &busybox, 0o755),
            (
                "etc/passwd",
                b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
                0o644,
            ),
            ("etc/os-release", b"ID=busybox-test\n", 0o644),
        ],
        &links,
    )
}
