//! Captures: a build sandbox's or a running sandbox's writable layer published as a layer.

use std::sync::Arc;

use sandbox_mcp_storage::templates::{Template, TemplateFile};
use sandbox_mcp_sys::layers;

use super::Templates;
use crate::driver::blocking;
use crate::error::EngineError;
use crate::services::registry::{Entry, Runtime};

impl Templates {
    /// Stops a build sandbox's processes and publishes its writable layer as layer `key`.
    pub(super) async fn capture_stopped(
        &self,
        id: &str,
        file: &TemplateFile,
        key: &str,
    ) -> Result<u64, EngineError> {
        let entry = self.registry.entry_any(id)?;
        let slot = entry.record().uid_slot;
        let mut rt = entry.lifecycle.lock().await;
        self.driver.stop(id).await?;
        *rt = Runtime::Stopped;
        drop(rt);
        let template = self.catalog.template(&file.key())?;
        self.copy_to_layer(id, slot, &template, key.to_string())
            .await
    }

    /// Copies a stopped or frozen sandbox's writable layers (of `template`'s overlays) into a
    /// new layer `key` of the store; nothing is left in the store if that fails.
    pub(super) async fn copy_to_layer(
        &self,
        id: &str,
        slot: u32,
        template: &Template,
        key: String,
    ) -> Result<u64, EngineError> {
        let targets: Vec<String> = template
            .layout
            .mounts
            .iter()
            .map(|m| m.target.clone())
            .collect();
        let store = self.catalog.layers_dir();
        let scratch = store.clone();
        let tmp = blocking(move || layers::scratch(&scratch))
            .await?
            .map_err(EngineError::Templates)?;
        let captured = self
            .driver
            .capture(id, slot, targets, tmp.clone())
            .await
            .map_err(EngineError::from);
        blocking(move || match captured {
            Ok(bytes) => {
                layers::publish(&tmp, &store, &key).map_err(EngineError::Templates)?;
                Ok(bytes)
            }
            Err(e) => {
                let _ = sandbox_mcp_sys::fs_tree::remove_tree(&tmp);
                Err(e)
            }
        })
        .await?
    }

    /// Copies a live sandbox's writable layer into a new layer, freezing it meanwhile so the
    /// copy is one moment of its filesystem.
    pub(super) async fn capture_sandbox(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        parent: &Template,
    ) -> Result<(String, u64), EngineError> {
        let slot = entry.record().uid_slot;
        let rt = entry.lifecycle.lock().await;
        let frozen_here = *rt == Runtime::Running;
        if *rt == Runtime::Killed {
            return Err(EngineError::sandbox_not_found(id));
        }
        if frozen_here {
            self.driver.freeze(id).await?;
        }
        let key = layers::id_of(&[id.as_bytes(), sandbox_mcp_model::ids::nonce().as_bytes()]);
        let copied = self.copy_to_layer(id, slot, parent, key.clone()).await;
        if frozen_here {
            self.driver.thaw(id).await?;
        }
        drop(rt);
        Ok((key, copied?))
    }
}
