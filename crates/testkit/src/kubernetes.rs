//! A real Kubernetes cluster for the kubernetes driver's tests and benchmarks: the k8s-local rig
//! (Kubernetes 1.20 built from Debian's sources, run on this machine), named by
//! `SANDBOX_MCP_TEST_K8S_RIG`. No registry is reachable, so the images the pods run are built
//! here and imported into the rig's containerd:
//!   - the agent image: a static sandbox-mcp at `/sandbox-mcp` and nothing else;
//!   - the base image: busybox and python3, with no sandbox-mcp of its own (the agent reaches
//!     the pod from the agent image, as on any cluster).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Image holding the static binary (the `--agent-image` of the tests).
pub const AGENT_IMAGE: &str = "localhost/sandbox-mcp-agent:test";
/// Image of the `base` template in the tests.
pub const BASE_IMAGE: &str = "localhost/sandbox-mcp-base:test";
/// The pod sandbox ("pause") image the rig's kubelet needs for every pod.
const PAUSE_IMAGE: &str = "localhost/pause:1";

/// A running cluster with the test images in it.
#[derive(Debug, Clone)]
pub struct Rig {
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    /// The static binary in the agent image, as `cargo build-static` made it.
    pub agent: PathBuf,
    /// The rig's directory (its `image.sh`).
    dir: PathBuf,
}

impl Rig {
    /// Starts the rig named by `SANDBOX_MCP_TEST_K8S_RIG` (or reuses it), builds the static
    /// binary into `target_dir/kube-agent` (`release`: optimized, for the benchmarks) and imports
    /// both images. `Err`: why there is no cluster, for the skip (or, where clusters are
    /// required, the failure) message.
    pub fn start(manifest_dir: &Path, target_dir: &Path, release: bool) -> Result<Rig, String> {
        Rig::start_as(manifest_dir, target_dir, release, false)
    }

    /// [`Rig::start`] for the benchmarks: an optimized agent, and the kubelet given the API rate
    /// limits a current kubelet has by default (50 and 100 requests a second; Kubernetes 1.20's
    /// 5 and 10 are what fifty pods started at once wait for, whoever creates them) by
    /// `tests/fixtures/kubernetes/kubelet-rates.sh`. That restarts the kubelet, whose image
    /// garbage collection at start may take the test images: they are imported after it.
    pub fn start_for_benchmarks(manifest_dir: &Path, target_dir: &Path) -> Result<Rig, String> {
        Rig::start_as(manifest_dir, target_dir, true, true)
    }

    fn start_as(
        manifest_dir: &Path,
        target_dir: &Path,
        release: bool,
        current_kubelet_rates: bool,
    ) -> Result<Rig, String> {
        let dir = std::env::var_os("SANDBOX_MCP_TEST_K8S_RIG")
            .map(PathBuf::from)
            .ok_or(
                "needs a Kubernetes cluster: set SANDBOX_MCP_TEST_K8S_RIG to the k8s-local rig's \
                 directory (README, Tests)",
            )?;
        let agent = static_build(manifest_dir, target_dir, release)?;
        let start = || -> Result<Rig, String> {
            let rig = up(&dir, &agent)?;
            if current_kubelet_rates {
                rig.current_kubelet_rates(manifest_dir)?;
            }
            Ok(rig)
        };
        let mut rig = start()?;
        // The rig's kubelet garbage-collects unused images when the disk fills up, the pause
        // image included, after which no pod starts: a fresh start builds it again.
        if !rig.has_image(PAUSE_IMAGE)? {
            eprintln!("k8s rig: {PAUSE_IMAGE} is gone (image GC on a full disk?); restarting");
            let _ = Command::new(dir.join("down.sh")).status();
            rig = start()?;
        }
        let images = Path::new(manifest_dir).join("tests/fixtures/kubernetes/images.sh");
        let status = Command::new("bash")
            .arg(&images)
            .arg(&dir)
            .arg(&agent)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {}: {e}", images.display()))?;
        if !status.success() {
            return Err(format!("building the test images failed ({status})"));
        }
        Ok(rig)
    }

    /// Imports the contents of `root` as the local image `name`, run as `entrypoint`.
    pub fn image(&self, name: &str, root: &Path, entrypoint: &str) -> Result<(), String> {
        let mut image = Command::new(self.dir.join("image.sh"));
        image.arg(name).arg(root).arg(entrypoint);
        run(image, &format!("image.sh {name}"))
    }

    /// Runs `tests/fixtures/kubernetes/kubelet-rates.sh` (see [`Rig::start_for_benchmarks`]).
    fn current_kubelet_rates(&self, manifest_dir: &Path) -> Result<(), String> {
        let mut rates = Command::new("bash");
        rates.arg(manifest_dir.join("tests/fixtures/kubernetes/kubelet-rates.sh"));
        run(rates, "setting the kubelet's API rates (kubelet-rates.sh)")
    }

    /// Runs kubectl against the rig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"))
    }

    /// Runs kubectl and returns its stdout; panics with its stderr when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether the node has `image` (its status lists the images it holds).
    fn has_image(&self, image: &str) -> Result<bool, String> {
        let out = self.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[*].status.images[*].names}",
        ]);
        if !out.status.success() {
            return Err(format!(
                "the cluster does not answer: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).contains(&format!("\"{image}\"")))
    }

    /// The engine's settings for the kubernetes driver in `namespace`, as environment variables.
    /// CPU is overcommitted so that the tests' pods fit a small node's cores.
    pub fn engine_env(&self, namespace: &str) -> Vec<(String, String)> {
        [
            ("SANDBOX_MCP_DRIVER", "kubernetes"),
            ("SANDBOX_MCP_K8S_NAMESPACE", namespace),
            ("SANDBOX_MCP_AGENT_IMAGE", AGENT_IMAGE),
            ("SANDBOX_MCP_DEFAULT_IMAGE", BASE_IMAGE),
            ("SANDBOX_MCP_IMAGE_PULL_POLICY", "Never"),
            ("SANDBOX_MCP_CPU_OVERCOMMIT", "50"),
            ("KUBECONFIG", &self.kubeconfig.to_string_lossy()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// Runs `command` with no stdin; `Err` says `what` failed, how, and its stderr.
fn run(mut command: Command, what: &str) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// `up.sh` is idempotent: it reuses a running rig, and prints `export KUBECONFIG=…`.
fn up(dir: &Path, agent: &Path) -> Result<Rig, String> {
    let out = Command::new(dir.join("up.sh"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start the k8s rig in {}: {e}", dir.display()))?;
    if !out.status.success() {
        return Err(format!("the k8s rig did not start ({})", out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let kubeconfig = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("export KUBECONFIG="))
        .map(PathBuf::from)
        .ok_or_else(|| format!("up.sh printed no KUBECONFIG: {stdout}"))?;
    // The rig keeps its kubectl beside its kubeconfig; else the one on PATH.
    let kubectl = kubeconfig
        .parent()
        .map(|home| home.join("bin/kubectl"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    Ok(Rig {
        kubeconfig,
        kubectl,
        agent: agent.to_path_buf(),
        dir: dir.to_path_buf(),
    })
}

/// The agent image needs a binary that runs in any image: a static one, built the one documented
/// way, `cargo build-static` (an alias in .cargo/config.toml, where its flags and their reasons
/// are), into `target_dir/kube-agent`. RUSTFLAGS would replace the alias' flags, so it is not
/// passed on.
pub fn static_build(
    manifest_dir: &Path,
    target_dir: &Path,
    release: bool,
) -> Result<PathBuf, String> {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build-static", "--message-format=json-render-diagnostics"])
        .args(release.then_some("--release"))
        .current_dir(manifest_dir)
        .env("CARGO_TARGET_DIR", target_dir.join("kube-agent"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo build-static: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo build-static failed ({})", out.status));
    }
    // Where cargo put it: the executable its messages name.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo build-static named no executable".to_string())
}

/// A namespace of its own for one test (or benchmark), deleted when dropped (its pods with it).
pub struct Namespace {
    pub name: String,
    rig: Rig,
}

impl Namespace {
    pub fn new(rig: &Rig) -> Namespace {
        static N: AtomicU32 = AtomicU32::new(0);
        // Unique across runs too: an earlier run's namespace may still be terminating.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() % 1_000_000_000);
        let name = format!(
            "smcp-{now}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        rig.kubectl_ok(&["create", "namespace", &name]);
        Namespace {
            name,
            rig: rig.clone(),
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self
            .rig
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}
