//! Templates: what a sandbox's filesystem starts from.
//!
//! A template is a directory under `<data>/templates/<name>/` holding `template.json` (name,
//! description, shape, host directories) and `rootfs/`, the lower layer of every sandbox's root.
//! The built-in `base` template is a skeleton root with a curated /etc; the host's /usr (and any
//! /bin, /lib… that are not symlinks into it) is shown read-only, copy-on-write, at the same path.
//! It never contains /root, /home, /work, /var or the engine's data dir of the host, nor any
//! secret from the host's /etc (shadow, ssh keys, TLS private keys, package-manager credentials).
//! More templates can be added by writing another directory with the same layout.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::driver::{Shape, TemplateLayout};

pub(crate) const BASE: &str = "base";
const BASE_VERSION: u32 = 1;
/// Largest file copied from the host's /etc.
const MAX_ETC_FILE: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ShapeFile {
    pub vcpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub max_pids: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct TemplateFile {
    pub name: String,
    pub description: String,
    pub version: u32,
    pub shape: ShapeFile,
    /// Host directories overlaid read-only at the same path.
    pub host_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Template {
    pub name: String,
    pub description: String,
    pub shape: Shape,
    pub layout: TemplateLayout,
}

impl Template {
    fn from_file(dir: &Path, file: TemplateFile) -> Self {
        Template {
            layout: TemplateLayout {
                name: file.name.clone(),
                rootfs: dir.join("rootfs"),
                host_dirs: file.host_dirs,
            },
            name: file.name,
            description: file.description,
            shape: Shape {
                vcpus: file.shape.vcpus,
                memory_mb: file.shape.memory_mb,
                disk_mb: file.shape.disk_mb,
                max_pids: file.shape.max_pids,
            },
        }
    }
}

/// Puts the engine's egress CA in the base template's trust store: the host's bundle plus the
/// CA as `/etc/ssl/certs/ca-certificates.crt`, and the CA alone beside it (for
/// `NODE_EXTRA_CA_CERTS`). Written only when it changed, so running sandboxes' lower layer is
/// left alone once it is right. Every sandbox trusts it from creation on, so binding a first
/// secret later needs no restart.
pub(crate) fn trust(templates_dir: &Path, ca_pem: &str) -> io::Result<()> {
    let certs = templates_dir.join(BASE).join("rootfs/etc/ssl/certs");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&certs)?;
    let host = fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    let mut bundle = host;
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca_pem);
    for (name, content) in [
        ("ca-certificates.crt", bundle.as_str()),
        ("sandbox-mcp-egress-ca.pem", ca_pem),
    ] {
        let path = certs.join(name);
        if fs::read_to_string(&path).ok().as_deref() != Some(content) {
            // A symlink copied from the host is replaced by the file, never written through.
            let _ = fs::remove_file(&path);
            crate::durable::write_atomically(&path, content.as_bytes(), 0o644)?;
        }
    }
    Ok(())
}

/// Loads every template, building `base` first if it is missing.
pub(crate) fn load(templates_dir: &Path) -> io::Result<Vec<Template>> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(templates_dir)?;
    let base = templates_dir.join(BASE);
    if !base.join("template.json").exists() {
        build_base(templates_dir)?;
    } else {
        write_resolver_files(&base.join("rootfs/etc"))?;
    }
    let mut out = Vec::new();
    for entry in fs::read_dir(templates_dir)?.flatten() {
        let dir = entry.path();
        let Ok(text) = fs::read_to_string(dir.join("template.json")) else {
            continue;
        };
        match serde_json::from_str::<TemplateFile>(&text) {
            Ok(file) if dir.file_name().is_some_and(|n| n == file.name.as_str()) => {
                out.push(Template::from_file(&dir, file));
            }
            Ok(_) => tracing::warn!(
                "{}: template name does not match its directory; skipped",
                dir.display()
            ),
            Err(e) => tracing::warn!("{}: invalid template.json: {e}; skipped", dir.display()),
        }
    }
    out.sort_by(|a, b| (a.name != BASE, &a.name).cmp(&(b.name != BASE, &b.name)));
    Ok(out)
}

/// Builds `base` in a temporary directory and renames it into place, so a crash never leaves a
/// half-built template behind.
fn build_base(templates_dir: &Path) -> io::Result<()> {
    let tmp = templates_dir.join(format!(".{BASE}.building-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let rootfs = tmp.join("rootfs");
    let mkdir = |p: &Path, mode: u32| -> io::Result<()> {
        fs::DirBuilder::new().recursive(true).mode(mode).create(p)?;
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
    };
    mkdir(&rootfs, 0o755)?;
    for (dir, mode) in [
        ("etc", 0o755),
        ("root", 0o700),
        ("home", 0o755),
        ("tmp", 0o1777),
        ("proc", 0o555),
        ("dev", 0o755),
        ("sys", 0o555),
        ("run", 0o755),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("var/log", 0o755),
        ("var/cache", 0o755),
        ("var/lib", 0o755),
        ("mnt", 0o755),
        ("opt", 0o755),
        ("srv", 0o755),
        ("media", 0o755),
    ] {
        mkdir(&rootfs.join(dir), mode)?;
    }
    // /usr and friends: replicate the host's symlinks (merged-/usr systems), overlay real dirs.
    let mut host_dirs = Vec::new();
    for name in ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = Path::new("/").join(name);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                std::os::unix::fs::symlink(fs::read_link(&host)?, rootfs.join(name))?;
            }
            Ok(m) if m.is_dir() => {
                mkdir(&rootfs.join(name), 0o755)?;
                host_dirs.push(host);
            }
            _ => {}
        }
    }
    build_etc(&rootfs.join("etc"))?;
    let file = TemplateFile {
        name: BASE.into(),
        description: "Debian userland of the host, read-only with copy-on-write: sh, bash, coreutils, python3, node and whatever else the host's /usr holds.".into(),
        version: BASE_VERSION,
        shape: ShapeFile {
            vcpus: 1.0,
            memory_mb: 1024,
            disk_mb: 4096,
            max_pids: 512,
        },
        host_dirs,
    };
    fs::write(
        tmp.join("template.json"),
        serde_json::to_vec_pretty(&file).map_err(io::Error::other)?,
    )?;
    let dest = templates_dir.join(BASE);
    match fs::rename(&tmp, &dest) {
        Ok(()) => Ok(()),
        // Another engine built it at the same moment: keep theirs.
        Err(_) if dest.join("template.json").exists() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Files of the host's /etc that programs need and that hold no secrets.
const ETC_FILES: [&str; 23] = [
    "ld.so.cache",
    "ld.so.conf",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
    "debian_version",
    "lsb-release",
    "profile",
    "bash.bashrc",
    "inputrc",
    "shells",
    "protocols",
    "services",
    "networks",
    "host.conf",
    "gai.conf",
    "login.defs",
    "ca-certificates.conf",
    "locale.alias",
    "magic",
    "magic.mime",
    "mke2fs.conf",
];
/// Directories of the host's /etc copied whole (regular files and symlinks only).
const ETC_DIRS: [&str; 9] = [
    "ld.so.conf.d",
    "alternatives",
    "ca-certificates",
    "profile.d",
    "skel",
    "terminfo",
    "python3",
    "python3.11",
    "ssl/certs",
];

fn build_etc(etc: &Path) -> io::Result<()> {
    let host = Path::new("/etc");
    for name in ETC_FILES {
        copy_entry(&host.join(name), &etc.join(name))?;
    }
    for name in ETC_DIRS {
        copy_tree(&host.join(name), &etc.join(name))?;
    }
    // python3.x directories other than the one listed.
    if let Ok(entries) = fs::read_dir(host) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("python3.") && !etc.join(&name).exists() {
                copy_tree(&e.path(), &etc.join(&name))?;
            }
        }
    }
    if host.join("ssl/openssl.cnf").is_file() {
        copy_entry(&host.join("ssl/openssl.cnf"), &etc.join("ssl/openssl.cnf"))?;
    }
    let shell = if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    let synthesized = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:{shell}\nuser:x:1000:1000:user:/home/user:{shell}\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            "root:x:0:\nusers:x:100:\nuser:x:1000:\nnogroup:x:65534:\n".to_string(),
        ),
        (
            "hosts",
            "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_string(),
        ),
        ("hostname", "sandbox\n".to_string()),
    ];
    for (name, content) in synthesized {
        fs::write(etc.join(name), content)?;
    }
    write_resolver_files(etc)
}

/// The resolver configuration every sandbox gets. Any nameserver address would do: the
/// sandbox's namespace steers every DNS query to the engine, whatever address it names.
const RESOLVER_FILES: [(&str, &str); 2] = [
    (
        "resolv.conf",
        "# The sandbox engine answers every DNS query, under the sandbox's network policy.\nnameserver 10.0.2.3\n",
    ),
    (
        "nsswitch.conf",
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
    ),
];

/// Writes [`RESOLVER_FILES`] where they differ (a `base` built before sandboxes had a network
/// gets them on the next start).
fn write_resolver_files(etc: &Path) -> io::Result<()> {
    for (name, content) in RESOLVER_FILES {
        let path = etc.join(name);
        if fs::read_to_string(&path).ok().as_deref() != Some(content) {
            fs::write(&path, content)?;
        }
    }
    Ok(())
}

/// Copies one file or symlink (not following it); anything else is skipped.
fn copy_entry(from: &Path, to: &Path) -> io::Result<()> {
    let Ok(meta) = fs::symlink_metadata(from) else {
        return Ok(());
    };
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)
    } else if meta.is_file() && meta.len() <= MAX_ETC_FILE {
        fs::copy(from, to)?;
        fs::set_permissions(
            to,
            fs::Permissions::from_mode(meta.permissions().mode() & 0o755),
        )
    } else {
        Ok(())
    }
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let Ok(meta) = fs::symlink_metadata(from) else {
        return Ok(());
    };
    if !meta.is_dir() {
        return copy_entry(from, to);
    }
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)?.flatten() {
        let name = entry.file_name();
        // Private keys never leave the host, whatever directory they sit in.
        if name == "private" {
            continue;
        }
        copy_tree(&entry.path(), &to.join(&name))?;
    }
    Ok(())
}
