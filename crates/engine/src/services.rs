//! The engine's services, each holding only what it needs, composed once by
//! [`crate::manager::Manager`]. From the bottom up:
//!
//! - [`networks`]: a sandbox's network state, egress sockets, the network log;
//! - [`registry`]: the sandboxes this engine knows (entries, lookups by id and tenant, adoption
//!   of those other replicas made);
//! - [`catalog`]: the templates, by key and by the name a tenant gives;
//! - [`secrets`]: secrets and their bindings to sandboxes;
//! - [`lifecycle`]: create, find, update, pause, resume, kill; quotas; recovery; shutdown;
//! - [`agent`]: every request to a sandbox's agent (call, stream, ping, deadlines, crashes);
//! - [`pool`]: `create` as callers see it, with warm pools;
//! - [`snapshots`], [`templates`] (with [`import`]), [`previews`], [`desktop`]: one resource each;
//! - [`volumes`] (named volumes, workspaces) and [`workspaces`] (a sandbox's changes to one);
//! - [`timers`]: expiry, idle pauses, activity.
//!
//! A service reaches another only below it, through the `Arc` it was given; none holds the
//! manager. Every driver call goes through [`crate::driver::DriverHandle`] and every record
//! through [`crate::records::Records`], both async.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_mcp_model::driver::Usage;
use sandbox_mcp_network::EgressDefault;
use sandbox_mcp_network::log as netlog;
use sandbox_mcp_protocol::{ExecOutcome, JobInfo, Output};

use std::sync::Arc;

use crate::records::Records;
use crate::state::{NetworkRules, Record, Status};

/// The services a service that makes sandboxes ([`pool`]'s creates, [`snapshots`]' forks)
/// goes through: records and entries, networks and secrets, templates, lifecycles, the agent.
#[derive(Clone)]
pub(crate) struct Making {
    pub records: Arc<Records>,
    pub registry: Arc<registry::Registry>,
    pub networks: Arc<networks::Networks>,
    pub secrets: Arc<secrets::Secrets>,
    pub catalog: Arc<catalog::Catalog>,
    pub lifecycle: Arc<lifecycle::Lifecycle>,
    pub agent: Arc<agent::AgentClient>,
    pub volumes: Arc<volumes::Volumes>,
}

pub mod agent;
pub mod catalog;
pub mod desktop;
pub mod import;
pub mod lifecycle;
pub mod networks;
pub mod pool;
pub mod previews;
pub(crate) mod registry;
pub mod secrets;
pub mod servers;
pub mod snapshots;
pub mod templates;
pub(crate) mod timers;
pub mod volumes;
pub mod workspaces;

pub use desktop::{ActionRequest, parse_resolution};
pub use import::import;
pub use previews::{PreviewError, PreviewView, TOKEN_PARAM};
pub use secrets::SecretView;
pub use snapshots::{Diffed, MAX_LABELS, MAX_SNAPSHOTS, Restored};
pub use templates::ShapeRequest;
pub use templates::{Step, TemplateRequest};
pub use volumes::{MountRequest, VolumeView};

/// Cap on each of stdout and stderr in an exec result.
pub const EXEC_OUTPUT_CAP: u64 = 32 * 1024;
/// Largest file `read_file` returns.
pub const READ_LIMIT: u64 = 1024 * 1024;
/// Largest decoded file `write_file` accepts.
pub const WRITE_LIMIT: usize = 8 * 1024 * 1024;
/// Largest zip `download_dir` returns.
pub const ZIP_LIMIT: u64 = 10 * 1024 * 1024;
/// Most entries `list_files` returns.
pub const LIST_LIMIT: u64 = 1000;
/// Most output returned by one job status call.
pub const JOB_PAGE: u64 = 32 * 1024;
/// Deadline for agent operations other than exec.
pub(crate) const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A request to create a sandbox, validated by the API layer.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub name: Option<String>,
    pub template: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub env: Vec<(String, String)>,
    pub timeout_seconds: Option<u64>,
    pub tenant: Option<String>,
    pub network: NetworkRules,
    /// Environment variable → secret name.
    pub secrets: BTreeMap<String, String>,
    /// Limits asked for, at most the template's.
    pub shape: ShapeRequest,
    /// A desktop of this size (create_computer); none for a plain sandbox.
    pub desktop: Option<sandbox_mcp_protocol::Screen>,
    /// Volumes and workspaces to mount, resolved by [`volumes::Volumes::resolve`].
    pub volumes: Vec<sandbox_mcp_model::record::Mounted>,
    /// What its timeout does to it.
    pub on_timeout: sandbox_mcp_model::record::OnTimeout,
}

/// A sandbox as the API reports it.
#[derive(Debug, Clone)]
pub struct SandboxView {
    pub record: Record,
    pub network: NetworkInfo,
    pub usage: Option<(Usage, u64)>,
    pub jobs: Vec<JobInfo>,
}

/// What the engine gives every sandbox's network, beside the sandbox's own rules.
#[derive(Debug, Clone, Copy)]
pub struct NetworkInfo {
    pub default: EgressDefault,
    /// Traffic goes through the engine under the sandbox's policy (false: loopback only).
    pub filtered: bool,
}

/// A page of a sandbox's network log.
#[derive(Debug, Clone)]
pub struct NetworkLogPage {
    pub entries: Vec<netlog::Stored>,
    pub next_cursor: Option<i64>,
}

/// Resource use and limits of one sandbox.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub status: Status,
    pub usage: Usage,
    pub disk_bytes: u64,
    pub disk_limit_bytes: u64,
    pub limits_enforced: bool,
    pub disk_limit_enforced: bool,
}

/// What a streamed call yields: output as it arrives, then the reply.
#[derive(Debug, Clone)]
pub enum Event<R> {
    Output(Output),
    Reply(R),
}

/// An exec's outcome plus what the engine learned about memory.
#[derive(Debug, Clone)]
pub struct ExecResult {
    pub outcome: ExecOutcome,
    pub oom_killed: bool,
}
