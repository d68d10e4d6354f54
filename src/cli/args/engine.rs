//! The engine's arguments: the settings of an embedded or standalone engine (data dir, limits,
//! egress, previews), and what only `sandbox-mcp engine` takes (listen address, keys, driver).

use std::path::PathBuf;

use clap::Args;

use super::DataDirArg;

/// Settings of the embedded or standalone engine.
#[derive(Args, Debug, Clone)]
pub(crate) struct EngineSettings {
    #[command(flatten)]
    pub(crate) data: DataDirArg,
    /// Most sandboxes that may exist at once.
    #[arg(long, env = "SANDBOX_MCP_MAX_SANDBOXES", default_value_t = 100)]
    pub(crate) max_sandboxes: usize,
    /// Pause a sandbox after this many seconds without exec or file operations (0: never).
    #[arg(long, env = "SANDBOX_MCP_IDLE_PAUSE", default_value_t = 900)]
    pub(crate) idle_pause: u64,
    /// Hibernate a sandbox after this many seconds without exec or file operations: its
    /// processes are written to disk and their memory freed; the next call restores them
    /// (0: never; needs CRIU, see --criu).
    #[arg(long, env = "SANDBOX_MCP_IDLE_HIBERNATE", default_value_t = 0)]
    pub(crate) idle_hibernate: u64,
    /// Cap each sandbox's disk use at its template's size (`auto`: when running as root with
    /// btrfs available, via a loop-mounted btrfs store; `off`: plain directories, use only
    /// reported).
    #[arg(
        long,
        env = "SANDBOX_MCP_DISK_LIMITS",
        value_enum,
        default_value = "auto"
    )]
    pub(crate) disk_limits: AutoOff,
    /// `auto`: as root, turn on the kernel's `favordynmods` option of the host's cgroup2 mount
    /// (a remount keeping its other options), so a sandbox's start does not wait for an RCU
    /// grace period to join its cgroups (5-9 ms); the kernel's price is slightly dearer forks
    /// and exits host-wide. `off`: leave the host's cgroup mounts as they are.
    #[arg(
        long,
        env = "SANDBOX_MCP_FAVORDYNMODS",
        value_enum,
        default_value = "auto"
    )]
    pub(crate) favordynmods: AutoOff,
    /// CRIU (4.0 or later), with which forks carry running processes — code contexts' variables,
    /// background jobs — into the children: `auto` finds `criu` on PATH, a path names the binary,
    /// `off` makes forks copy files only. Checked once at start; `sandbox-mcp engine` and the
    /// health answer say whether it works.
    #[arg(
        long,
        env = "SANDBOX_MCP_CRIU",
        default_value = "auto",
        value_name = "auto|PATH|off"
    )]
    pub(crate) criu: String,
    /// What sandboxes may reach when their own rules do not say: `open` (the public internet)
    /// or `closed` (only what a sandbox's `allow_out` names). The host, loopback, link-local
    /// and private ranges are closed either way.
    #[arg(long, env = "SANDBOX_MCP_EGRESS", value_enum, default_value = "open")]
    pub(crate) egress: EgressArg,
    /// A range sandboxes may reach although the engine forbids it by default (a private
    /// network, a documentation range), as a CIDR; repeat or separate with commas.
    #[arg(
        long = "egress-allow",
        env = "SANDBOX_MCP_EGRESS_ALLOW",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = sandbox_mcp_network::parse_egress_allow
    )]
    pub(crate) egress_allow: Vec<String>,
    /// A resolver the engine asks for sandboxes, as IP or IP:PORT; repeat or separate with
    /// commas [default: the host's, from /etc/resolv.conf].
    #[arg(
        long = "dns-upstream",
        env = "SANDBOX_MCP_DNS_UPSTREAM",
        value_name = "IP[:PORT]",
        value_delimiter = ',',
        value_parser = sandbox_mcp_network::parse_dns_upstream
    )]
    pub(crate) dns_upstream: Vec<std::net::SocketAddr>,
    /// Outbound connections one sandbox may hold open at once; beyond it, new ones are reset
    /// and logged as blocked.
    #[arg(long, env = "SANDBOX_MCP_MAX_CONNECTIONS", default_value_t = sandbox_mcp_network::DEFAULT_MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// A CA certificate (PEM file) trusted, beside the system's roots, for hosts whose requests
    /// get a secret swapped in (a private API behind an internal CA); repeat for more.
    #[arg(
        long = "egress-ca",
        env = "SANDBOX_MCP_EGRESS_CA",
        value_name = "FILE",
        value_delimiter = ','
    )]
    pub(crate) egress_ca: Vec<PathBuf>,
    /// Where sandbox ports are served as preview URLs, or `off`. When the default address is
    /// taken (another engine), a free port is used; the URLs the engine hands out carry it.
    #[arg(
        long = "preview-listen",
        env = "SANDBOX_MCP_PREVIEW_LISTEN",
        value_name = "ADDR|off",
        value_parser = |s: &str| sandbox_mcp_engine_http::preview::parse_listen(s).map(PreviewListen)
    )]
    pub(crate) preview_listen: Option<PreviewListen>,
    /// The domain of preview host names, `{port}-{sandbox id}.{domain}`: `localhost` needs no
    /// DNS on the same machine; elsewhere, a wildcard DNS name pointing at the engine.
    #[arg(
        long = "preview-domain",
        env = "SANDBOX_MCP_PREVIEW_DOMAIN",
        value_name = "DOMAIN",
        default_value = "localhost",
        value_parser = sandbox_mcp_engine_http::preview::parse_domain
    )]
    pub(crate) preview_domain: String,
    /// The template sandboxes start from when a request names none (it must exist and be
    /// ready when the engine starts).
    #[arg(long = "default-template", env = "SANDBOX_MCP_DEFAULT_TEMPLATE", value_name = "NAME",
          value_parser = |s: &str| sandbox_mcp_storage::templates::check_name(s).map(|()| s.to_string()))]
    pub(crate) default_template: Option<String>,
    /// A host folder sandboxes may mount by NAME (create's `volumes`), copy-on-write: they read
    /// its files, their writes stay in their own layer, the folder never changes until
    /// `sandbox-mcp workspace apply`; `:ro` refuses even that. Repeat for more.
    #[arg(
        long = "workspace",
        env = "SANDBOX_MCP_WORKSPACES",
        value_name = "NAME=PATH[:ro]",
        value_delimiter = ',',
        value_parser = sandbox_mcp_model::config::Workspace::parse
    )]
    pub(crate) workspaces: Vec<sandbox_mcp_model::config::Workspace>,
    /// Keep N sandboxes of a shared template started, handed out by create at once, as
    /// TEMPLATE=N (repeat, or comma-separate; at most 16 each). Overrides the template's own
    /// `warm`; the only way to pool the built-in `base` and, on the kubernetes driver, the image
    /// templates. Pooled sandboxes outlive a restart of the engine.
    #[arg(
        long = "warm",
        env = "SANDBOX_MCP_WARM",
        value_name = "TEMPLATE=N",
        value_delimiter = ',',
        value_parser = parse_warm
    )]
    pub(crate) warm: Vec<(String, u32)>,
}

/// `--warm TEMPLATE=N`.
fn parse_warm(arg: &str) -> Result<(String, u32), String> {
    let (name, n) = arg
        .split_once('=')
        .ok_or_else(|| format!("--warm {arg:?}: expected TEMPLATE=N, e.g. base=2"))?;
    sandbox_mcp_storage::templates::check_name(name.trim())?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("--warm {arg:?}: N is a number of sandboxes, 0 to 16"))?;
    if n > sandbox_mcp_model::config::MAX_WARM {
        return Err(format!(
            "--warm {arg:?}: at most {} sandboxes per template",
            sandbox_mcp_model::config::MAX_WARM
        ));
    }
    Ok((name.trim().to_string(), n))
}

/// `--preview-listen`: an address, or `None` for `off`.
#[derive(Debug, Clone)]
pub(crate) struct PreviewListen(pub(crate) Option<std::net::SocketAddr>);

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub(crate) enum EgressArg {
    Open,
    Closed,
}

/// `auto` or `off`, for settings the engine applies when the host allows.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub(crate) enum AutoOff {
    Auto,
    Off,
}

#[derive(Args, Debug)]
pub(crate) struct EngineArgs {
    #[command(flatten)]
    pub(crate) settings: EngineSettings,
    /// Address to listen on.
    #[arg(long, env = "SANDBOX_MCP_LISTEN", default_value = "127.0.0.1:7070")]
    pub(crate) listen: String,
    /// Comma-separated bearer keys accepted by the engine.
    #[arg(long, env = "SANDBOX_MCP_ENGINE_KEYS", hide_env_values = true)]
    pub(crate) keys: Option<String>,
    /// File with one accepted key per line, optionally followed by a tenant the key is bound to
    /// (`KEY TENANT`; `#` comments allowed); re-read when it changes.
    #[arg(long, env = "SANDBOX_MCP_ENGINE_KEYS_FILE")]
    pub(crate) keys_file: Option<PathBuf>,
    /// Also serve E2B's API (its control plane and envd, the API the E2B SDKs use) at this
    /// address, for `E2B_API_URL=http://ADDR E2B_SANDBOX_URL=http://ADDR E2B_API_KEY=<a key>`.
    #[arg(
        long = "e2b-listen",
        env = "SANDBOX_MCP_E2B_LISTEN",
        value_name = "ADDR"
    )]
    pub(crate) e2b_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(crate) kubernetes: KubeArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DriverArg {
    /// Linux namespaces on this machine.
    Namespaces,
    /// Pods in a Kubernetes cluster (credentials from KUBECONFIG or the pod's service account).
    Kubernetes,
}

#[derive(Args, Debug)]
pub(crate) struct KubeArgs {
    /// Where sandboxes run: `namespaces` (this machine) or `kubernetes` (pods in a cluster).
    #[arg(
        long,
        env = "SANDBOX_MCP_DRIVER",
        value_enum,
        default_value = "namespaces"
    )]
    pub(crate) driver: DriverArg,
    /// kubernetes: the namespace sandbox pods are made in.
    #[arg(long, env = "SANDBOX_MCP_K8S_NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// kubernetes: an image holding the static sandbox-mcp binary at /sandbox-mcp (each pod's
    /// init container copies it in, so any template image works).
    #[arg(long, env = "SANDBOX_MCP_AGENT_IMAGE")]
    pub(crate) agent_image: Option<String>,
    /// kubernetes: the image of the `base` template.
    #[arg(long, env = "SANDBOX_MCP_DEFAULT_IMAGE")]
    pub(crate) default_image: Option<String>,
    /// kubernetes: another template, as NAME=IMAGE (repeat, or comma-separate).
    #[arg(long, env = "SANDBOX_MCP_TEMPLATE_IMAGES", value_delimiter = ',')]
    pub(crate) template_image: Vec<String>,
    /// kubernetes: a runtimeClassName (gVisor, Kata) for a template, as TEMPLATE=CLASS; `*=CLASS`
    /// for every template (repeat, or comma-separate).
    #[arg(long, env = "SANDBOX_MCP_RUNTIME_CLASSES", value_delimiter = ',')]
    pub(crate) runtime_class: Vec<String>,
    /// kubernetes: run sandboxes as this uid and gid (non-root when not 0) [default: the image's
    /// user].
    #[arg(long, env = "SANDBOX_MCP_RUN_AS_USER")]
    pub(crate) run_as_user: Option<u32>,
    /// kubernetes: imagePullPolicy of sandbox pods (`Always`, `IfNotPresent`, `Never`).
    #[arg(long, env = "SANDBOX_MCP_IMAGE_PULL_POLICY")]
    pub(crate) image_pull_policy: Option<String>,
    /// kubernetes: pods request 1/RATIO of their shape's CPU (still limited to all of it), so
    /// RATIO times more sandboxes fit a node's cores; 1 keeps requests equal to limits.
    #[arg(long, env = "SANDBOX_MCP_CPU_OVERCOMMIT", default_value_t = 1.0)]
    pub(crate) cpu_overcommit: f64,
    /// Storage class of named volumes, each a PersistentVolumeClaim (ReadWriteMany) of its
    /// size; without it, volumes are refused on this driver.
    #[arg(long, env = "SANDBOX_MCP_K8S_STORAGE_CLASS", value_name = "CLASS")]
    pub(crate) storage_class: Option<String>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::parse_warm;

    #[test]
    fn warm_takes_a_template_and_a_count_up_to_sixteen() {
        assert_eq!(parse_warm(" base = 4 "), Ok(("base".into(), 4)));
        assert_eq!(parse_warm("py=0"), Ok(("py".into(), 0)));
        for (bad, says) in [
            ("base", "expected TEMPLATE=N"),
            ("base=17", "at most 16"),
            ("base=-1", "0 to 16"),
            ("base=many", "0 to 16"),
            ("../x=1", ""),
        ] {
            let e = parse_warm(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
