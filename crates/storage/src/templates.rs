//! Templates: what a sandbox's filesystem starts from.
//!
//! A template is `<data>/templates/<name>/template.json`: its name, status, shape, environment and
//! the stack of read-only layers (`<data>/layers/<id>/`, see [`sandbox_mcp_sys::layers`]) a
//! sandbox's own writable layer goes on top of. The built-in `base` template also holds
//! `rootfs/`, a skeleton root with a curated /etc; the host's /usr (and any /bin, /lib… that are
//! not symlinks into it) is shown read-only, copy-on-write, at the same path. It never contains
//! /root, /home, /work, /var or the engine's data dir of the host, nor any secret from the host's
//! /etc (shadow, ssh keys, TLS private keys, package-manager credentials).
//!
//! Other templates are built from `base` or another template by steps, captured from a sandbox,
//! or imported from an OCI image; a template from an image is *foreign*: its layers are the whole
//! root, and nothing of the host's userland shows.
//!
//! A template belongs to the tenant that made it (`owner`), and only that tenant can see, use or
//! delete it; its name is its own, in that tenant's namespace. Templates with no owner — the
//! built-in ones, and those the engine's operator made or imported (untenanted) — are *shared*:
//! every tenant can list them and start sandboxes from them, none can delete or shadow them. The
//! engine knows a template by its [`TemplateFile::key`]: the name of a shared template, and
//! `name@tenant` for a tenant's (neither part can hold `@`), which is also its directory.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandbox_mcp_model::driver::{MountLayers, Shape, TemplateLayout};

pub const BASE: &str = sandbox_mcp_model::BASE_TEMPLATE;
const BASE_VERSION: u32 = 1;
/// The built-in template of desktop sandboxes (computer use): the files of `base` (every template
/// but an imported image is layered on base's root), with a desktop-sized shape. Built when the
/// host has Xvfb.
pub const DESKTOP: &str = sandbox_mcp_model::DESKTOP_TEMPLATE;
const DESKTOP_VERSION: u32 = 1;

/// Whether `name` is a template the engine builds itself (and which cannot be replaced or deleted).
pub fn is_builtin(name: &str) -> bool {
    name == BASE || name == DESKTOP
}

/// A template built from the host's own userland.
struct Builtin {
    name: &'static str,
    version: u32,
    description: &'static str,
    shape: Shape,
}

const BUILTINS: [Builtin; 2] = [
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
/// Most layers a template may stack (overlayfs allows 500; the mount options must fit a page).
pub const MAX_LAYERS: usize = 64;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TemplateStatus {
    Building,
    #[default]
    Ready,
    Failed,
}

/// Why a build failed: the step, its exit code and the end of its output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BuildFailure {
    /// 1-based index of the failing step (0: before any step ran).
    pub step: usize,
    /// The step as given (`run: …`).
    pub step_text: String,
    pub exit_code: Option<i64>,
    /// The last lines of the step's output (stdout then stderr).
    pub output_tail: String,
    /// What happened, in a sentence.
    pub message: String,
}

impl TemplateFile {
    /// A ready template with nothing but a name, a description and a shape: no layers, no host
    /// directories, no environment of its own.
    fn ready(name: &str, description: String, version: u32, shape: Shape) -> Self {
        TemplateFile {
            name: name.to_string(),
            owner: None,
            description,
            version,
            shape,
            host_dirs: Vec::new(),
            layers: Vec::new(),
            foreign: false,
            parent: None,
            env: Vec::new(),
            workdir: None,
            user: None,
            status: TemplateStatus::Ready,
            failure: None,
            size_bytes: 0,
            created_at: 0,
            warm: 0,
        }
    }
}

impl BuildFailure {
    /// A failure of step `step` (`step_text` as given) with no output to show.
    pub fn new(step: usize, step_text: &str, message: String) -> Self {
        BuildFailure {
            step,
            step_text: step_text.to_string(),
            exit_code: None,
            output_tail: String::new(),
            message,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TemplateFile {
    pub name: String,
    /// The tenant it belongs to; none: shared (built in, or the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub description: String,
    pub version: u32,
    pub shape: Shape,
    /// Host directories overlaid read-only at the same path (base and templates built on it).
    pub host_dirs: Vec<PathBuf>,
    /// Layer ids, bottom first: the whole stack (parents' layers included), so a template never
    /// depends on another template's file.
    #[serde(default)]
    pub layers: Vec<String>,
    /// From an image: the layers are the whole root (no base rootfs, no host directories).
    #[serde(default)]
    pub foreign: bool,
    /// The template this one was made from, for the record.
    #[serde(default)]
    pub parent: Option<String>,
    /// Environment every command starts with (an image's `Env`, a build's `env` steps).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory of commands when none is given (an image's `WorkingDir`).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Who commands run as: uid and gid inside the sandbox (an image's `User`).
    #[serde(default)]
    pub user: Option<(u32, u32)>,
    #[serde(default)]
    pub status: TemplateStatus,
    #[serde(default)]
    pub failure: Option<BuildFailure>,
    /// Bytes of file content in the template's own layers (not its parent's).
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default)]
    pub created_at: i64,
    /// Sandboxes kept started and idle for `create` to hand out at once.
    #[serde(default)]
    pub warm: u32,
}

impl TemplateFile {
    /// How the engine knows the template: its directory, and what a sandbox's record names.
    pub fn key(&self) -> String {
        key_of(self.owner.as_deref(), &self.name)
    }
}

/// The key of template `name` of `owner` (see the module's doc).
pub fn key_of(owner: Option<&str>, name: &str) -> String {
    match owner {
        Some(owner) => format!("{name}@{owner}"),
        None => name.to_string(),
    }
}

/// The name a key shows to its owner (and to everyone, for a shared template).
pub fn name_of_key(key: &str) -> &str {
    key.split_once('@').map_or(key, |(name, _)| name)
}

#[derive(Debug, Clone)]
pub struct Template {
    /// Its name, as its owner gave it.
    pub name: String,
    /// How the engine knows it (see [`TemplateFile::key`]).
    pub key: String,
    pub shape: Shape,
    pub layout: TemplateLayout,
    pub file: TemplateFile,
}

impl Template {
    pub fn new(templates_dir: &Path, layers_dir: &Path, file: TemplateFile) -> Self {
        Template {
            layout: layout(templates_dir, layers_dir, &file),
            name: file.name.clone(),
            key: file.key(),
            shape: file.shape,
            file,
        }
    }

    pub fn status(&self) -> TemplateStatus {
        self.file.status
    }

    /// The tenant it belongs to; none: shared.
    pub fn owner(&self) -> Option<&str> {
        self.file.owner.as_deref()
    }

    /// Whether `tenant` may see and use it: its own, or shared. The operator (no tenant) sees
    /// the shared ones; the engine's internal tenants reach templates by key, not through this.
    pub fn visible_to(&self, tenant: Option<&str>) -> bool {
        self.owner().is_none() || self.owner() == tenant
    }
}

/// The overlays of a template: each target's layer directories, top first, over the base rootfs
/// (or, for a foreign template, over nothing) and the host directory.
fn layout(templates_dir: &Path, layers_dir: &Path, file: &TemplateFile) -> TemplateLayout {
    let lowers = |sub: &str, bottom: Option<PathBuf>| -> Vec<PathBuf> {
        file.layers
            .iter()
            .rev()
            .map(|id| layers_dir.join(id).join(sub))
            .filter(|d| d.is_dir())
            .chain(bottom)
            .collect()
    };
    let base_root = (!file.foreign).then(|| templates_dir.join(BASE).join("rootfs"));
    let mut mounts = vec![MountLayers {
        target: "/".into(),
        lowers: lowers("root", base_root),
    }];
    if !file.foreign {
        for dir in &file.host_dirs {
            let target = dir.display().to_string();
            mounts.push(MountLayers {
                lowers: lowers(
                    &sandbox_mcp_sys::layers::layer_name(&target),
                    Some(dir.clone()),
                ),
                target,
            });
        }
    }
    TemplateLayout {
        name: file.key(),
        mounts,
    }
}

/// Template names: what a directory and a URL path segment can hold safely.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "template name {name:?} is invalid: use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
        ))
    }
}

/// Writes a template's file atomically (its directory is made if missing).
pub fn save(templates_dir: &Path, file: &TemplateFile) -> io::Result<()> {
    let dir = templates_dir.join(file.key());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)?;
    let bytes = serde_json::to_vec_pretty(file).map_err(io::Error::other)?;
    sandbox_mcp_sys::durable::write_atomically(&dir.join("template.json"), &bytes, 0o644)
}

/// Deletes the directory of the template `key` (its layers are collected separately).
pub fn remove(templates_dir: &Path, key: &str) -> io::Result<()> {
    sandbox_mcp_sys::fs_tree::remove_tree(&templates_dir.join(key))
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

/// Loads every template, building `base` first if it is missing. A build the engine was
/// running when it stopped is marked failed (its finished steps stay cached).
pub fn load(templates_dir: &Path, layers_dir: &Path) -> io::Result<Vec<Template>> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(templates_dir)?;
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
    let mut out = Vec::new();
    for entry in fs::read_dir(templates_dir)?.flatten() {
        let dir = entry.path();
        let Ok(text) = fs::read_to_string(dir.join("template.json")) else {
            continue;
        };
        match serde_json::from_str::<TemplateFile>(&text) {
            Ok(mut file) if dir.file_name().is_some_and(|n| *n == *file.key()) => {
                if file.status == TemplateStatus::Building {
                    file.status = TemplateStatus::Failed;
                    file.failure = Some(BuildFailure::new(
                        0,
                        "",
                        "the engine stopped during the build; create it again (finished steps are reused)".into(),
                    ));
                    save(templates_dir, &file)?;
                }
                out.push(Template::new(templates_dir, layers_dir, file));
            }
            Ok(_) => tracing::warn!(
                "{}: template name does not match its directory; skipped",
                dir.display()
            ),
            Err(e) => tracing::warn!("{}: invalid template.json: {e}; skipped", dir.display()),
        }
    }
    out.sort_by(|a, b| (a.key != BASE, &a.key).cmp(&(b.key != BASE, &b.key)));
    Ok(out)
}

/// Builds a built-in template in a temporary directory and renames it into place, so a crash
/// never leaves a half-built template behind.
/// A template that is a container image on a driver that runs images (the kubernetes driver):
/// no layers on this host, the shape of `base`.
pub fn image_template(
    templates_dir: &Path,
    layers_dir: &Path,
    name: &str,
    image: &str,
) -> Template {
    let shape = BUILTINS
        .iter()
        .find(|b| b.name == name)
        .unwrap_or(&BUILTINS[0])
        .shape;
    let file = TemplateFile {
        foreign: true,
        ..TemplateFile::ready(name, format!("The image {image}, run as a pod."), 1, shape)
    };
    Template::new(templates_dir, layers_dir, file)
}

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
