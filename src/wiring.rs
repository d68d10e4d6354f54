//! The composition root's one decision: which driver runs the sandboxes of an engine this process
//! serves. The engine knows drivers only by the model's interface; this crate knows them all.

use std::sync::Arc;

use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_engine_http::local::LocalError;
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_model::driver::{Driver, DriverError};

/// The driver `config` asks for: the kubernetes driver when it names pods, else the namespaces
/// driver on this machine.
pub async fn driver_for(config: &EngineConfig) -> Result<Driver, DriverError> {
    if let Some(pods) = &config.kubernetes {
        return Ok(sandbox_mcp_kube::KubernetesDriver::new(pods.clone())
            .await?
            .into_driver());
    }
    Ok(
        sandbox_mcp_linux::NamespacesDriver::new(sandbox_mcp_linux::driver::Options {
            sandboxes_dir: config.sandboxes_dir(),
            exe: config.exe.clone(),
            disk_limits: config.disk_limits,
            max_sandboxes: config.max_sandboxes,
            uid_registry: config.uid_registry.clone(),
            favordynmods: config.favordynmods,
            criu: config.criu.clone(),
        })?
        .into_driver(),
    )
}

/// Opens the manager for `config` with its driver.
pub async fn open_manager(config: &EngineConfig) -> Result<Arc<Manager>, LocalError> {
    let driver = driver_for(config).await?;
    Ok(Manager::open(config.clone(), driver).await?)
}
