//! Importing an OCI image as a template: the archive is unpacked by [`sandbox_mcp_storage::oci`] into
//! a scratch directory, each layer is moved into the layer store, and a small top layer gives
//! the image what every sandbox needs from the engine (its resolver, its host name, the egress
//! CA in the trust store). The template is written last, so a failed import leaves nothing.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::templates::Templates;
use crate::driver::blocking;
use crate::error::EngineError;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_storage::oci;
use sandbox_mcp_storage::templates::{
    self, BASE, MAX_LAYERS, Template, TemplateFile, TemplateStatus,
};
use sandbox_mcp_sys::layers;
use sandbox_mcp_sys::stack;

/// Where the trust store of most distributions is, inside the image.
const BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
/// Largest image file the engine reads (`/etc/passwd`, the CA bundle).
const MAX_READ: u64 = 8 << 20;

impl Templates {
    /// Imports the image archive at `source` (a file or an OCI layout directory) as template
    /// `name` of `tenant` (none: a shared one, the operator's), ready at once.
    pub async fn import_template(
        &self,
        tenant: Option<&str>,
        name: &str,
        source: PathBuf,
    ) -> Result<Arc<Template>, EngineError> {
        let _guard = self.lock.lock().await;
        let (config, existing, n) = (
            self.config.clone(),
            self.catalog.templates(),
            name.to_string(),
        );
        let owner = tenant.map(str::to_string);
        let file = blocking(move || {
            let existing: Vec<&Template> = existing.iter().map(|t| &**t).collect();
            import(&config, &existing, owner.as_deref(), &n, &source)
        })
        .await??;
        self.catalog.put(file).await
    }
}

/// Imports the image archive at `source` into the data dir's layer store as template `name` of
/// `owner` (none: shared), beside the `existing` templates; returns its file, for the caller to
/// save. Blocking. Used by the engine, and by `sandbox-mcp template import` when no engine
/// serves the data dir.
pub fn import(
    config: &EngineConfig,
    existing: &[&Template],
    owner: Option<&str>,
    name: &str,
    source: &Path,
) -> Result<TemplateFile, EngineError> {
    templates::check_name(name).map_err(EngineError::InvalidArgument)?;
    if templates::is_builtin(name) {
        return Err(EngineError::Conflict(format!(
            "{name} is a built-in template; choose another name"
        )));
    }
    if owner.is_some() && existing.iter().any(|t| t.key == name) {
        return Err(EngineError::Conflict(format!(
            "{name} is a shared template (the engine's operator's); choose another name"
        )));
    }
    let key = templates::key_of(owner, name);
    if existing
        .iter()
        .any(|t| t.key == key && t.status() != TemplateStatus::Failed)
    {
        return Err(EngineError::Conflict(format!(
            "template {name} already exists; delete it first or choose another name"
        )));
    }
    let base_shape = existing
        .iter()
        .find(|t| t.name == BASE)
        .map(|t| t.shape)
        .ok_or_else(|| EngineError::NotFound("the base template is missing".into()))?;
    let store = layers::dir(&config.data_dir);
    let ca = fs::read_to_string(config.data_dir.join("egress-ca.pem")).unwrap_or_default();
    let chown = nix::unistd::geteuid().is_root();
    let work = layers::scratch(&store).map_err(EngineError::Templates)?;
    fs::create_dir(&work).map_err(EngineError::Templates)?;
    let made = unpack(source, &work, &store, &ca, chown, name);
    // Whatever happened, the scratch directory goes (the layers moved out of it).
    let _ = sandbox_mcp_sys::fs_tree::remove_tree(&work);
    let Unpacked {
        layers,
        image,
        user,
    } = made?;
    let mut env = image.env;
    if let Some((_, _, Some(home))) = &user
        && !env.iter().any(|(k, _)| k == "HOME")
    {
        env.push(("HOME".into(), home.clone()));
    }
    Ok(TemplateFile {
        name: name.to_string(),
        owner: owner.map(str::to_string),
        description: format!(
            "Imported OCI image (linux/{}, {} layer(s), {} files, {} MB): its own userland, not the host's.",
            image.architecture,
            image.layers.len(),
            image.files,
            image.bytes.div_ceil(1 << 20)
        ),
        version: 1,
        shape: base_shape,
        host_dirs: Vec::new(),
        layers,
        foreign: true,
        parent: None,
        env,
        workdir: image.workdir,
        user: user.map(|(uid, gid, _)| (uid, gid)),
        status: TemplateStatus::Ready,
        failure: None,
        size_bytes: image.bytes,
        created_at: sandbox_mcp_model::ids::now_ms(),
        warm: 0,
        captured_from: None,
    })
}

/// An unpacked image: its layers in the store, and its `User` as uid, gid and home.
struct Unpacked {
    layers: Vec<String>,
    image: oci::Image,
    user: Option<(u32, u32, Option<String>)>,
}

/// Unpacks the image and moves its layers (and the engine's top layer) into the store. Every
/// refusal comes before the first layer is published, and a failure after it takes the
/// published layers back, so nothing is left behind.
fn unpack(
    source: &Path,
    work: &Path,
    store: &Path,
    ca: &str,
    chown: bool,
    name: &str,
) -> Result<Unpacked, EngineError> {
    let refused = |m: String| EngineError::InvalidArgument(format!("cannot import the image: {m}"));
    // What the image is to blame for is the caller's to fix; the host's own I/O is not.
    let image = oci::import(source, work, &oci::Limits::default(), chown).map_err(|e| match e {
        e @ oci::ImportError::Io { .. } => EngineError::Templates(io::Error::other(e)),
        e => refused(e.to_string()),
    })?;
    if image.layers.is_empty() {
        return Err(refused("it has no layers".into()));
    }
    if image.layers.len() + 1 > MAX_LAYERS {
        return Err(refused(format!(
            "it has {} layers; a template holds at most {}",
            image.layers.len(),
            MAX_LAYERS - 1
        )));
    }
    // Read as a sandbox of the image would see them, never through the image's symlinks to the
    // host's files.
    let read = |rel: &str| -> Result<String, EngineError> {
        match stack::read_file(&image.layers, rel, MAX_READ) {
            Ok(bytes) => Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned()),
            Err(e) => Err(refused(format!("reading its /{rel}: {e}"))),
        }
    };
    let user = match image.user.as_deref().filter(|u| !u.is_empty()) {
        Some(spec) => Some(resolve_user(spec, &read("etc/passwd")?).map_err(refused)?),
        None => None,
    };
    let bundle = read(BUNDLE)?;
    let nonce = sandbox_mcp_model::ids::nonce();
    let mut published = Vec::new();
    let moved = (|| -> io::Result<()> {
        for (i, dir) in image.layers.iter().enumerate() {
            let tmp = layers::scratch(store)?;
            fs::create_dir(&tmp)?;
            fs::rename(dir, tmp.join("root"))?;
            let id = layers::id_of(&[name.as_bytes(), nonce.as_bytes(), &(i as u64).to_le_bytes()]);
            layers::publish(&tmp, store, &id)?;
            published.push(id);
        }
        // The engine's own files, on top of the image's.
        let tmp = layers::scratch(store)?;
        engine_layer(&tmp, ca, &bundle)?;
        let id = layers::id_of(&[name.as_bytes(), nonce.as_bytes(), b"engine"]);
        layers::publish(&tmp, store, &id)?;
        published.push(id);
        Ok(())
    })();
    if let Err(e) = moved {
        // The ids carry this import's nonce: no other template uses them.
        for id in &published {
            let _ = sandbox_mcp_sys::fs_tree::remove_tree(&store.join(id));
        }
        return Err(EngineError::Templates(e));
    }
    Ok(Unpacked {
        layers: published,
        image,
        user,
    })
}

/// Resolves an image's `User` (`uid[:gid]` or `name[:group]`) with its own /etc/passwd: uid,
/// gid, and the home directory when the user is listed.
fn resolve_user(spec: &str, passwd: &str) -> Result<(u32, u32, Option<String>), String> {
    let (user, group) = spec.split_once(':').unwrap_or((spec, ""));
    let entry = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && (f[0] == user || f[2] == user)).then(|| {
            (
                f[2].parse::<u32>().ok(),
                f[3].parse::<u32>().ok(),
                f[5].to_string(),
            )
        })
    });
    let uid = user
        .parse::<u32>()
        .ok()
        .or_else(|| entry.as_ref().and_then(|e| e.0))
        .ok_or_else(|| format!("its User {user} is not in its /etc/passwd"))?;
    let gid = match group {
        "" => entry.as_ref().and_then(|e| e.1).unwrap_or(uid),
        g => g
            .parse::<u32>()
            .map_err(|_| format!("its User's group {g} is not numeric"))?,
    };
    if uid >= 65534 || gid >= 65534 {
        return Err(format!(
            "its User {spec} is outside the ids a sandbox maps (0-65533)"
        ));
    }
    Ok((uid, gid, entry.map(|e| e.2)))
}

/// `/etc/resolv.conf`, `/etc/hosts`, `/etc/hostname` as the base template has them, and the
/// image's trust store with the egress CA added.
fn engine_layer(dir: &Path, ca: &str, bundle: &str) -> io::Result<()> {
    let etc = dir.join("root/etc");
    fs::create_dir_all(etc.join("ssl/certs"))?;
    for (name, content) in templates::engine_etc_files() {
        fs::write(etc.join(name), content)?;
    }
    if !ca.is_empty() {
        fs::write(
            dir.join("root").join(BUNDLE),
            templates::bundle_with(bundle, ca),
        )?;
        fs::write(etc.join("ssl/certs/sandbox-mcp-egress-ca.pem"), ca)?;
    }
    // Mount points and directories every sandbox needs, which a minimal image may lack.
    for (d, mode) in [
        ("root", 0o755),
        ("root/etc", 0o755),
        ("root/etc/ssl", 0o755),
        ("root/etc/ssl/certs", 0o755),
        ("root/proc", 0o555),
        ("root/sys", 0o555),
        ("root/dev", 0o755),
        ("root/run", 0o755),
        ("root/tmp", 0o1777),
        ("root/root", 0o700),
    ] {
        use std::os::unix::fs::PermissionsExt;
        fs::create_dir_all(dir.join(d))?;
        fs::set_permissions(dir.join(d), fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
