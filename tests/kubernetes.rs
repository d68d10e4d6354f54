//! The kubernetes driver against a real cluster (Kubernetes 1.20 on this machine, named by
//! `SANDBOX_MCP_TEST_K8S_RIG`): engine processes on `--driver kubernetes`, each test in a
//! namespace of its own, reached through a real MCP client. Without a cluster these tests skip
//! saying so; with `SANDBOX_MCP_REQUIRE_SANDBOX` set (CI) they fail instead.
//!
//! This file holds the rig and the engine fixture; the tests are by theme: [`starts`] (the
//! static agent build, and agents that cannot start), [`tools`] (the tools on pods the cluster
//! schedules and limits), [`replicas`] (replicas, pods deleted behind the engine's back, expiry
//! with no engine), [`pools`] (warm pools of pods across replicas and restarts) and [`rbac`]
//! (the documented RBAC is enough).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_testkit::kubernetes::{Namespace, Rig};

use crate::common::{BIN, KEY, McpClient, mcp_for, spawn_engine_logged};

/// The rig, started once per test process (its first start builds the static agent).
fn rig() -> Result<&'static Rig, String> {
    static RIG: OnceLock<Result<Rig, String>> = OnceLock::new();
    RIG.get_or_init(|| {
        // The base image is made of this machine's busybox and python3.
        crate::common::ensure_host_tools();
        let target = Path::new(BIN)
            .parent()
            .and_then(Path::parent)
            .ok_or("no target directory")?;
        Rig::start(Path::new(env!("CARGO_MANIFEST_DIR")), target, false)
    })
    .as_ref()
    .map_err(Clone::clone)
}

macro_rules! require_cluster {
    () => {
        match rig() {
            Ok(rig) => rig,
            Err(reason) => {
                if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                    panic!("a Kubernetes cluster is required here but unavailable: {reason}");
                }
                eprintln!("SKIPPED {}: {reason}", module_path!());
                return;
            }
        }
    };
}

/// An engine process on the kubernetes driver; killed (SIGKILL) when dropped.
struct KubeEngine {
    child: Child,
    url: String,
    log: PathBuf,
    /// Its data dir, whose sandbox store goes with it.
    data: crate::common::TempData,
}

impl KubeEngine {
    async fn start(rig: &Rig, ns: &Namespace, extra: &[(&str, &str)]) -> KubeEngine {
        let data = crate::common::TempData::new();
        let log = data.dir.path().join("engine.log");
        let env = rig.engine_env(&ns.name);
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&**k, &**v)).collect();
        env.extend_from_slice(extra);
        let (child, url) = spawn_engine_logged(
            &data.data(),
            &env,
            std::fs::File::create(&log).unwrap().into(),
        )
        .await;
        KubeEngine {
            child,
            url,
            log,
            data,
        }
    }

    /// Stops this engine as a rolling restart does (`SIGTERM`, waiting for it to end) and
    /// starts another on the same data dir, with `extra` in its environment.
    async fn restart(&mut self, rig: &Rig, ns: &Namespace, extra: &[(&str, &str)]) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.child.wait().unwrap();
        let env = rig.engine_env(&ns.name);
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&**k, &**v)).collect();
        env.extend_from_slice(extra);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        (self.child, self.url) = spawn_engine_logged(&self.data.data(), &env, file.into()).await;
    }

    async fn mcp(&self) -> McpClient {
        mcp_for(
            Backend::remote(&self.url, Some(ApiKey::new(KEY))).unwrap(),
            ServerSettings::default(),
            "all",
        )
        .await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KubeEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small sandbox, for creates through the HTTP API (the MCP tool takes the template's shape).
fn small(memory_mb: u64) -> Value {
    json!({"shape": {"vcpus": 0.5, "memory_mb": memory_mb, "disk_mb": 256}})
}

/// An engine API call that may be cut off: the answer of a success, `None` for no answer or an
/// error (a request the engine did not acknowledge).
async fn try_api(base: &str, method: &str, path: &str, body: Value) -> Option<Value> {
    let http = sandbox_mcp_api::http_builder().no_proxy().build().ok()?;
    let r = http
        .request(method.parse().ok()?, format!("{base}{path}"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// A Kubernetes quantity (`1Gi`, `512Mi`; `1`, `500m`) in MiB or in millicores.
fn quantity(q: &Value) -> u64 {
    let q = q.as_str().unwrap_or_else(|| panic!("not a quantity: {q}"));
    let (n, scale) = [("Gi", 1024), ("Mi", 1), ("m", 1)]
        .iter()
        .find_map(|(suffix, scale)| Some((q.strip_suffix(suffix)?, *scale)))
        .unwrap_or((q, 1000));
    n.parse::<u64>().unwrap() * scale
}

/// The pod of sandbox `id` as the API server has it, or `None` once it is gone.
fn pod(rig: &Rig, ns: &Namespace, id: &str) -> Option<Value> {
    let name = id.replacen('_', "-", 1);
    let out = rig.kubectl(&["get", "pod", "-n", &ns.name, &name, "-o", "json"]);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("NotFound"), "kubectl get pod: {stderr}");
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

async fn eventually(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// After the macro, which they use.
mod pools;
mod rbac;
mod replicas;
mod starts;
mod tools;
mod volumes;
