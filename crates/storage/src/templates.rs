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
//!
//! This file is the model (a template's file, its key, its layer stack as mounts) and the
//! templates directory on disk; `builtin` builds the built-in templates from the host.

mod builtin;

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandbox_mcp_model::driver::{MountLayers, Shape, TemplateLayout};

use builtin::BUILTINS;
pub use builtin::{bundle_with, engine_etc_files, trust};

pub const BASE: &str = sandbox_mcp_model::BASE_TEMPLATE;
/// The built-in template of desktop sandboxes (computer use): the files of `base` (every template
/// but an imported image is layered on base's root), with a desktop-sized shape. Built when the
/// host has Xvfb.
pub const DESKTOP: &str = sandbox_mcp_model::DESKTOP_TEMPLATE;

/// Whether `name` is a template the engine builds itself (and which cannot be replaced or deleted).
pub fn is_builtin(name: &str) -> bool {
    name == BASE || name == DESKTOP
}

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
    pub(crate) fn ready(name: &str, description: String, version: u32, shape: Shape) -> Self {
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
            captured_from: None,
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
    /// The sandbox it was captured from, when it was made from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured_from: Option<String>,
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

/// Writes a template's file atomically (its directory is made if missing). Only the engine reads
/// it: it names the template's layers, and a tenant's template holds files of its sandboxes.
pub fn save(templates_dir: &Path, file: &TemplateFile) -> io::Result<()> {
    let dir = templates_dir.join(file.key());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PASSAGE)
        .create(&dir)?;
    let bytes = serde_json::to_vec_pretty(file).map_err(io::Error::other)?;
    sandbox_mcp_sys::durable::write_atomically(&dir.join("template.json"), &bytes, 0o600)
}

/// The mode of the directories a sandbox's host ids pass through to reach its layers (the
/// overlay is mounted in the sandbox's user namespace) without listing them: another user of
/// the host cannot find a template's layers, whose ids only the engine's files name.
pub const PASSAGE: u32 = 0o711;

/// Closes what an older engine left open to listing or reading: the templates directory and each
/// template's, and their `template.json`.
fn close_to_others(templates_dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(templates_dir, fs::Permissions::from_mode(PASSAGE))?;
    for entry in fs::read_dir(templates_dir)?.flatten() {
        let dir = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(PASSAGE))?;
        match fs::set_permissions(dir.join("template.json"), fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            done => done?,
        }
    }
    Ok(())
}

/// Deletes the directory of the template `key` (its layers are collected separately).
pub fn remove(templates_dir: &Path, key: &str) -> io::Result<()> {
    sandbox_mcp_sys::fs_tree::remove_tree(&templates_dir.join(key))
}

/// Loads every template, building `base` first if it is missing. A build the engine was
/// running when it stopped is marked failed (its finished steps stay cached).
pub fn load(templates_dir: &Path, layers_dir: &Path) -> io::Result<Vec<Template>> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PASSAGE)
        .create(templates_dir)?;
    builtin::build_or_refresh(templates_dir)?;
    close_to_others(templates_dir)?;
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
