//! Engine settings, with the defaults users expect.

use std::collections::BTreeMap;
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

/// [`EngineConfig::exec_grace`] unless configured.
pub const DEFAULT_EXEC_GRACE: Duration = Duration::from_secs(10);

/// Where the host-wide registry of sandbox uid ranges lives unless configured otherwise.
pub const DEFAULT_UID_REGISTRY: &str = "/var/lib/sandbox-mcp/uid-ranges";

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where state, templates and sandbox filesystems live.
    pub data_dir: PathBuf,
    /// Most sandboxes that may exist at once.
    pub max_sandboxes: usize,
    /// Idle time after which a paused sandbox is hibernated: its processes written to disk and
    /// their memory freed (`None`: never; needs CRIU).
    pub idle_hibernate: Option<Duration>,
    /// Pause a running sandbox after this long without exec or file operations (`None`: never).
    pub idle_pause: Option<Duration>,
    /// How often timers (auto-pause, auto-kill) are checked.
    pub tick: Duration,
    /// Slack over a command's own timeout before the engine gives up on the agent (and pings it
    /// to tell a slow agent from a wedged one).
    pub exec_grace: Duration,
    /// The binary re-executed as the sandbox launcher: this one, normally.
    pub exe: PathBuf,
    /// Whether to cap each sandbox's disk use (a btrfs store; root only).
    pub disk_limits: DiskLimits,
    /// The host-wide registry of sandbox uid ranges (root only), shared by every engine on the
    /// host so that no two live sandboxes ever share host ids.
    pub uid_registry: PathBuf,
    /// Egress default, operator-opened ranges, resolvers, connection cap.
    pub network: NetworkConfig,
    /// Where and under which domain sandbox ports are served as preview URLs.
    pub preview: PreviewConfig,
    /// The template `create` uses when the request names none (`base` when `None`).
    pub default_template: Option<String>,
    /// Run sandboxes as pods with these options (the kubernetes driver) instead of in this
    /// machine's namespaces.
    pub kubernetes: Option<PodOptions>,
    /// As root, turn on the kernel's `favordynmods` for the host's cgroup2 hierarchy, so a
    /// sandbox start does not wait for an RCU grace period to join its cgroups.
    pub favordynmods: bool,
    /// CRIU, for forks that carry running processes: found on PATH, at a given path, or off.
    pub criu: CriuSetting,
    /// Host folders the operator exposes by name (`--workspace NAME=PATH[:ro]`), which
    /// sandboxes mount copy-on-write.
    pub workspaces: Vec<Workspace>,
    /// Pool sizes the operator sets for shared templates by name (`--warm TEMPLATE=N`), over
    /// the templates' own `warm`.
    pub warm: BTreeMap<String, u32>,
    /// Where E2B's API (control plane and envd) is served (`--e2b-listen`); none: not at all.
    pub e2b_listen: Option<std::net::SocketAddr>,
}

/// The most sandboxes one template's pool keeps.
pub const MAX_WARM: u32 = 16;

/// A host folder sandboxes may mount copy-on-write, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub name: String,
    /// Absolute and canonical (symlinks resolved when it was given).
    pub path: PathBuf,
    /// Sandboxes' changes may not be applied to it.
    pub read_only: bool,
}

impl Workspace {
    /// Parses `NAME=PATH` or `NAME=PATH:ro`: the name as a volume's (lower-case letters, digits,
    /// `_`, `-`), the path an existing directory, resolved to its canonical form.
    pub fn parse(arg: &str) -> Result<Workspace, String> {
        let (name, rest) = arg
            .split_once('=')
            .ok_or_else(|| format!("--workspace {arg:?}: expected NAME=PATH or NAME=PATH:ro"))?;
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
            && name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !valid {
            return Err(format!(
                "--workspace {arg:?}: the name must be 1-63 lower-case letters, digits, `_` or `-`, starting with a letter or digit"
            ));
        }
        let (path, read_only) = match rest.strip_suffix(":ro") {
            Some(p) => (p, true),
            None => (rest, false),
        };
        let path =
            std::fs::canonicalize(path).map_err(|e| format!("--workspace {name}: {path}: {e}"))?;
        if !path.is_dir() {
            return Err(format!(
                "--workspace {name}: {} is not a directory",
                path.display()
            ));
        }
        // Overlay options separate layers with `:` and options with `,`.
        if path.to_string_lossy().contains([':', ',', '\n']) {
            return Err(format!(
                "--workspace {name}: {} contains ':', ',' or a newline, which an overlay cannot stack; rename the folder",
                path.display()
            ));
        }
        if path == std::path::Path::new("/") {
            return Err(format!(
                "--workspace {name}: the host's root cannot be a workspace"
            ));
        }
        Ok(Workspace {
            name: name.to_string(),
            path,
            read_only,
        })
    }
}

impl EngineConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            max_sandboxes: 100,
            idle_pause: Some(Duration::from_secs(15 * 60)),
            idle_hibernate: None,
            tick: Duration::from_secs(5),
            exec_grace: DEFAULT_EXEC_GRACE,
            exe: PathBuf::from("/proc/self/exe"),
            disk_limits: DiskLimits::Auto,
            uid_registry: PathBuf::from(DEFAULT_UID_REGISTRY),
            network: NetworkConfig::default(),
            preview: PreviewConfig::default(),
            default_template: None,
            kubernetes: None,
            favordynmods: true,
            criu: CriuSetting::Auto,
            workspaces: Vec::new(),
            warm: BTreeMap::new(),
            e2b_listen: None,
        }
    }

    pub fn state_db(&self) -> PathBuf {
        self.data_dir.join("state.db")
    }
    /// The network log's own database (its writes never wait on, or hold up, the state's).
    pub fn network_log_db(&self) -> PathBuf {
        self.data_dir.join("network-log.db")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.data_dir.join("engine.lock")
    }
    pub fn endpoint_file(&self) -> PathBuf {
        self.data_dir.join("engine.json")
    }
    pub fn templates_dir(&self) -> PathBuf {
        self.data_dir.join("templates")
    }
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.data_dir.join("sandboxes")
    }
}

/// `SANDBOX_MCP_DATA_DIR`, else `$XDG_DATA_HOME/sandbox-mcp` (or `~/.local/share/sandbox-mcp`),
/// or `/var/lib/sandbox-mcp` for root.
pub fn default_data_dir() -> PathBuf {
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

/// The engine-wide default for what no rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EgressDefault {
    /// The public internet is reachable.
    #[default]
    Open,
    /// Nothing is reachable but what `allow_out` names.
    Closed,
}

/// Connections one sandbox may hold open through the relay at once, unless configured.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Engine-wide network settings (flags of `sandbox-mcp` and `sandbox-mcp engine`).
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// What no rule of a sandbox decides (`--egress`).
    pub egress: EgressDefault,
    /// Ranges the operator opens to sandboxes although the engine forbids them by default
    /// (`--egress-allow`, CIDRs).
    pub egress_allow: Vec<String>,
    /// Resolvers the engine asks (`--dns-upstream`); empty: the host's (/etc/resolv.conf).
    pub dns_upstream: Vec<SocketAddr>,
    /// Connections one sandbox may hold open at once (`--max-connections`).
    pub max_connections: usize,
    /// CA certificates (PEM files) trusted for upstream hosts whose requests get a secret, on
    /// top of the system's roots (`--egress-ca`).
    pub egress_ca: Vec<std::path::PathBuf>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            egress: EgressDefault::Open,
            egress_allow: Vec::new(),
            dns_upstream: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            egress_ca: Vec::new(),
        }
    }
}

/// What the operator chose for the pods (from `sandbox-mcp engine --driver kubernetes`).
#[derive(Debug, Clone, Default)]
pub struct PodOptions {
    pub namespace: String,
    /// Image holding the static binary at `/sandbox-mcp` (copied into each pod).
    pub agent_image: String,
    /// Image of the `base` template.
    pub default_image: String,
    /// Images of other templates, by template name.
    pub images: BTreeMap<String, String>,
    /// `runtimeClassName` per template (gVisor, Kata); `*` applies to every template.
    pub runtime_classes: BTreeMap<String, String>,
    /// uid (and gid) sandboxes run as; `None`: the image's user.
    pub run_as_user: Option<u32>,
    /// `imagePullPolicy` of both containers; `None`: the cluster's default for the image's tag.
    pub pull_policy: Option<String>,
    /// Pods request 1/this of their shape's CPU (limits stay the shape); 1: requests = limits.
    pub cpu_overcommit: f64,
    /// Storage class of named volumes' PersistentVolumeClaims; `None`: no named volumes.
    pub storage_class: Option<String>,
}

impl PodOptions {
    /// The image of `template`, or why there is none.
    pub fn image(&self, template: &str) -> Result<&str, String> {
        if template == crate::BASE_TEMPLATE {
            return Ok(&self.default_image);
        }
        self.images.get(template).map(String::as_str).ok_or_else(|| {
            format!(
                "template {template} has no image on the kubernetes driver; start the engine with --template-image {template}=IMAGE"
            )
        })
    }
}

/// Where the engine finds CRIU (checkpoint/restore of processes, run as a separate program).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CriuSetting {
    /// `criu` on PATH or in the usual sbin directories.
    #[default]
    Auto,
    /// This binary.
    Path(PathBuf),
    /// Never: forks copy files only.
    Off,
}
