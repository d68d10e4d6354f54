//! Diffs: what changed between a sandbox's files and another's, or a snapshot's.

use std::time::Duration;

use sandbox_mcp_model::driver::{FsLayers, FsRef};
use sandbox_mcp_model::ids;
use sandbox_mcp_protocol::WriteFile;
use sandbox_mcp_storage::diff::{self, Diff};
use sandbox_mcp_sys::lock;

use super::{DIFF_MEMORY, Diffed, Snapshots};
use crate::driver::blocking;
use crate::error::EngineError;

impl Snapshots {
    pub async fn diff(
        &self,
        id: &str,
        tenant: Option<&str>,
        against: &str,
        under: &str,
        save_to: Option<String>,
    ) -> Result<Diffed, EngineError> {
        let entry = self.making.registry.entry(id, tenant)?;
        let template = self
            .making
            .catalog
            .template(&lock(&entry.record).template)?;
        let (base, base_layout) = if ids::is_snapshot_id(against) {
            let snap = self
                .snapshots_of(None)
                .await?
                .into_iter()
                .find(|s| s.id == against && s.ready);
            // Another tenant's snapshot answers exactly like one that does not exist.
            let owner = snap.and_then(|s| self.making.registry.entry(&s.sandbox_id, tenant).ok());
            let owner = owner.ok_or_else(|| {
                EngineError::NotFound(format!(
                    "snapshot {against} not found; sandbox_snapshot_list shows a sandbox's snapshots"
                ))
            })?;
            let owner_template = self
                .making
                .catalog
                .template(&lock(&owner.record).template)?;
            let layout =
                crate::services::volumes::layout_of(&owner_template.layout, &lock(&owner.record));
            (
                FsRef {
                    name: against.to_string(),
                    slot: None,
                },
                layout,
            )
        } else if ids::is_sandbox_id(against) {
            let other = self.making.registry.entry(against, tenant)?;
            let other_template = self
                .making
                .catalog
                .template(&lock(&other.record).template)?;
            let layout =
                crate::services::volumes::layout_of(&other_template.layout, &lock(&other.record));
            (Self::fs_of(&other, against), layout)
        } else {
            return Err(EngineError::InvalidArgument(format!(
                "against must be a sandbox id (sbx_…) or a snapshot id (snap_…); got {against:?}"
            )));
        };
        let side = |layers: FsLayers| diff::Side {
            mounts: layers
                .mounts
                .into_iter()
                .map(|(target, upper, lowers)| diff::Mount {
                    target,
                    upper,
                    lowers,
                })
                .collect(),
            id_base: layers.id_base,
            stacked: layers.stacked,
        };
        let a = side(self.driver.fs_layers(base, base_layout).await?);
        let own_layout = {
            let record = lock(&entry.record);
            crate::services::volumes::layout_of(&template.layout, &record)
        };
        let b = side(
            self.driver
                .fs_layers(Self::fs_of(&entry, id), own_layout)
                .await?,
        );
        let under = under.to_string();
        let diff = blocking(move || diff::diff(&a, &b, &under, DIFF_MEMORY))
            .await?
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidInput => EngineError::InvalidArgument(e.to_string()),
                _ => EngineError::Conflict(format!("cannot compare the files: {e}")),
            })?;
        let saved_to = match save_to {
            Some(path) => Some(self.save_diff(id, tenant, &path, &diff).await?),
            None => None,
        };
        Ok(Diffed { diff, saved_to })
    }

    /// Writes the whole list of changes to `path` in the sandbox, one per line:
    /// `<A|D|M> <kind> <size> <path>[ (<what>)]`.
    async fn save_diff(
        &self,
        id: &str,
        tenant: Option<&str>,
        path: &str,
        diff: &Diff,
    ) -> Result<String, EngineError> {
        use base64::Engine as _;
        use std::fmt::Write as _;
        let mut text = String::new();
        for e in &diff.entries {
            let change = match e.change {
                diff::Change::Added => 'A',
                diff::Change::Removed => 'D',
                diff::Change::Modified => 'M',
            };
            let kind = serde_json::to_value(e.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let _ = write!(text, "{change} {kind} {} {}", e.size, e.path);
            if !e.what.is_empty() {
                let _ = write!(text, " ({})", e.what.join(","));
            }
            text.push('\n');
        }
        let listed = diff.added + diff.removed + diff.modified;
        if (diff.entries.len() as u64) < listed {
            let _ = writeln!(
                text,
                "… {} more changes not listed",
                listed - diff.entries.len() as u64
            );
        }
        let written = self
            .making
            .agent
            .call(
                id,
                tenant,
                WriteFile {
                    path: path.to_string(),
                    data_b64: base64::engine::general_purpose::STANDARD.encode(text),
                    owner: None,
                    metadata: Default::default(),
                },
                Duration::from_secs(60),
            )
            .await?;
        Ok(written.path)
    }
}
