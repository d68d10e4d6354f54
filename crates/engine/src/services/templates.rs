//! Making and deleting templates: builds from steps (in a build sandbox, one layer per step,
//! cached by parent and step), captures of a sandbox's filesystem, imported images; and what a
//! template allows a sandbox created from it.
//!
//! A template's file is the truth: it is written `building` before the build starts and
//! `ready` or `failed` when it ends, and a layer is published (renamed into the store) before a
//! template names it. So a crash leaves a failed template whose finished steps are cached, and
//! never a template naming a layer that is not there.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::agent::AgentClient;
use super::catalog::Catalog;
use super::lifecycle::Lifecycle;
use super::pool::Pools;
use super::registry::Registry;
use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::state::NetworkRules;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_model::driver::Shape;
use sandbox_mcp_model::ids;
use sandbox_mcp_storage::templates::{
    self, BASE, MAX_LAYERS, Template, TemplateFile, TemplateStatus,
};

mod build;
mod capture;

/// The tenant of build sandboxes: no API key can name it (tenant names are checked), and
/// listings leave its sandboxes out.
pub(crate) const BUILD_TENANT: &str = "\u{1}template-build";
/// A build's time limit when the request names none.
pub(crate) const DEFAULT_BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Most steps one build may have.
pub(crate) const MAX_STEPS: usize = 50;
/// Bytes of a failed step's output kept in the template's listing.
const TAIL: usize = 2000;

/// One build step.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// A shell command (`sh -c`), as root in the build sandbox.
    Run(String),
    /// An environment variable for the steps after it and for the template's sandboxes.
    Env(String, String),
    /// The working directory of the steps after it and of the template's commands.
    Workdir(String),
}

impl Step {
    fn describe(&self) -> String {
        match self {
            Step::Run(c) => format!("run: {c}"),
            Step::Env(k, v) => format!("env: {k}={v}"),
            Step::Workdir(d) => format!("workdir: {d}"),
        }
    }
}

/// Limits asked for; what is not given comes from the parent template.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ShapeRequest {
    pub vcpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    pub max_pids: Option<u64>,
}

impl ShapeRequest {
    fn over(self, parent: Shape) -> Shape {
        Shape {
            vcpus: self.vcpus.unwrap_or(parent.vcpus),
            memory_mb: self.memory_mb.unwrap_or(parent.memory_mb),
            disk_mb: self.disk_mb.unwrap_or(parent.disk_mb),
            max_pids: self.max_pids.unwrap_or(parent.max_pids),
        }
    }

    /// A sandbox's shape: what it asks for, never more than its template allows.
    pub(crate) fn within(self, template: &Template) -> Result<Shape, EngineError> {
        let t = template.shape;
        let asked = self.over(t);
        let fields = [
            ("vcpus", asked.vcpus, t.vcpus),
            ("memory_mb", asked.memory_mb as f64, t.memory_mb as f64),
            ("disk_mb", asked.disk_mb as f64, t.disk_mb as f64),
            ("max_pids", asked.max_pids as f64, t.max_pids as f64),
        ];
        match fields.iter().find(|(_, asked, allowed)| asked > allowed) {
            Some((field, asked, allowed)) => Err(EngineError::InvalidArgument(format!(
                "shape.{field} {asked} is more than template {} allows ({allowed}); ask for at most that, or use a template with a larger shape",
                template.name
            ))),
            None => Ok(asked),
        }
    }
}

/// A request to make a template, validated by the API layer.
#[derive(Debug, Clone, Default)]
pub struct TemplateRequest {
    pub name: String,
    pub description: Option<String>,
    /// Parent template (`base` when omitted).
    pub from: Option<String>,
    /// Capture this sandbox's filesystem instead of running steps.
    pub from_sandbox: Option<String>,
    pub steps: Vec<Step>,
    pub shape: ShapeRequest,
    /// Egress rules of the build sandbox.
    pub network: NetworkRules,
    pub warm: u32,
    pub timeout: Option<Duration>,
}

/// Making and deleting templates.
pub struct Templates {
    /// For imports: where the data dir and its layer store are.
    pub(super) config: EngineConfig,
    pub(super) catalog: Arc<Catalog>,
    driver: DriverHandle,
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
    agent: Arc<AgentClient>,
    pools: Arc<Pools>,
    /// Serializes making and deleting templates (names, layer collection).
    pub(super) lock: tokio::sync::Mutex<()>,
    /// Builds running now (layers are not collected meanwhile).
    builds: AtomicUsize,
    /// Cancelled when the engine stops: builds end with it.
    stopping: CancellationToken,
}

impl Templates {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: EngineConfig,
        catalog: Arc<Catalog>,
        driver: DriverHandle,
        registry: Arc<Registry>,
        lifecycle: Arc<Lifecycle>,
        agent: Arc<AgentClient>,
        pools: Arc<Pools>,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            config,
            catalog,
            driver,
            registry,
            lifecycle,
            agent,
            pools,
            lock: tokio::sync::Mutex::new(()),
            builds: AtomicUsize::new(0),
            stopping,
        }
    }

    /// Starts a build (returns the template at once, `building`) or captures a sandbox (returns
    /// it `ready`).
    pub async fn create_template(
        self: &Arc<Self>,
        req: TemplateRequest,
        tenant: Option<&str>,
    ) -> Result<Arc<Template>, EngineError> {
        templates::check_name(&req.name).map_err(EngineError::InvalidArgument)?;
        if templates::is_builtin(&req.name) {
            return Err(EngineError::Conflict(format!(
                "{} is a built-in template; choose another name",
                req.name
            )));
        }
        if req.from_sandbox.is_some() && !req.steps.is_empty() {
            return Err(EngineError::InvalidArgument(
                "give either steps or from_sandbox, not both".into(),
            ));
        }
        if req.from_sandbox.is_none() && req.steps.is_empty() {
            return Err(EngineError::InvalidArgument(
                "give steps (e.g. [{\"run\": \"pip install requests\"}]) or from_sandbox".into(),
            ));
        }
        if req.steps.len() > MAX_STEPS {
            return Err(EngineError::InvalidArgument(format!(
                "a build has at most {MAX_STEPS} steps; combine commands with &&"
            )));
        }
        let _guard = self.lock.lock().await;
        // The template goes in the caller's namespace; a shared name is taken for everyone.
        let owner = tenant
            .filter(|t| !super::pool::internal(t))
            .map(str::to_string);
        if owner.is_some()
            && let Ok(shared) = self.catalog.template(&req.name)
        {
            return Err(EngineError::Conflict(format!(
                "{} is a shared template (the engine's operator's); choose another name",
                shared.name
            )));
        }
        if let Ok(t) = self
            .catalog
            .template(&templates::key_of(owner.as_deref(), &req.name))
            && t.status() != TemplateStatus::Failed
        {
            return Err(EngineError::Conflict(format!(
                "template {} already exists; delete it first (sandbox_template_delete) or choose another name",
                req.name
            )));
        }
        let (parent, source) = match &req.from_sandbox {
            Some(id) => {
                let entry = self.registry.entry(id, tenant)?;
                let key = entry.record().template;
                (self.catalog.template(&key)?, Some((id.clone(), entry)))
            }
            None => (
                self.catalog
                    .ready_template(tenant, req.from.as_deref().unwrap_or(BASE))?,
                None,
            ),
        };
        let shape = req.shape.over(parent.shape);
        let mut file = TemplateFile {
            name: req.name.clone(),
            owner,
            description: req.description.clone().unwrap_or_else(|| match &source {
                Some((id, _)) => format!("Captured from sandbox {id} (template {}).", parent.name),
                None => format!(
                    "Built from {} with {} step(s).",
                    parent.name,
                    req.steps.len()
                ),
            }),
            version: 1,
            shape,
            parent: Some(parent.name.clone()),
            status: TemplateStatus::Building,
            failure: None,
            size_bytes: 0,
            created_at: ids::now_ms(),
            warm: req.warm,
            captured_from: source.as_ref().map(|(id, _)| id.clone()),
            ..parent.file.clone()
        };
        if let Some((id, entry)) = source {
            if file.layers.len() >= MAX_LAYERS {
                return Err(EngineError::InvalidArgument(format!(
                    "template {} already stacks {MAX_LAYERS} layers, the most a template may have",
                    parent.name
                )));
            }
            let (layer, bytes) = self.capture_sandbox(&id, &entry, &parent).await?;
            file.layers.push(layer);
            file.size_bytes = bytes;
            file.status = TemplateStatus::Ready;
            let t = self.catalog.put(file).await?;
            self.pools.refill(&t);
            return Ok(t);
        }
        let t = self.catalog.put(file.clone()).await?;
        self.builds.fetch_add(1, Ordering::AcqRel);
        let this = self.clone();
        let timeout = req.timeout.unwrap_or(DEFAULT_BUILD_TIMEOUT);
        tokio::spawn(async move {
            let mut file = file;
            let outcome = tokio::select! {
                // The engine stops: the build ends with it (the next start marks it failed).
                () = this.stopping.cancelled() => None,
                r = this.build(&mut file, &req.steps, &req.network, timeout) => Some(r),
            };
            // A failed template keeps the layers of its finished steps: the next build of
            // the same steps reuses them.
            match outcome {
                Some(Ok(())) => file.status = TemplateStatus::Ready,
                Some(Err(failure)) => {
                    file.status = TemplateStatus::Failed;
                    file.failure = Some(failure);
                }
                None => {
                    this.builds.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
            }
            match this.catalog.put(file).await {
                Ok(t) => this.pools.refill(&t),
                Err(e) => tracing::error!("cannot record the end of a template build: {e}"),
            }
            this.builds.fetch_sub(1, Ordering::AcqRel);
        });
        Ok(t)
    }

    /// Deletes `tenant`'s template `name`: refused for a shared one (unless the operator asks),
    /// the default template, one still building, and one sandboxes use (the error names them).
    /// Its layers go unless another template uses them.
    pub async fn delete_template(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<(), EngineError> {
        let _guard = self.lock.lock().await;
        let t = self.catalog.template_for(tenant, name)?;
        if tenant.is_some() && t.owner().is_none() {
            return Err(EngineError::PermissionDenied(format!(
                "template {name} is shared (built in or the engine operator's): every tenant may use it, none may delete it"
            )));
        }
        let key = t.key.clone();
        if templates::is_builtin(&key) {
            return Err(EngineError::Conflict(format!(
                "{name} is built in and cannot be deleted"
            )));
        }
        if key == self.catalog.default_template() {
            return Err(EngineError::Conflict(format!(
                "template {name} is the engine's default template (--default-template); restart the engine with another default first"
            )));
        }
        if t.status() == TemplateStatus::Building {
            return Err(EngineError::Conflict(format!(
                "template {name} is still building; wait until list_templates shows it ready or failed"
            )));
        }
        let users: Vec<String> = self
            .registry
            .records()
            .into_iter()
            .filter(|r| {
                r.template == key && !r.tenant.as_deref().is_some_and(super::pool::internal)
            })
            .map(|r| r.id)
            .collect();
        if !users.is_empty() {
            return Err(EngineError::Conflict(format!(
                "template {name} is used by {} sandbox(es): {}; kill them first",
                users.len(),
                users.join(", ")
            )));
        }
        self.pools.drain(&key).await;
        self.catalog.remove(&key).await?;
        self.collect_layers().await;
        Ok(())
    }

    /// Deletes layers no template names, unless a build is running (its next step may be a
    /// cached layer no template names yet).
    pub(crate) async fn collect_layers(&self) {
        if self.builds.load(Ordering::Acquire) > 0 {
            return;
        }
        self.catalog.collect_layers().await;
    }
}
