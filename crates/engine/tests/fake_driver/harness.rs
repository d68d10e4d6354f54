//! An engine on the fake driver, in a temporary directory, and the calls the tests make of it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_engine::services::{CreateRequest, EXEC_OUTPUT_CAP, ExecResult};
use sandbox_mcp_engine::state::{Record, Status, Store};
use sandbox_mcp_model::config::EngineConfig;
use sandbox_mcp_protocol::{ExecSpec, ReadFile, WriteFile};
use sandbox_mcp_testkit::fake::FakeDriver;

/// Slack over a command's timeout the tests' engines give a hung agent (the default is 10 s).
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// What no outcome that depends on a deadline may take, however busy the machine: a hang
/// would take forever, a regression to the default deadlines a minute or more.
pub(crate) const PATIENCE: Duration = Duration::from_secs(45);

/// An engine on the fake driver, with the directory that holds both.
pub(crate) struct Engine {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) fake: FakeDriver,
    pub(crate) manager: Arc<Manager>,
}

impl Engine {
    pub(crate) async fn open() -> Self {
        Self::open_with(|_| {}).await
    }

    /// [`Self::open`], with `change` made to the test's settings.
    pub(crate) async fn open_with(change: impl FnOnce(&mut EngineConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeDriver::new(&dir.path().join("fake")).unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let mut config = config(dir.path());
        change(&mut config);
        let manager = Manager::open(config, fake.driver()).await.unwrap();
        Self { dir, fake, manager }
    }

    /// A new engine on this one's data dir and sandboxes, as after a restart of the engine
    /// (not of the host: the fake's agents live on). This one is dropped as a crash would
    /// leave it, without its shutdown: call [`Manager::shutdown`] first for a clean stop.
    pub(crate) async fn reopen(self) -> Self {
        self.reopen_with(|_| {}).await
    }

    /// [`Self::reopen`], with `change` made to the test's settings.
    pub(crate) async fn reopen_with(self, change: impl FnOnce(&mut EngineConfig)) -> Self {
        let Self { dir, fake, manager } = self;
        drop(manager);
        let mut config = config(dir.path());
        change(&mut config);
        let manager = Manager::open(config, fake.driver()).await.unwrap();
        Self { dir, fake, manager }
    }

    pub(crate) async fn create(&self) -> String {
        self.create_with(CreateRequest::default()).await
    }

    pub(crate) async fn create_with(&self, req: CreateRequest) -> String {
        let view = self.manager.pools.create(req).await.unwrap();
        assert_eq!(view.record.status, Status::Running);
        view.record.id
    }

    /// Runs `command` with a 10 s timeout.
    pub(crate) async fn exec(&self, id: &str, command: &str) -> Result<ExecResult, EngineError> {
        self.exec_for(id, command, 10_000).await
    }

    pub(crate) async fn exec_for(
        &self,
        id: &str,
        command: &str,
        timeout_ms: u64,
    ) -> Result<ExecResult, EngineError> {
        let spec = ExecSpec {
            command: command.into(),
            cwd: None,
            env: Vec::new(),
            timeout_ms,
            max_output_bytes: EXEC_OUTPUT_CAP,
            stream: false,
        };
        self.manager.agent.exec(id, None, spec).await
    }

    /// Runs `command`, which must succeed; its stdout.
    pub(crate) async fn run(&self, id: &str, command: &str) -> String {
        let result = self.exec(id, command).await.unwrap();
        let outcome = result.outcome;
        assert_eq!(outcome.exit_code, Some(0), "{command}: {outcome:?}");
        outcome.stdout
    }

    pub(crate) async fn write(&self, id: &str, path: &str, data: &[u8]) {
        let write = WriteFile {
            path: path.into(),
            data_b64: B64.encode(data),
            owner: None,
            metadata: Default::default(),
        };
        let deadline = Duration::from_secs(10);
        self.manager
            .agent
            .call(id, None, write, deadline)
            .await
            .unwrap();
    }

    pub(crate) async fn read(&self, id: &str, path: &str) -> Result<Vec<u8>, EngineError> {
        let read = ReadFile {
            path: path.into(),
            max_bytes: 1 << 20,
        };
        let data = self
            .manager
            .agent
            .call(id, None, read, Duration::from_secs(10))
            .await?;
        Ok(B64.decode(data.data_b64).unwrap())
    }

    pub(crate) async fn status(&self, id: &str) -> Status {
        self.manager
            .lifecycle
            .get(id, None, false)
            .await
            .unwrap()
            .record
            .status
    }

    /// The ids the engine lists.
    pub(crate) fn listed(&self) -> BTreeSet<String> {
        self.manager
            .list(None, &[], None)
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    /// The records in the engine's SQLite database, by id.
    pub(crate) fn stored(&self) -> Vec<Record> {
        Store::open(&config(self.dir.path()).state_db())
            .unwrap()
            .all()
            .unwrap()
    }

    pub(crate) fn stored_status(&self, id: &str) -> Option<Status> {
        self.stored()
            .into_iter()
            .find(|r| r.id == id)
            .map(|r| r.status)
    }

    /// The uid slot the engine gave sandbox `id`.
    pub(crate) fn slot_of(&self, id: &str) -> u32 {
        self.stored()
            .into_iter()
            .find(|r| r.id == id)
            .unwrap()
            .uid_slot
    }

    /// Asserts that, of every sandbox, exactly `ids` are left — listed, stored, holding a slot,
    /// with files — and that only `running` of them have an agent.
    pub(crate) fn assert_only(&self, ids: &[&str], running: &[&str]) {
        let want: BTreeSet<String> = ids.iter().map(|s| s.to_string()).collect();
        assert_eq!(self.listed(), want, "listed");
        let stored: BTreeSet<String> = self.stored().into_iter().map(|r| r.id).collect();
        assert_eq!(stored, want, "stored");
        let dirs: BTreeSet<String> = self.fake.sandbox_dirs().into_iter().collect();
        assert_eq!(dirs, want, "directories");
        let mut slots: Vec<u32> = ids.iter().map(|id| self.slot_of(id)).collect();
        slots.sort();
        assert_eq!(self.fake.slots(), slots, "slots");
        let mut running: Vec<String> = running.iter().map(|s| s.to_string()).collect();
        running.sort();
        assert_eq!(self.fake.running(), running, "agents");
    }
}

/// The engine's settings for a test: the data dir under `dir`, no idle pause, short grace.
pub(crate) fn config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir.join("data"));
    config.idle_pause = None;
    config.exec_grace = GRACE;
    config.preview.listen = None;
    config
}

/// Waits for `ready`, checking every 10 ms, for at most [`PATIENCE`].
pub(crate) async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < PATIENCE, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `f`, which must end within [`PATIENCE`]; its output and how long it took.
pub(crate) async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(PATIENCE, f)
        .await
        .expect("still waiting after the test's patience ran out: a hang");
    (out, started.elapsed())
}

/// The text of an error, for messages.
pub(crate) fn text(e: &EngineError) -> String {
    e.to_string()
}

/// Where a sandbox's file `path` lies in the fake's directories.
pub(crate) fn host_path(fake: &FakeDriver, id: &str, path: &str) -> PathBuf {
    fake.files_of(id).join(path.trim_start_matches('/'))
}
