//! `sandbox-mcp engine`: the control plane alone, over HTTP, with the driver `--driver` names
//! (namespaces on this machine, or pods in a Kubernetes cluster).

use super::args::{DriverArg, EngineArgs, KubeArgs};
use super::process;

pub(super) async fn run(args: EngineArgs) -> anyhow::Result<()> {
    use sandbox_mcp_engine_http::local;
    process::init_logging("info");
    let mut config = args.settings.config();
    config.kubernetes = args.kubernetes.options()?;
    config.e2b_listen = args.e2b_listen;
    if config.kubernetes.is_some() {
        // Pods cannot be paused (see the driver): idle sandboxes keep running until their
        // timeout or a kill, rather than failing a pause on every tick.
        config.idle_pause = None;
    }
    let keys: Vec<String> = args
        .keys
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    if keys.is_empty() && args.keys_file.is_none() {
        anyhow::bail!(
            "no keys: set SANDBOX_MCP_ENGINE_KEYS (comma-separated) or --keys-file, so that only clients with a key can create sandboxes"
        );
    }
    if let Some(file) = &args.keys_file
        && !file.is_file()
    {
        anyhow::bail!("keys file {} does not exist", file.display());
    }
    local::prepare_data_dir(&config)?;
    let Some(lock) = local::try_lock(&config)? else {
        let owner = match local::endpoint(&config) {
            Some(endpoint) => format!(" at {}, process {}", endpoint.url, endpoint.pid),
            None => String::new(),
        };
        anyhow::bail!(
            "another engine already serves {}{owner}; stop it first or use another SANDBOX_MCP_DATA_DIR",
            config.data_dir.display(),
        );
    };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    // `serve` adds a key only local MCP servers know (from engine.json), so they can share it.
    let driver = crate::wiring::driver_for(&config)
        .await
        .map_err(local::LocalError::from)?;
    let serving = local::serve(
        &config,
        lock,
        listener,
        keys,
        args.keys_file.clone(),
        driver,
    )
    .await?;
    process::terminated().await;
    tracing::info!("shutting down: finishing requests, pausing sandboxes");
    serving.shutdown().await;
    Ok(())
}

impl KubeArgs {
    /// The kubernetes driver's options, or `None` for the namespaces driver.
    fn options(&self) -> anyhow::Result<Option<sandbox_mcp_kube::pod::PodOptions>> {
        if self.driver != DriverArg::Kubernetes {
            return Ok(None);
        }
        let need = |v: &Option<String>, flag: &str| {
            v.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
                anyhow::anyhow!("--driver kubernetes needs {flag} IMAGE (see README, Kubernetes)")
            })
        };
        let pairs = |items: &[String],
                     flag: &str|
         -> anyhow::Result<std::collections::BTreeMap<String, String>> {
            items
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| match s.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                        Ok((k.trim().to_string(), v.trim().to_string()))
                    }
                    _ => anyhow::bail!("{flag} takes NAME=VALUE, not {s:?}"),
                })
                .collect()
        };
        let images = pairs(&self.template_image, "--template-image")?;
        for name in images.keys() {
            sandbox_mcp_storage::templates::check_name(name)
                .map_err(|e| anyhow::anyhow!("--template-image {name}: {e}"))?;
        }
        if let Some(p) = &self.image_pull_policy
            && !["Always", "IfNotPresent", "Never"].contains(&p.as_str())
        {
            anyhow::bail!("--image-pull-policy is Always, IfNotPresent or Never, not {p:?}");
        }
        if !(1.0..=100.0).contains(&self.cpu_overcommit) {
            anyhow::bail!(
                "--cpu-overcommit is a ratio from 1 (requests equal limits) to 100, not {}",
                self.cpu_overcommit
            );
        }
        Ok(Some(sandbox_mcp_kube::pod::PodOptions {
            namespace: self.namespace.clone(),
            agent_image: need(&self.agent_image, "--agent-image")?,
            default_image: need(&self.default_image, "--default-image")?,
            images,
            runtime_classes: pairs(&self.runtime_class, "--runtime-class")?,
            run_as_user: self.run_as_user,
            pull_policy: self.image_pull_policy.clone(),
            cpu_overcommit: self.cpu_overcommit,
            storage_class: self.storage_class.clone(),
        }))
    }
}
