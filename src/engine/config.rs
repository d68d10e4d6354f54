//! Engine settings, with the defaults users expect.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Whether the engine may cap each sandbox's disk use (`SANDBOX_MCP_DISK_LIMITS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskLimits {
    /// Enforce limits when the host can (root and btrfs); report why not otherwise.
    Auto,
    /// Plain directories, never a loop mount.
    Off,
}

/// Where previews are served unless configured (`--preview-listen`).
const DEFAULT_PREVIEW_LISTEN: &str = "127.0.0.1:8989";

/// Engine-wide preview settings (`--preview-listen`, `--preview-domain`).
#[derive(Debug, Clone)]
pub struct PreviewConfig {
    /// Where the preview listener binds; `None`: previews are off.
    pub listen: Option<SocketAddr>,
    /// The listen address is the default one: if another engine holds it, take any free port
    /// rather than fail (the URLs the engine hands out always carry the real port).
    pub fallback: bool,
    /// The domain under which each preview gets a host name (`{port}-{id}.{domain}`).
    pub domain: String,
}

impl Default for PreviewConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_PREVIEW_LISTEN.parse().ok(),
            fallback: true,
            domain: "localhost".into(),
        }
    }
}

/// Where the host-wide registry of sandbox uid ranges lives unless configured otherwise.
pub(crate) const DEFAULT_UID_REGISTRY: &str = "/var/lib/sandbox-mcp/uid-ranges";

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where state, templates and sandbox filesystems live.
    pub data_dir: PathBuf,
    /// Most sandboxes that may exist at once.
    pub max_sandboxes: usize,
    /// Pause a running sandbox after this long without exec or file operations (`None`: never).
    pub idle_pause: Option<Duration>,
    /// How often timers (auto-pause, auto-kill) are checked.
    pub tick: Duration,
    /// The binary re-executed as the sandbox launcher: this one, normally.
    pub exe: PathBuf,
    /// Whether to cap each sandbox's disk use (a btrfs store; root only).
    pub disk_limits: DiskLimits,
    /// The host-wide registry of sandbox uid ranges (root only), shared by every engine on the
    /// host so that no two live sandboxes ever share host ids.
    pub uid_registry: PathBuf,
    /// Egress default, operator-opened ranges, resolvers, connection cap.
    pub network: crate::engine::network::NetworkConfig,
    /// Where and under which domain sandbox ports are served as preview URLs.
    pub preview: PreviewConfig,
    /// The template `create` uses when the request names none (`base` when `None`).
    pub default_template: Option<String>,
    /// Run sandboxes as pods with these options (the kubernetes driver) instead of in this
    /// machine's namespaces.
    pub kubernetes: Option<crate::engine::kube::pod::PodOptions>,
    /// As root, turn on the kernel's `favordynmods` for the host's cgroup2 hierarchy, so a
    /// sandbox start does not wait for an RCU grace period to join its cgroups.
    pub favordynmods: bool,
}

impl EngineConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            max_sandboxes: 100,
            idle_pause: Some(Duration::from_secs(15 * 60)),
            tick: Duration::from_secs(5),
            exe: PathBuf::from("/proc/self/exe"),
            disk_limits: DiskLimits::Auto,
            uid_registry: PathBuf::from(DEFAULT_UID_REGISTRY),
            network: crate::engine::network::NetworkConfig::default(),
            preview: PreviewConfig::default(),
            default_template: None,
            kubernetes: None,
            favordynmods: true,
        }
    }

    pub fn state_db(&self) -> PathBuf {
        self.data_dir.join("state.db")
    }
    /// The network log's own database (its writes never wait on, or hold up, the state's).
    pub(crate) fn network_log_db(&self) -> PathBuf {
        self.data_dir.join("network-log.db")
    }
    pub(crate) fn lock_file(&self) -> PathBuf {
        self.data_dir.join("engine.lock")
    }
    pub(crate) fn endpoint_file(&self) -> PathBuf {
        self.data_dir.join("engine.json")
    }
    pub(crate) fn templates_dir(&self) -> PathBuf {
        self.data_dir.join("templates")
    }
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.data_dir.join("sandboxes")
    }
}

/// `SANDBOX_MCP_DATA_DIR`, else `$XDG_DATA_HOME/sandbox-mcp` (or `~/.local/share/sandbox-mcp`),
/// or `/var/lib/sandbox-mcp` for root.
pub(crate) fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/sandbox-mcp");
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("sandbox-mcp");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/share/sandbox-mcp")
}
