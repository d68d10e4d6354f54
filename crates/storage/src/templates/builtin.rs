//! The built-in templates, built from the host's own userland: `base` (a skeleton root with a
//! curated /etc over the host's /usr and friends, shown read-only) and `desktop` (the same files,
//! a desktop-sized shape; built only where the host has Xvfb).
//!
//! Nothing of the host that could be a secret reaches a template: /etc is copied file by file
//! from lists of what programs need (files of at most 1 MiB, regular files and symlinks only,
//! never a `private` directory), and passwd, group, hosts and the resolver configuration are
//! written by the engine. A build happens in a temporary directory renamed into place, so a crash
//! never leaves a half-built template behind. The engine's egress CA is added to base's trust
//! store (`trust`), so every sandbox trusts it from creation on.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use sandbox_mcp_model::driver::Shape;

use super::{BASE, DESKTOP, TemplateFile};

const BASE_VERSION: u32 = 1;
const DESKTOP_VERSION: u32 = 1;

/// A template built from the host's own userland.
pub(crate) struct Builtin {
    pub(crate) name: &'static str,
    version: u32,
    description: &'static str,
    pub(crate) shape: Shape,
}

pub(crate) const BUILTINS: [Builtin; 2] = [
    Builtin {
        name: BASE,
        version: BASE_VERSION,
        description: "Debian userland of the host, read-only with copy-on-write: sh, bash, coreutils, python3, node and whatever else the host's /usr holds.",
        shape: Shape {
            vcpus: 1.0,
            memory_mb: 1024,
            disk_mb: 4096,
            max_pids: 512,
        },
    },
    Builtin {
        name: DESKTOP,
        version: DESKTOP_VERSION,
        description: "For computer_create: the host's userland like base, with room for a desktop (Xvfb, a window manager and GUI apps come from the host's packages).",
        shape: Shape {
            vcpus: 2.0,
            memory_mb: 2048,
            disk_mb: 4096,
            max_pids: 1024,
        },
    },
];

/// Whether the host can run desktops: the `desktop` template is built only then.
fn host_has_xvfb() -> bool {
    ["/usr/bin/Xvfb", "/usr/local/bin/Xvfb"]
        .iter()
        .any(|p| Path::new(p).is_file())
}

/// Largest file copied from the host's /etc.
const MAX_ETC_FILE: u64 = 1 << 20;

/// Builds each built-in template that is missing (the desktop one only where the host has
/// Xvfb), and brings the /etc of those already built up to date.
pub(crate) fn build_or_refresh(templates_dir: &Path) -> io::Result<()> {
    for builtin in &BUILTINS {
        let dir = templates_dir.join(builtin.name);
        if dir.join("template.json").exists() {
            let etc = dir.join("rootfs/etc");
            write_resolver_files(&etc)?;
            // Directories added to ETC_DIRS since the template was built (new files only).
            for name in ETC_DIRS {
                if !etc.join(name).exists() {
                    copy_tree(&Path::new("/etc").join(name), &etc.join(name))?;
                }
            }
        } else if builtin.name != DESKTOP || host_has_xvfb() {
            build_builtin(templates_dir, builtin)?;
        }
    }
    Ok(())
}

/// Builds a built-in template in a temporary directory and renames it into place, so a crash
/// never leaves a half-built template behind.
fn build_builtin(templates_dir: &Path, builtin: &Builtin) -> io::Result<()> {
    let tmp = templates_dir.join(format!(".{}.building-{}", builtin.name, std::process::id()));
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
        host_dirs,
        ..TemplateFile::ready(
            builtin.name,
            builtin.description.into(),
            builtin.version,
            builtin.shape,
        )
    };
    fs::write(
        tmp.join("template.json"),
        serde_json::to_vec_pretty(&file).map_err(io::Error::other)?,
    )?;
    let dest = templates_dir.join(builtin.name);
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
const ETC_DIRS: [&str; 11] = [
    "ld.so.conf.d",
    "alternatives",
    "ca-certificates",
    "profile.d",
    "skel",
    "terminfo",
    "python3",
    "python3.11",
    "ssl/certs",
    // Font configuration (fontconfig) and X11's: desktop apps need them.
    "fonts",
    "X11",
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
    ]
    .into_iter()
    .chain(ETC_SYNTHESIZED.map(|(n, c)| (n, c.to_string())));
    for (name, content) in synthesized {
        fs::write(etc.join(name), content)?;
    }
    write_resolver_files(etc)
}

/// `hosts` and `hostname`, the same in every sandbox.
const ETC_SYNTHESIZED: [(&str, &str); 2] = [
    (
        "hosts",
        "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    ),
    ("hostname", "sandbox\n"),
];

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

/// The files of /etc the engine gives every sandbox, whatever its userland: the resolver, the
/// hosts file and the host name.
pub fn engine_etc_files() -> Vec<(&'static str, &'static str)> {
    let mut files = vec![(RESOLVER_FILES[0].0, RESOLVER_FILES[0].1)];
    files.extend(ETC_SYNTHESIZED);
    files
}

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

/// Puts the engine's egress CA in the base template's trust store: the host's bundle plus the
/// CA as `/etc/ssl/certs/ca-certificates.crt`, and the CA alone beside it (for
/// `NODE_EXTRA_CA_CERTS`). Written only when it changed, so running sandboxes' lower layer is
/// left alone once it is right. Every sandbox trusts it from creation on, so binding a first
/// secret later needs no restart.
pub fn trust(templates_dir: &Path, ca_pem: &str) -> io::Result<()> {
    let certs = templates_dir.join(BASE).join("rootfs/etc/ssl/certs");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&certs)?;
    let host = fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    let bundle = bundle_with(&host, ca_pem);
    for (name, content) in [
        ("ca-certificates.crt", bundle.as_str()),
        ("sandbox-mcp-egress-ca.pem", ca_pem),
    ] {
        let path = certs.join(name);
        if fs::read_to_string(&path).ok().as_deref() != Some(content) {
            // A symlink copied from the host is replaced by the file, never written through.
            let _ = fs::remove_file(&path);
            sandbox_mcp_sys::durable::write_atomically(&path, content.as_bytes(), 0o644)?;
        }
    }
    Ok(())
}

/// A trust store: `bundle` (PEM certificates, possibly empty) with `ca_pem` added.
pub fn bundle_with(bundle: &str, ca_pem: &str) -> String {
    let mut all = bundle.to_string();
    if !all.is_empty() && !all.ends_with('\n') {
        all.push('\n');
    }
    all.push_str(ca_pem);
    all
}
