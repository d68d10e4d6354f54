//! What the engine records of a sandbox: its status, shape, rules, secrets bindings, previews
//! and snapshots. Stored by the engine's state (SQLite), or with the sandbox by a driver that
//! shares records between engine replicas.

use std::collections::BTreeMap;

use sandbox_mcp_protocol::Screen;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Creating,
    Running,
    Paused,
    Killing,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Creating => "creating",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Killing => "killing",
        }
    }

    /// A stored status (anything unknown reads as paused: the safe way to bring it back).
    pub fn parse(s: &str) -> Status {
        match s {
            "creating" => Status::Creating,
            "running" => Status::Running,
            "killing" => Status::Killing,
            _ => Status::Paused,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub id: String,
    pub name: Option<String>,
    pub template: String,
    pub status: Status,
    pub metadata: BTreeMap<String, String>,
    pub env: Vec<(String, String)>,
    pub shape: Shape,
    pub uid_slot: u32,
    pub created_at: i64,
    pub last_active_at: i64,
    pub expires_at: Option<i64>,
    /// Owner of the sandbox when the engine is shared by tenants (None: untenanted).
    pub tenant: Option<String>,
    /// The sandbox's egress rules, as given (validated by the API layer).
    pub network: NetworkRules,
    /// Secrets bound to environment variables, by variable.
    pub secrets: BTreeMap<String, Binding>,
    /// The screen of a desktop sandbox (made with create_computer); none for others.
    pub desktop: Option<Screen>,
    /// Named volumes and workspaces it mounts, in the order given.
    pub volumes: Vec<Mounted>,
    /// What its timeout does to it.
    pub on_timeout: OnTimeout,
}

impl Record {
    /// Whether its timeout has come by `now` (milliseconds since the epoch).
    pub fn timed_out(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// What happens to a sandbox when its timeout is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// It is killed: its processes and files are gone.
    #[default]
    Kill,
    /// It is paused with its memory; resuming it carries on where it was.
    Pause,
    /// Its processes are stopped and its files kept; resuming it starts it afresh (a new boot).
    Stop,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Kill => "kill",
            OnTimeout::Pause => "pause",
            OnTimeout::Stop => "stop",
        }
    }

    /// A stored action (anything unknown reads as kill, what a timeout did before there was a
    /// choice).
    pub fn parse(s: &str) -> OnTimeout {
        match s {
            "pause" => OnTimeout::Pause,
            "stop" => OnTimeout::Stop,
            _ => OnTimeout::Kill,
        }
    }
}

/// A named volume or a workspace a sandbox mounts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mounted {
    /// The volume's or workspace's name (as the caller wrote it).
    pub name: String,
    /// Absolute mount point inside the sandbox, normalized.
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    /// What is mounted.
    pub source: MountSource,
}

/// What a [`Mounted`] name stands for, fixed when the sandbox was created.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MountSource {
    /// A named volume: the driver's key for its directory.
    Volume { key: String },
    /// A host folder the operator exposed, mounted copy-on-write (its own overlay).
    Workspace { host: std::path::PathBuf },
}

/// A secret bound to one of a sandbox's environment variables.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Binding {
    pub secret: String,
    /// What the variable holds instead of the value (unique to this sandbox and binding).
    pub standin: String,
    /// The secret's hosts when it was bound: TLS to them is still decrypted if the secret is
    /// deleted, so that requests fail with the reason rather than pass unseen.
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// A sandbox's egress rules as the caller wrote them (the engine's policy parses them).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetworkRules {
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
}

/// A sandbox port served on the engine's preview listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub port: u16,
    /// The secret a private preview's visitors present (random, 256 bits).
    pub token: String,
    /// Opens without the token.
    pub public: bool,
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

/// A snapshot of a sandbox's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    /// Its files are complete (false while they are made or deleted).
    pub ready: bool,
    /// How its files were made: `btrfs` or `copy`.
    pub method: String,
    /// Bytes of the sandbox's own files when it was taken: what it counts against the disk.
    pub size_bytes: u64,
    pub created_at: i64,
    /// A memory snapshot: bytes of the process state kept with it (read from the driver, not
    /// stored); `None`: files only.
    pub memory_bytes: Option<u64>,
}

/// The resources a sandbox gets (stored as is in a template's file).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    pub vcpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub max_pids: u64,
}
