//! The catalog: every template the engine knows, found by key (a record's `template`) or by the
//! name a tenant gives, and written to disk before it is listed.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use sandbox_mcp_storage::templates::{self, BASE, Template, TemplateFile, TemplateStatus};
use sandbox_mcp_sys::layers;

use crate::driver::blocking;
use crate::error::EngineError;

pub struct Catalog {
    templates_dir: PathBuf,
    layers_dir: PathBuf,
    default_template: Option<String>,
    /// `base` first.
    templates: RwLock<Vec<Arc<Template>>>,
}

impl Catalog {
    pub(crate) fn new(
        templates_dir: PathBuf,
        layers_dir: PathBuf,
        default_template: Option<String>,
        templates: Vec<Template>,
    ) -> Self {
        Self {
            templates_dir,
            layers_dir,
            default_template,
            templates: RwLock::new(templates.into_iter().map(Arc::new).collect()),
        }
    }

    pub(crate) fn templates_dir(&self) -> PathBuf {
        self.templates_dir.clone()
    }

    pub(crate) fn layers_dir(&self) -> PathBuf {
        self.layers_dir.clone()
    }

    /// Whether layer `key` is in the store.
    pub(crate) fn has_layer(&self, key: &str) -> bool {
        self.layers_dir.join(key).is_dir()
    }

    /// Every template, `base` first.
    pub(crate) fn templates(&self) -> Vec<Arc<Template>> {
        self.templates
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The template `create` uses when none is named.
    pub fn default_template(&self) -> String {
        self.default_template
            .clone()
            .unwrap_or_else(|| BASE.to_string())
    }

    /// The template the engine knows by `key` (a record's `template`; see
    /// [`templates::TemplateFile::key`]).
    pub(crate) fn template(&self, key: &str) -> Result<Arc<Template>, EngineError> {
        // Looked up under the lock: this runs on every sandbox start.
        let all = self.templates.read().unwrap_or_else(|e| e.into_inner());
        all.iter().find(|t| t.key == key).cloned().ok_or_else(|| {
            EngineError::NotFound(format!(
                "template {} does not exist",
                templates::name_of_key(key)
            ))
        })
    }

    /// The templates `tenant` may see: its own and the shared ones, `base` first.
    pub fn templates_of(&self, tenant: Option<&str>) -> Vec<Arc<Template>> {
        self.templates()
            .into_iter()
            .filter(|t| t.visible_to(tenant))
            .collect()
    }

    /// Template `name` as `tenant` names it: its own, else a shared one. Another tenant's
    /// answers exactly like one that does not exist.
    pub fn template_for(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Arc<Template>, EngineError> {
        let visible = self.templates_of(tenant);
        visible
            .iter()
            .find(|t| t.name == name && t.owner().is_some())
            .or_else(|| {
                visible
                    .iter()
                    .find(|t| t.name == name && t.owner().is_none())
            })
            .cloned()
            .ok_or_else(|| {
                EngineError::NotFound(format!(
                    "template {name} does not exist; templates: {}",
                    visible
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// A template sandboxes of `tenant` can start from now.
    pub(crate) fn ready_template(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Arc<Template>, EngineError> {
        let t = self.template_for(tenant, name)?;
        match t.status() {
            TemplateStatus::Ready => Ok(t),
            TemplateStatus::Building => Err(EngineError::Conflict(format!(
                "template {name} is still building; poll list_templates until it is ready"
            ))),
            TemplateStatus::Failed => Err(EngineError::Conflict(format!(
                "template {name} failed to build ({}); delete it and create it again",
                t.file.failure.as_ref().map_or("", |f| f.message.as_str())
            ))),
        }
    }

    /// Writes a template's file and lists it (replacing one of the same key).
    pub(crate) async fn put(&self, file: TemplateFile) -> Result<Arc<Template>, EngineError> {
        let (tdir, ldir) = (self.templates_dir(), self.layers_dir());
        let t = blocking(move || -> std::io::Result<Template> {
            templates::save(&tdir, &file)?;
            Ok(Template::new(&tdir, &ldir, file))
        })
        .await?
        .map_err(EngineError::Templates)?;
        let t = Arc::new(t);
        let mut all = self.templates.write().unwrap_or_else(|e| e.into_inner());
        all.retain(|x| x.key != t.key);
        all.push(t.clone());
        all.sort_by(|a, b| (a.key != BASE, &a.key).cmp(&(b.key != BASE, &b.key)));
        Ok(t)
    }

    /// Deletes template `key`'s file and unlists it.
    pub(crate) async fn remove(&self, key: &str) -> Result<(), EngineError> {
        let (tdir, k) = (self.templates_dir(), key.to_string());
        blocking(move || templates::remove(&tdir, &k))
            .await?
            .map_err(EngineError::Templates)?;
        self.templates
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| x.key != key);
        Ok(())
    }

    /// Deletes the layers no template names (the caller knows no build is running: its next
    /// step may be a cached layer no template names yet).
    pub(crate) async fn collect_layers(&self) {
        let used: std::collections::HashSet<String> = self
            .templates()
            .iter()
            .flat_map(|t| t.file.layers.clone())
            .collect();
        let store = self.layers_dir();
        let _ = blocking(move || layers::collect_garbage(&store, &used)).await;
    }
}
