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
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::CreateRequest;
use super::agent::AgentClient;
use super::catalog::Catalog;
use super::lifecycle::Lifecycle;
use super::pool::Pools;
use super::registry::{Entry, Registry, Runtime};
use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;
use crate::state::NetworkRules;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_model::driver::Shape;
use sandbox_mcp_model::ids;
use sandbox_mcp_protocol::ExecSpec;
use sandbox_mcp_storage::templates::{
    self, BASE, BuildFailure, MAX_LAYERS, Template, TemplateFile, TemplateStatus,
};
use sandbox_mcp_sys::layers;

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

    /// Runs the steps, one build sandbox per `run` step, each step's result a layer added to
    /// `file`. Returns why the build failed, if it did.
    async fn build(
        self: &Arc<Self>,
        file: &mut TemplateFile,
        steps: &[Step],
        network: &NetworkRules,
        timeout: Duration,
    ) -> Result<(), BuildFailure> {
        let started = Instant::now();
        // The cache key of everything below the first step: the parent's stack — and the
        // owner, for a tenant's build: tenants never share a cached layer (one would learn what
        // another built, and when).
        let mut key = layers::id_of(&[file.layers.join("/").as_bytes(), &[u8::from(file.foreign)]]);
        if let Some(owner) = &file.owner {
            key = layers::id_of(&[key.as_bytes(), b"owner", owner.as_bytes()]);
        }
        let mut bytes = 0u64;
        for (i, step) in steps.iter().enumerate() {
            let n = i + 1;
            let text = step.describe();
            let json = serde_json::to_vec(step).unwrap_or_default();
            key = layers::id_of(&[key.as_bytes(), &json]);
            let command = match step {
                Step::Env(k, v) => {
                    file.env.retain(|(name, _)| name != k);
                    file.env.push((k.clone(), v.clone()));
                    continue;
                }
                Step::Workdir(d) => {
                    file.workdir = Some(d.clone());
                    continue;
                }
                Step::Run(command) => command,
            };
            if self.catalog.has_layer(&key) {
                // Cached: this parent ran this step before.
                file.layers.push(key.clone());
                continue;
            }
            if file.layers.len() >= MAX_LAYERS {
                return Err(BuildFailure::new(
                    n,
                    &text,
                    format!(
                        "the template would stack more than {MAX_LAYERS} layers; combine run steps with &&"
                    ),
                ));
            }
            let Some(left) = timeout.checked_sub(started.elapsed()) else {
                return Err(BuildFailure::new(
                    n,
                    &text,
                    format!(
                        "the build ran past its time limit of {} s",
                        timeout.as_secs()
                    ),
                ));
            };
            // The build sandbox starts from the template as built so far.
            self.catalog
                .put(file.clone())
                .await
                .map_err(|e| BuildFailure::new(n, &text, e.to_string()))?;
            let made = self
                .run_step(file, command, network, left, n, &text, &key)
                .await?;
            bytes += made;
            file.size_bytes = bytes;
            file.layers.push(key.clone());
        }
        Ok(())
    }

    /// Runs one `run` step in a fresh build sandbox and publishes its result as layer `key`.
    #[allow(clippy::too_many_arguments)]
    async fn run_step(
        self: &Arc<Self>,
        file: &TemplateFile,
        command: &str,
        network: &NetworkRules,
        left: Duration,
        n: usize,
        text: &str,
        key: &str,
    ) -> Result<u64, BuildFailure> {
        let fail = |message: String| BuildFailure::new(n, text, message);
        let template = self
            .catalog
            .template(&file.key())
            .map_err(|e| fail(e.to_string()))?;
        let view = self
            .lifecycle
            .create_from(
                CreateRequest {
                    name: Some(format!("build of {}", file.name)),
                    tenant: Some(BUILD_TENANT.to_string()),
                    network: network.clone(),
                    ..Default::default()
                },
                &template,
                template.shape,
            )
            .await
            .map_err(|e| fail(format!("cannot start the build sandbox: {e}")))?;
        let id = view.record.id.clone();
        let result = self
            .agent
            .exec(
                &id,
                Some(BUILD_TENANT),
                ExecSpec {
                    command: command.to_string(),
                    cwd: file.workdir.clone(),
                    env: Vec::new(),
                    timeout_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    max_output_bytes: TAIL as u64,
                    stream: false,
                },
            )
            .await;
        let outcome = match result {
            Ok(r) => {
                let o = r.outcome;
                let exit_code = o.exit_code.map(i64::from);
                let message = if o.timed_out {
                    Some(format!(
                        "step {n} ran past the build's time limit ({} s were left when it started)",
                        left.as_secs()
                    ))
                } else if r.oom_killed {
                    Some(format!(
                        "step {n} ran out of memory (the template's shape allows {} MB); raise shape.memory_mb",
                        file.shape.memory_mb
                    ))
                } else if o.exit_code != Some(0) {
                    Some(format!(
                        "step {n} exited with {}",
                        o.exit_code.map_or_else(
                            || format!("signal {}", o.signal.unwrap_or(0)),
                            |c| format!("code {c}")
                        )
                    ))
                } else {
                    None
                };
                match message {
                    Some(m) => Err(BuildFailure {
                        exit_code: exit_code.filter(|_| !o.timed_out),
                        output_tail: tail_of(&o.stdout, &o.stderr),
                        ..fail(m)
                    }),
                    None => Ok(()),
                }
            }
            Err(e) => Err(fail(format!("step {n} could not run: {e}"))),
        };
        let captured = match outcome {
            Ok(()) => self
                .capture_stopped(&id, file, key)
                .await
                .map_err(|e| fail(format!("cannot save step {n}'s result: {e}"))),
            Err(f) => Err(f),
        };
        if let Err(e) = self.lifecycle.kill(&id, Some(BUILD_TENANT)).await {
            tracing::warn!(sandbox = %id, "cannot delete a build sandbox: {e}");
        }
        captured
    }

    /// Stops a build sandbox's processes and publishes its writable layer as layer `key`.
    async fn capture_stopped(
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
    async fn copy_to_layer(
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
    async fn capture_sandbox(
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

/// The end of a step's output: stdout's tail, then stderr's, at most [`TAIL`] bytes.
fn tail_of(stdout: &str, stderr: &str) -> String {
    let both = if stderr.is_empty() {
        stdout.to_string()
    } else if stdout.is_empty() {
        stderr.to_string()
    } else if stdout.ends_with('\n') {
        format!("{stdout}{stderr}")
    } else {
        format!("{stdout}\n{stderr}")
    };
    if both.len() <= TAIL {
        return both;
    }
    let mut start = both.len() - TAIL;
    while !both.is_char_boundary(start) {
        start += 1;
    }
    both[start..].to_string()
}
