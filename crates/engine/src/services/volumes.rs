//! Named volumes and workspaces: what `volumes` on create mounts.
//!
//! A named volume is a directory the driver keeps apart from every sandbox, by a key the engine
//! derives from its owner and name; sandboxes bind-mount it, so every one that mounts it sees
//! the others' writes at once, and it outlives them all. A workspace is a host folder the
//! operator exposed by name (`--workspace`); a sandbox mounts it as one more overlay, the folder
//! its read-only lower layer and the sandbox's own upper on top, so the folder never changes
//! (see [`super::workspaces`] for reading the changes back). Names of both share one namespace
//! per tenant: a tenant cannot make a volume with a workspace's name.

use std::sync::Arc;

use sandbox_mcp_model::config::Workspace;
use sandbox_mcp_model::driver::{MountLayers, TemplateLayout, VolumeBind};
use sandbox_mcp_model::record::{MountSource, Mounted};
use sandbox_mcp_sys::lock;

use super::registry::Registry;
use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;
use crate::records::Records;
use crate::state::{Record, VolumeRow};

/// Quota of a volume whose creator names none, where the store enforces quotas.
pub const DEFAULT_QUOTA_MB: u64 = 1024;
/// Most volumes one tenant keeps.
pub const MAX_VOLUMES: u64 = 64;
/// Most volumes and workspaces one sandbox mounts.
pub const MAX_MOUNTS: usize = 8;
/// Entries walked to size a workspace's folder for a listing.
const SIZE_WALK: usize = 1_000_000;

/// A volume or workspace as the API lists it.
#[derive(Debug, Clone)]
pub struct VolumeView {
    pub name: String,
    pub workspace: bool,
    pub size_bytes: u64,
    pub quota_bytes: Option<u64>,
    pub read_only: bool,
    pub used_by: Vec<String>,
    pub created_at: Option<i64>,
}

/// A mount a create asks for, as the caller wrote it.
#[derive(Debug, Clone, Default)]
pub struct MountRequest {
    pub name: String,
    pub path: String,
    pub read_only: bool,
}

pub struct Volumes {
    driver: DriverHandle,
    records: Arc<Records>,
    registry: Arc<Registry>,
    workspaces: Vec<Workspace>,
    enforced: bool,
}

impl Volumes {
    pub(crate) fn new(
        driver: DriverHandle,
        records: Arc<Records>,
        registry: Arc<Registry>,
        workspaces: Vec<Workspace>,
    ) -> Self {
        let enforced = driver.capabilities().volume_quotas;
        Self {
            driver,
            records,
            registry,
            workspaces,
            enforced,
        }
    }

    fn supported(&self) -> Result<(), EngineError> {
        match &self.driver.capabilities().volumes_refused {
            Some(why) => Err(EngineError::Conflict(why.clone())),
            None => Ok(()),
        }
    }

    /// The operator's workspace called `name`.
    pub fn workspace(&self, name: &str) -> Option<&Workspace> {
        self.workspaces.iter().find(|w| w.name == name)
    }

    pub async fn create(
        &self,
        tenant: Option<&str>,
        name: &str,
        size_mb: Option<u64>,
    ) -> Result<VolumeView, EngineError> {
        self.supported()?;
        check_name(name)?;
        if self.workspace(name).is_some() {
            return Err(EngineError::Conflict(format!(
                "{name} is the name of a workspace the operator exposed; choose another name"
            )));
        }
        let quota_bytes = match (size_mb, self.enforced) {
            (Some(mb), true) => Some(mb << 20),
            (None, true) => Some(DEFAULT_QUOTA_MB << 20),
            (None, false) => None,
            (Some(_), false) => {
                return Err(EngineError::InvalidArgument(
                    "this engine cannot enforce volume quotas (they need its btrfs sandbox store, which needs root and btrfs support; its health report says why there is none); omit size_mb for a volume without a quota".into(),
                ));
            }
        };
        let row = VolumeRow {
            tenant: tenant.map(str::to_string),
            name: name.to_string(),
            key: key_of(tenant, name),
            quota_bytes,
            created_at: sandbox_mcp_model::ids::now_ms(),
        };
        match self.records.insert_volume(&row, MAX_VOLUMES).await? {
            None => {
                return Err(EngineError::Conflict(format!(
                    "volume {name} already exists; volume_list shows it"
                )));
            }
            Some(false) => {
                return Err(EngineError::QuotaExceeded(format!(
                    "at most {MAX_VOLUMES} volumes per tenant; delete one you no longer need"
                )));
            }
            Some(true) => {}
        }
        if let Err(e) = self.driver.create_volume(&row.key, quota_bytes).await {
            let _ = self.driver.remove_volume(&row.key).await;
            self.records.delete_volume(tenant, name).await?;
            return Err(e.into());
        }
        Ok(self.view(&row, Vec::new(), 0))
    }

    fn view(&self, row: &VolumeRow, used_by: Vec<String>, size_bytes: u64) -> VolumeView {
        VolumeView {
            name: row.name.clone(),
            workspace: false,
            size_bytes,
            quota_bytes: row.quota_bytes,
            read_only: false,
            used_by,
            created_at: Some(row.created_at),
        }
    }

    /// The caller's volumes, then the operator's workspaces, each with the caller's sandboxes
    /// that mount it.
    pub async fn list(&self, tenant: Option<&str>) -> Result<Vec<VolumeView>, EngineError> {
        let records = self.visible(tenant);
        let users = |matches: &dyn Fn(&MountSource) -> bool| -> Vec<String> {
            records
                .iter()
                .filter(|r| r.volumes.iter().any(|m| matches(&m.source)))
                .map(|r| r.id.clone())
                .collect()
        };
        let mut out = Vec::new();
        for row in self.records.volumes(tenant).await? {
            let used = users(&|s| matches!(s, MountSource::Volume { key } if *key == row.key));
            let size = self.driver.volume_bytes(&row.key).await;
            out.push(self.view(&row, used, size));
        }
        let workspaces = match self.driver.capabilities().workspaces_refused {
            Some(_) => &[][..],
            None => &self.workspaces[..],
        };
        for ws in workspaces {
            let used = users(&|s| matches!(s, MountSource::Workspace { host } if *host == ws.path));
            let path = ws.path.clone();
            let size = blocking(move || sandbox_mcp_sys::fs_tree::disk_usage(&path, SIZE_WALK))
                .await
                .unwrap_or(0);
            out.push(VolumeView {
                name: ws.name.clone(),
                workspace: true,
                size_bytes: size,
                quota_bytes: None,
                read_only: ws.read_only,
                used_by: used,
                created_at: None,
            });
        }
        Ok(out)
    }

    /// Records of the sandboxes `tenant` may see (every one for an untenanted caller).
    fn visible(&self, tenant: Option<&str>) -> Vec<Record> {
        self.registry
            .entries()
            .into_iter()
            .map(|(_, e)| lock(&e.record).clone())
            .filter(|r| tenant.is_none() || r.tenant.as_deref() == tenant)
            .collect()
    }

    /// Deletes a volume no sandbox mounts. `Ok(false)`: there was none of that name.
    pub async fn delete(&self, tenant: Option<&str>, name: &str) -> Result<bool, EngineError> {
        check_name(name)?;
        if self.workspace(name).is_some() {
            return Err(EngineError::InvalidArgument(format!(
                "{name} is a workspace: a folder the operator exposes (--workspace), not deleted through the API"
            )));
        }
        let Some(row) = self.records.volume(tenant, name).await? else {
            return Ok(false);
        };
        // Every sandbox of the engine, whatever its status or tenant (the key is the owner's).
        let users: Vec<String> = self
            .records
            .all()
            .await?
            .into_iter()
            .filter(|r| {
                r.volumes
                    .iter()
                    .any(|m| matches!(&m.source, MountSource::Volume { key } if *key == row.key))
            })
            .map(|r| r.id)
            .collect();
        if !users.is_empty() {
            return Err(EngineError::Conflict(format!(
                "volume {name} is mounted by {}; kill those sandboxes first",
                users.join(", ")
            )));
        }
        self.driver.remove_volume(&row.key).await?;
        self.records.delete_volume(tenant, name).await?;
        Ok(true)
    }

    /// For a fork with `volumes: copy`: the child's mounts, each named volume replaced by a new
    /// volume of the same owner and quota, a copy of it named `<name>-<suffix>`. Workspaces stay
    /// as they are (copy-on-write already). All are made or none.
    pub(crate) async fn copies(
        &self,
        tenant: Option<&str>,
        mounts: &[Mounted],
        suffix: &str,
    ) -> Result<Vec<Mounted>, EngineError> {
        let mut out: Vec<Mounted> = Vec::new();
        for m in mounts {
            let made = match &m.source {
                MountSource::Volume { key } => self.copy_one(tenant, &m.name, key, suffix).await,
                MountSource::Workspace { .. } => Ok(m.clone()),
            };
            match made {
                Ok(copy) => out.push(Mounted {
                    path: m.path.clone(),
                    read_only: m.read_only,
                    ..copy
                }),
                Err(e) => {
                    self.discard(tenant, &out).await;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    async fn copy_one(
        &self,
        tenant: Option<&str>,
        name: &str,
        key: &str,
        suffix: &str,
    ) -> Result<Mounted, EngineError> {
        let rows = self.records.volumes(tenant).await?;
        let row = rows.iter().find(|r| r.key == key).ok_or_else(|| {
            EngineError::NotFound(format!("volume {name} no longer exists; nothing to copy"))
        })?;
        let base: String = row.name.chars().take(62 - suffix.len()).collect();
        let copy = VolumeRow {
            tenant: tenant.map(str::to_string),
            name: format!("{base}-{suffix}"),
            key: key_of(tenant, &format!("{base}-{suffix}")),
            quota_bytes: row.quota_bytes,
            created_at: sandbox_mcp_model::ids::now_ms(),
        };
        match self.records.insert_volume(&copy, MAX_VOLUMES).await? {
            Some(true) => {}
            Some(false) => {
                return Err(EngineError::QuotaExceeded(format!(
                    "copying volume {name} would make more than {MAX_VOLUMES} volumes; fork with volumes=share, or delete volumes"
                )));
            }
            None => {
                return Err(EngineError::Conflict(format!(
                    "volume {} exists already; delete it or fork with volumes=share",
                    copy.name
                )));
            }
        }
        if let Err(e) = self
            .driver
            .copy_volume(key, &copy.key, copy.quota_bytes)
            .await
        {
            let _ = self.driver.remove_volume(&copy.key).await;
            self.records.delete_volume(tenant, &copy.name).await?;
            return Err(e.into());
        }
        Ok(Mounted {
            name: copy.name,
            path: String::new(),
            read_only: false,
            source: MountSource::Volume { key: copy.key },
        })
    }

    /// For a snapshot that keeps volumes: a copy of each named volume the sandbox mounts, under
    /// the snapshot's name (`<snapshot>.<mount index>`, no row: it is the snapshot's, and the
    /// driver deletes it with the snapshot's files).
    pub(crate) async fn keep(&self, record: &Record, snapshot: &str) -> Result<(), EngineError> {
        for (i, m) in record.volumes.iter().enumerate() {
            if let MountSource::Volume { key } = &m.source {
                let quota = self
                    .records
                    .volumes(record.tenant.as_deref())
                    .await?
                    .into_iter()
                    .find(|r| r.key == *key)
                    .and_then(|r| r.quota_bytes);
                self.driver
                    .copy_volume(key, &kept_key(snapshot, i), quota)
                    .await?;
            }
        }
        Ok(())
    }

    /// Restoring a snapshot that kept volumes: each volume's files become the kept copy's, in
    /// place (every sandbox that mounts it sees them at once).
    pub(crate) async fn put_back(
        &self,
        record: &Record,
        snapshot: &str,
    ) -> Result<(), EngineError> {
        for (i, m) in record.volumes.iter().enumerate() {
            if let MountSource::Volume { key } = &m.source {
                self.driver
                    .refill_volume(key, &kept_key(snapshot, i))
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes the named volumes of `mounts` (copies made for a fork that failed).
    pub(crate) async fn discard(&self, tenant: Option<&str>, mounts: &[Mounted]) {
        for m in mounts {
            if let MountSource::Volume { key } = &m.source {
                let _ = self.driver.remove_volume(key).await;
                let _ = self.records.delete_volume(tenant, &m.name).await;
            }
        }
    }

    /// Checks what a create asks to mount and resolves each name to what it stands for.
    pub async fn resolve(
        &self,
        tenant: Option<&str>,
        wanted: &[MountRequest],
    ) -> Result<Vec<Mounted>, EngineError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        self.supported()?;
        if wanted.len() > MAX_MOUNTS {
            return Err(EngineError::InvalidArgument(format!(
                "at most {MAX_MOUNTS} volumes per sandbox"
            )));
        }
        let mut out: Vec<Mounted> = Vec::new();
        for w in wanted {
            check_name(&w.name)?;
            let path = mount_point(&w.path)?;
            if out.iter().any(|m| m.name == w.name) {
                return Err(EngineError::InvalidArgument(format!(
                    "{} is listed twice in volumes",
                    w.name
                )));
            }
            if let Some(other) = out.iter().find(|m| nested(&m.path, &path)) {
                return Err(EngineError::InvalidArgument(format!(
                    "mount points {} and {path} overlap; give each volume its own directory",
                    other.path
                )));
            }
            let source = if let Some(ws) = self.workspace(&w.name) {
                if let Some(why) = &self.driver.capabilities().workspaces_refused {
                    return Err(EngineError::Conflict(why.clone()));
                }
                MountSource::Workspace {
                    host: ws.path.clone(),
                }
            } else if let Some(row) = self.records.volume(tenant, &w.name).await? {
                MountSource::Volume { key: row.key }
            } else {
                return Err(EngineError::NotFound(format!(
                    "volume {} not found; volume_list shows volumes and workspaces, volume_create makes a volume",
                    w.name
                )));
            };
            out.push(Mounted {
                name: w.name.clone(),
                path,
                read_only: w.read_only,
                source,
            });
        }
        Ok(out)
    }
}

/// The template's overlays plus one per workspace the sandbox mounts (the folder as its lower).
pub(crate) fn layout_of(template: &TemplateLayout, record: &Record) -> TemplateLayout {
    let mut layout = template.clone();
    for m in &record.volumes {
        if let MountSource::Workspace { host } = &m.source {
            layout.mounts.push(MountLayers {
                target: m.path.clone(),
                lowers: vec![host.clone()],
            });
        }
    }
    layout
}

/// The named volumes the sandbox bind-mounts.
pub(crate) fn binds_of(record: &Record) -> Vec<VolumeBind> {
    record
        .volumes
        .iter()
        .filter_map(|m| match &m.source {
            MountSource::Volume { key } => Some(VolumeBind {
                key: key.clone(),
                target: m.path.clone(),
                read_only: m.read_only,
            }),
            MountSource::Workspace { .. } => None,
        })
        .collect()
}

/// The driver's key of the copy of the `index`th mount a snapshot keeps (never a volume's: a
/// volume's key ends in 16 hex digits).
fn kept_key(snapshot: &str, index: usize) -> String {
    format!("{snapshot}.{index}")
}

/// The driver's key of `tenant`'s volume `name`: one path component, the name (for people
/// reading the store) and a digest of the owner (so names of two tenants never meet).
pub(crate) fn key_of(tenant: Option<&str>, name: &str) -> String {
    let owner = ring::digest::digest(&ring::digest::SHA256, tenant.unwrap_or("").as_bytes());
    let hex: String = owner.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{name}.{hex}")
}

fn check_name(name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && !name.starts_with(['_', '-']);
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidArgument(format!(
            "{name:?} is not a volume name: 1-63 lower-case letters, digits, `_` and `-`, starting with a letter or digit"
        )))
    }
}

/// Directories no volume may cover: the sandbox's own /proc, /dev and /sys.
const RESERVED: [&str; 3] = ["/proc", "/dev", "/sys"];

/// A mount point as given, checked and normalized: absolute, without `.`, `..` or empty
/// components, not the root, not in /proc, /dev or /sys, printable.
fn mount_point(path: &str) -> Result<String, EngineError> {
    let bad = |why: &str| EngineError::InvalidArgument(format!("volume path {path:?}: {why}"));
    if !path.starts_with('/') {
        return Err(bad("must be absolute"));
    }
    if path.len() > 1024 {
        return Err(bad("longer than 1024 bytes"));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err(bad("cannot be the root"));
    }
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(bad("may not contain `.` or `..`"));
    }
    if path.chars().any(|c| c.is_control() || c == ':' || c == ',') {
        return Err(bad("may not contain control characters, `:` or `,`"));
    }
    let normal = format!("/{}", parts.join("/"));
    if RESERVED.iter().any(|r| nested(r, &normal)) {
        return Err(bad("may not be in /proc, /dev or /sys"));
    }
    Ok(normal)
}

/// Whether one of two normalized paths is the other or below it.
fn nested(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| x == y || y.starts_with(&format!("{x}/"));
    under(a, b) || under(b, a)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_normalized_and_checked() {
        assert_eq!(mount_point("/data").unwrap(), "/data");
        assert_eq!(mount_point("//data//x/").unwrap(), "/data/x");
        for bad in [
            "data", "/", "//", "/a/../b", "/./a", "/proc", "/proc/x", "/dev/shm", "/sys", "/a:b",
            "/a,b", "/a\nb",
        ] {
            assert!(mount_point(bad).is_err(), "{bad:?}");
        }
        assert!(mount_point("/process").is_ok());
        assert!(nested("/a", "/a/b") && nested("/a/b", "/a") && !nested("/a", "/ab"));
    }

    #[test]
    fn names_never_name_a_path() {
        for bad in [
            "",
            "..",
            ".",
            "a/b",
            "../x",
            "A",
            "a.b",
            "-a",
            "_a",
            &"x".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("data-1_x").is_ok());
        let (a, b) = (key_of(None, "data"), key_of(Some("t1"), "data"));
        assert_ne!(a, b);
        assert!(a.starts_with("data.") && !a.contains('/'));
    }
}
