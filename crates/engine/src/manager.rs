//! The manager: the engine's services composed once, over one driver and one state. It owns
//! nothing the services do not; what each does is in [`crate::services`].
//!
//! Invariants (kept by the services):
//! - A sandbox is visible (list, get, exec) only once its record is committed as `running`.
//! - Lifecycle transitions of one sandbox are serialized by its `lifecycle` lock; contents
//!   operations (exec, files) run concurrently, outside it.
//! - The in-memory runtime state can always be rebuilt from the database and the driver.

use std::sync::Arc;

use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_model::driver::Driver;
use sandbox_mcp_network::Hub;
use sandbox_mcp_network::log as netlog;
use tokio_util::sync::CancellationToken;

use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;
use crate::records::Records;
use crate::services::Making;
use crate::services::agent::AgentClient;
use crate::services::catalog::Catalog;
use crate::services::desktop::Desktops;
use crate::services::lifecycle::Lifecycle;
use crate::services::networks::Networks;
use crate::services::pool::Pools;
use crate::services::previews::Previews;
use crate::services::registry::Registry;
use crate::services::secrets::Secrets;
use crate::services::snapshots::Snapshots;
use crate::services::templates::Templates;
use crate::services::timers::Timers;
use crate::state::{Record, Status, Store};

pub struct Manager {
    config: EngineConfig,
    driver: DriverHandle,
    pub(crate) registry: Arc<Registry>,
    pub networks: Arc<Networks>,
    pub catalog: Arc<Catalog>,
    pub secrets: Arc<Secrets>,
    pub servers: Arc<crate::services::servers::Servers>,
    pub lifecycle: Arc<Lifecycle>,
    pub agent: Arc<AgentClient>,
    pub pools: Arc<Pools>,
    pub templates: Arc<Templates>,
    pub snapshots: Arc<Snapshots>,
    pub previews: Arc<Previews>,
    pub desktops: Arc<Desktops>,
    pub volumes: Arc<crate::services::volumes::Volumes>,
    pub workspaces: Arc<crate::services::workspaces::Workspaces>,
    timers: Arc<Timers>,
    /// Cancelled when the engine stops: builds and pool refills end with it.
    stopping: CancellationToken,
}

impl Manager {
    /// Opens the state, loads templates and recovers every sandbox that existed.
    pub async fn open(config: EngineConfig, driver: Driver) -> Result<Arc<Self>, EngineError> {
        let driver = DriverHandle::new(driver);
        let db = config.state_db();
        let store = Arc::new(blocking(move || Store::open(&db)).await??);
        let records = Arc::new(Records::new(store, driver.shared_records().cloned()));
        let (templates_dir, layers_dir) = (
            config.templates_dir(),
            sandbox_mcp_sys::layers::dir(&config.data_dir),
        );
        // An older engine made the layer store listable (0755); see `layers::scratch`.
        if let Err(e) = std::fs::set_permissions(
            &layers_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        ) && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot close the layer store to listing: {e}");
        }
        let templates = match driver.capabilities().image_templates.clone() {
            // The driver's images are its templates: nothing is built on this host.
            Some(images) => images
                .into_iter()
                .map(|(name, image)| {
                    sandbox_mcp_storage::templates::image_template(
                        &templates_dir,
                        &layers_dir,
                        &name,
                        &image,
                    )
                })
                .collect(),
            None => {
                let (tdir, ldir) = (templates_dir.clone(), layers_dir.clone());
                blocking(move || sandbox_mcp_storage::templates::load(&tdir, &ldir))
                    .await?
                    .map_err(EngineError::Templates)?
            }
        };
        let mut templates = templates;
        for (name, n) in &config.warm {
            let Some(t) = templates
                .iter_mut()
                .find(|t| &t.name == name && t.file.owner.is_none())
            else {
                return Err(EngineError::InvalidArgument(format!(
                    "--warm names template {name}, which does not exist; templates: {}",
                    templates
                        .iter()
                        .filter(|t| t.file.owner.is_none())
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            t.file.warm = *n;
        }
        if let Some(name) = &config.default_template {
            match templates.iter().find(|t| &t.name == name) {
                Some(t) if t.status() == sandbox_mcp_storage::templates::TemplateStatus::Ready => {}
                Some(_) => {
                    return Err(EngineError::InvalidArgument(format!(
                        "the default template {name} is not ready (it failed to build); pick another with --default-template"
                    )));
                }
                None => {
                    return Err(EngineError::InvalidArgument(format!(
                        "the default template {name} does not exist; templates: {}",
                        templates
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        let (db, legacy) = (config.network_log_db(), config.state_db());
        let log = blocking(move || netlog::NetLog::open(&db, Some(&legacy))).await??;
        let (db, key) = (config.state_db(), config.data_dir.join("secrets.key"));
        let secrets = Arc::new(
            blocking(move || sandbox_mcp_network::secrets::SecretStore::open(&db, &key))
                .await?
                .map_err(|e| EngineError::Unavailable {
                    what: "the secrets store cannot be opened",
                    source: e.into(),
                })?,
        );
        let (dir, extra) = (config.data_dir.clone(), config.network.egress_ca.clone());
        let interceptor =
            blocking(move || sandbox_mcp_network::intercept::Interceptor::open(&dir, &extra))
                .await?
                .map_err(|e| EngineError::Unavailable {
                    what: "the egress CA cannot be set up",
                    source: e.into(),
                })?;
        if driver.capabilities().image_templates.is_none() {
            sandbox_mcp_storage::templates::trust(&config.templates_dir(), interceptor.ca_pem())
                .map_err(EngineError::Templates)?;
        }
        // The engine's own budgets: every descriptor the hard limit allows (a share of them for
        // sandbox traffic), and large buffers that go back to the kernel when freed.
        let nofile = sandbox_mcp_sys::budget::raise_nofile();
        sandbox_mcp_sys::budget::tune_allocator();
        let hub = Hub::new(
            config.network.clone(),
            log,
            secrets.clone(),
            Some(Arc::new(interceptor)),
            sandbox_mcp_sys::budget::Descriptors::new(nofile),
        );
        let stopping = CancellationToken::new();
        let networks = Arc::new(Networks::new(hub, driver.clone()));
        let registry = Arc::new(Registry::new(
            records.clone(),
            driver.clone(),
            networks.clone(),
        ));
        let catalog = Arc::new(Catalog::new(
            templates_dir,
            layers_dir,
            config.default_template.clone(),
            templates,
        ));
        let secrets = Arc::new(Secrets::new(
            secrets,
            registry.clone(),
            records.clone(),
            driver.clone(),
        ));
        let lifecycle = Arc::new(Lifecycle::new(
            config.max_sandboxes,
            driver.clone(),
            records.clone(),
            registry.clone(),
            networks.clone(),
            catalog.clone(),
            secrets.clone(),
        ));
        let agent = Arc::new(AgentClient::new(
            driver.clone(),
            registry.clone(),
            lifecycle.clone(),
            config.exec_grace,
        ));
        let volumes = Arc::new(crate::services::volumes::Volumes::new(
            driver.clone(),
            records.clone(),
            registry.clone(),
            config.workspaces.clone(),
        ));
        let making = Making {
            records: records.clone(),
            registry: registry.clone(),
            networks: networks.clone(),
            secrets: secrets.clone(),
            catalog: catalog.clone(),
            lifecycle: lifecycle.clone(),
            agent: agent.clone(),
            volumes: volumes.clone(),
        };
        let pools = Arc::new(Pools::new(making.clone(), stopping.clone()));
        let templates = Arc::new(Templates::new(
            config.clone(),
            catalog.clone(),
            driver.clone(),
            registry.clone(),
            lifecycle.clone(),
            agent.clone(),
            pools.clone(),
            stopping.clone(),
        ));
        let snapshots = Arc::new(Snapshots::new(driver.clone(), making));
        let previews = Arc::new(Previews::new(
            config.preview.domain.clone(),
            driver.clone(),
            records.clone(),
            registry.clone(),
            lifecycle.clone(),
        ));
        let desktops = Arc::new(Desktops::new(
            driver.clone(),
            registry.clone(),
            catalog.clone(),
            lifecycle.clone(),
            agent.clone(),
            pools.clone(),
        ));
        let servers = Arc::new(crate::services::servers::Servers::new(records.clone()));
        let workspaces = Arc::new(crate::services::workspaces::Workspaces::new(
            driver.clone(),
            registry.clone(),
            volumes.clone(),
        ));
        let timers = Arc::new(Timers::new(
            config.tick,
            (config.idle_pause, config.idle_hibernate),
            registry.clone(),
            lifecycle.clone(),
        ));
        lifecycle.recover().await?;
        snapshots.recover().await?;
        previews.recover().await?;
        pools.restart_internal();
        Ok(Arc::new(Self {
            config,
            driver,
            registry,
            networks,
            catalog,
            secrets,
            servers,
            lifecycle,
            agent,
            pools,
            templates,
            snapshots,
            previews,
            desktops,
            volumes,
            workspaces,
            timers,
            stopping,
        }))
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn driver(&self) -> &DriverHandle {
        &self.driver
    }

    /// The sandboxes this engine knows of, newest first.
    pub fn list(
        &self,
        status: Option<Status>,
        metadata: &[(String, String)],
        tenant: Option<&str>,
    ) -> Vec<Record> {
        self.registry.list(status, metadata, tenant)
    }

    /// Runs the timers until `stop` fires.
    pub async fn run_timers(self: Arc<Self>, stop: CancellationToken) {
        self.timers.clone().run(stop).await;
    }

    /// Clean shutdown: builds and pool refills end; running sandboxes are frozen (their
    /// processes and memory are kept, no CPU is used) and marked paused; the next engine resumes
    /// them on first use.
    pub async fn shutdown(&self) {
        self.stopping.cancel();
        self.lifecycle.shutdown().await;
    }
}
