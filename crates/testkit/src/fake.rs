//! A fake driver: sandboxes that are directories and an agent that is a task, so the engine's
//! lifecycles, crash recovery, fork rollback and deadlines can be tested by an ordinary user on
//! any machine — no namespaces, cgroups, overlayfs, root or network. In the spirit of omicron's
//! simulated sled agent: the engine above it is the real one, only what it drives is simulated.
//!
//! - Isolation ([`isolation`]): each `start` makes a new agent "incarnation"; `connect` hands
//!   the engine one end of a [`tokio::io::duplex`] pipe and serves the real protocol of
//!   `sandbox-mcp-protocol` on the other ([`agent`]), one request per connection as the real
//!   agent does. Freezing, stopping and destroying act on the incarnation.
//! - Storage ([`storage`]): a sandbox's files are the directory `<root>/sandboxes/<id>`, a
//!   snapshot's `<root>/snapshots/<name>`; clones and captures copy them file by file, so a
//!   fork's child sees its parent's files and a restore brings old ones back.
//! - Commands ([`shell`]): a tiny interpreter, not processes — `echo`, `cat`, `printenv`, `pwd`,
//!   `cd`, `ls`, `mkdir`, `touch`, `rm`, `sleep`, `true`, `false`, `exit N`, with `;`, `&&`, `||`
//!   and `>`/`>>`/`>&2` — plus three faults a command can cause: `agent-crash` (the agent dies
//!   mid-command), `agent-hang` (it stops answering) and `oom-kill` (the command is OOM-killed).
//!
//! Knobs ([`FakeDriver`]'s methods), per sandbox or for the next starts: [`FakeDriver::hang`]
//! (the agent accepts connections but never answers), [`FakeDriver::crash`] (its connections
//! close and liveness says stopped), [`FakeDriver::oom_next_exec`] (the next command ends
//! OOM-killed and `oom_kills` counts it), [`FakeDriver::gone`] (liveness `Gone`, connect fails
//! with `DriverError::Gone`), [`FakeDriver::fail_starts`], [`FakeDriver::stall_starts`] (a start
//! that never resolves, to leave a record `creating`) and [`FakeDriver::fail_clone_after`]
//! (storage clones fail after `n` more, for fork rollback). What the driver holds is readable
//! back: slots, agents, directories, starts.

mod agent;
mod files;
mod isolation;
mod shell;
mod storage;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sandbox_mcp_model::driver::{Capabilities, Driver};
use tokio::sync::watch;

/// The name the fake driver reports.
pub const NAME: &str = "fake";

/// A driver whose sandboxes are directories and whose agents are tasks. Cloning it shares the
/// same sandboxes, so a test keeps one to turn knobs and look inside while the engine holds
/// another; an engine reopened on the same data dir with a clone finds the sandboxes as a
/// restarted engine finds a host's.
#[derive(Clone)]
pub struct FakeDriver {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    root: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sandboxes: BTreeMap<String, Sandbox>,
    /// Identity slots claimed and not released.
    slots: BTreeSet<u32>,
    /// The next this many starts fail (after making the sandbox's directory).
    fail_starts: usize,
    /// The next this many starts never resolve.
    stall_starts: usize,
    /// Storage clones still allowed before one fails (`None`: no failure planned).
    clones_left: Option<usize>,
    /// Agent incarnations made so far (each start makes one).
    generations: u64,
}

/// What the fake knows of one sandbox.
#[derive(Default)]
struct Sandbox {
    /// Its running agent; `None`: stopped (never started, crashed, stopped, destroyed).
    agent: Option<Incarnation>,
    /// Why it no longer exists where the driver keeps it.
    gone: Option<String>,
    oom_kills: u64,
    /// The next command ends OOM-killed.
    oom_next: bool,
    starts: u64,
    /// The agent's own environment and working directory, from the last start.
    env: Vec<(String, String)>,
    workdir: Option<String>,
}

/// One agent process: what every connection to it watches.
struct Incarnation {
    generation: u64,
    condition: watch::Sender<Condition>,
}

/// What an agent can do right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Condition {
    frozen: bool,
    hung: bool,
    dead: bool,
}

impl Condition {
    fn answers(self) -> bool {
        !(self.frozen || self.hung || self.dead)
    }
}

/// What an agent's connection needs to know of its sandbox.
#[derive(Clone)]
pub(crate) struct AgentContext {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: String,
    pub(crate) generation: u64,
    pub(crate) files: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) workdir: String,
    pub(crate) condition: watch::Receiver<Condition>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeDriver {
    /// A fake driver keeping its sandboxes' files under `root` (made if missing). Sandboxes
    /// whose directories are already there (a previous fake's) are known as stopped.
    pub fn new(root: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(root.join("sandboxes"))?;
        std::fs::create_dir_all(root.join("snapshots"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                state: Mutex::new(State::default()),
            }),
        })
    }

    /// The driver as the engine takes it: the `base` template served as a driver's image (so
    /// no template is built from the host's files), limits not enforced, no egress, stopped
    /// sandboxes restartable.
    pub fn driver(&self) -> Driver {
        Driver {
            capabilities: Capabilities {
                name: NAME,
                limits_enforced: false,
                disk_limits_enforced: false,
                egress: false,
                network_unfiltered: false,
                serves_ports: false,
                restarts_stopped: true,
                timeouts_extend: true,
                image_templates: Some(vec![(
                    sandbox_mcp_model::BASE_TEMPLATE.to_string(),
                    "fake".to_string(),
                )]),
                live_state: Default::default(),
                volumes_refused: Some("the fake driver has no volumes".into()),
                workspaces_refused: Some("the fake driver has no workspaces".into()),
                volume_quotas: false,
            },
            isolation: Arc::new(self.clone()),
            storage: Arc::new(self.clone()),
            shared: None,
        }
    }

    // --- Knobs ---

    /// Sandbox `id`'s agent stops answering: connections are accepted, requests read, and no
    /// reply is ever sent (one in flight included). Liveness still says running.
    pub fn hang(&self, id: &str) {
        self.inner.hang(id);
    }

    /// Sandbox `id`'s agent dies: every connection to it closes, a command in flight included;
    /// liveness says stopped and connecting is refused until the next start.
    pub fn crash(&self, id: &str) {
        self.inner.crash(id);
    }

    /// Sandbox `id`'s next command ends OOM-killed (`SIGKILL`), counted in its `oom_kills`.
    pub fn oom_next_exec(&self, id: &str) {
        if let Some(s) = lock(&self.inner.state).sandboxes.get_mut(id) {
            s.oom_next = true;
        }
    }

    /// Sandbox `id` no longer exists where the driver keeps it (`why`, for the caller), as a
    /// deleted pod: its agent dies and its files go; liveness says gone, and starting or
    /// connecting fails with `DriverError::Gone`.
    pub fn gone(&self, id: &str, why: &str) {
        let mut state = lock(&self.inner.state);
        let sandbox = state.sandboxes.entry(id.to_string()).or_default();
        sandbox.kill_agent();
        sandbox.gone = Some(why.to_string());
        let _ = std::fs::remove_dir_all(self.inner.sandbox_dir(id));
    }

    /// The next `n` starts fail (each after making its sandbox's directory, as a launcher that
    /// fails half-way would).
    pub fn fail_starts(&self, n: usize) {
        lock(&self.inner.state).fail_starts = n;
    }

    /// The next `n` starts never resolve (the sandbox's directory is made first).
    pub fn stall_starts(&self, n: usize) {
        lock(&self.inner.state).stall_starts = n;
    }

    /// The next `n` storage clones succeed and the one after fails (then clones work again).
    pub fn fail_clone_after(&self, n: usize) {
        lock(&self.inner.state).clones_left = Some(n);
    }

    // --- What the driver holds ---

    /// Identity slots claimed and not released, in order.
    pub fn slots(&self) -> Vec<u32> {
        lock(&self.inner.state).slots.iter().copied().collect()
    }

    /// Sandboxes whose agent runs (frozen or hung included), by id.
    pub fn running(&self) -> Vec<String> {
        lock(&self.inner.state)
            .sandboxes
            .iter()
            .filter(|(_, s)| s.agent.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Sandboxes that have a directory of files, by id.
    pub fn sandbox_dirs(&self) -> Vec<String> {
        names_in(&self.inner.root.join("sandboxes"))
    }

    /// Snapshots that have a directory of files, by name.
    pub fn snapshot_dirs(&self) -> Vec<String> {
        names_in(&self.inner.root.join("snapshots"))
    }

    /// Where sandbox `id`'s files are (its `/`).
    pub fn files_of(&self, id: &str) -> PathBuf {
        self.inner.sandbox_dir(id)
    }

    /// How many times sandbox `id` was started.
    pub fn starts(&self, id: &str) -> u64 {
        lock(&self.inner.state)
            .sandboxes
            .get(id)
            .map_or(0, |s| s.starts)
    }

    /// How many times sandbox `id` ran out of memory.
    pub fn oom_kills_of(&self, id: &str) -> u64 {
        lock(&self.inner.state)
            .sandboxes
            .get(id)
            .map_or(0, |s| s.oom_kills)
    }

    /// Whether sandbox `id`'s agent is frozen.
    pub fn is_frozen(&self, id: &str) -> bool {
        lock(&self.inner.state)
            .sandboxes
            .get(id)
            .and_then(|s| s.agent.as_ref())
            .is_some_and(|a| a.condition.borrow().frozen)
    }
}

impl Inner {
    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.root.join("sandboxes").join(id)
    }

    fn snapshot_dir(&self, name: &str) -> PathBuf {
        self.root.join("snapshots").join(name)
    }

    /// Changes the condition of sandbox `id`'s agent (of incarnation `generation` only, when
    /// given: a fault a command causes must not reach the agent started after it).
    fn modify(&self, id: &str, generation: Option<u64>, f: impl FnOnce(&mut Condition)) {
        if let Some(agent) = lock(&self.state)
            .sandboxes
            .get(id)
            .and_then(|s| s.agent.as_ref())
            .filter(|a| generation.is_none_or(|g| g == a.generation))
        {
            agent.condition.send_modify(f);
        }
    }

    fn hang(&self, id: &str) {
        self.modify(id, None, |c| c.hung = true);
    }

    fn crash(&self, id: &str) {
        if let Some(s) = lock(&self.state).sandboxes.get_mut(id) {
            s.kill_agent();
        }
    }

    /// [`FakeDriver::hang`] from a command of incarnation `generation`.
    pub(crate) fn hang_generation(&self, id: &str, generation: u64) {
        self.modify(id, Some(generation), |c| c.hung = true);
    }

    /// [`FakeDriver::crash`] from a command of incarnation `generation`.
    pub(crate) fn crash_generation(&self, id: &str, generation: u64) {
        let mut state = lock(&self.state);
        if let Some(s) = state.sandboxes.get_mut(id)
            && s.agent.as_ref().is_some_and(|a| a.generation == generation)
        {
            s.kill_agent();
        }
    }

    /// Counts an OOM kill in sandbox `id`.
    pub(crate) fn count_oom(&self, id: &str) {
        if let Some(s) = lock(&self.state).sandboxes.get_mut(id) {
            s.oom_kills += 1;
        }
    }

    /// Whether sandbox `id`'s next command was to be OOM-killed (the knob is used up).
    pub(crate) fn take_oom_next(&self, id: &str) -> bool {
        lock(&self.state)
            .sandboxes
            .get_mut(id)
            .is_some_and(|s| std::mem::take(&mut s.oom_next))
    }
}

impl Sandbox {
    /// Ends the agent: its connections close.
    fn kill_agent(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.condition.send_modify(|c| c.dead = true);
        }
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}
