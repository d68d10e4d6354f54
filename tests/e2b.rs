//! E2B's API on the engine (`--e2b-listen`): the official SDKs from the registries, unmodified,
//! through every call the engine supports ([`sdk`]: PyPI `e2b` sync and async,
//! `e2b-code-interpreter`, and npm `e2b`), and what the door must refuse ([`doors`]: another tenant's
//! sandboxes, another sandbox's token, a killed sandbox, what has no meaning here, bad input).

use std::path::Path;

use crate::common::{kill_left_behind, spawn_engine_process_env};

mod doors;
mod envd;
mod network;
mod sdk;

/// An engine process serving E2B's API too, on a data dir of its own, with `keys_file` (lines
/// `KEY TENANT`) beside the test key. Killed, and its sandboxes with it, when dropped.
pub struct E2bEngine {
    child: std::process::Child,
    pub e2b: String,
    /// The engine's own API (`/v1`), which takes the same keys.
    pub api: String,
    data: tempfile::TempDir,
}

impl E2bEngine {
    pub async fn start(keys_file: &str) -> E2bEngine {
        E2bEngine::start_env(keys_file, &[]).await
    }

    /// The same, with more of the engine's environment variables set.
    pub async fn start_env(keys_file: &str, more: &[(&str, &str)]) -> E2bEngine {
        let data = tempfile::Builder::new()
            .prefix("smcp")
            .tempdir_in("/tmp")
            .unwrap();
        let keys = data.path().join("keys");
        std::fs::write(&keys, keys_file).unwrap();
        let port = sandbox_mcp_testkit::engine::free_port();
        let e2b = format!("127.0.0.1:{port}");
        let mut env = vec![
            ("SANDBOX_MCP_E2B_LISTEN", e2b.as_str()),
            ("SANDBOX_MCP_ENGINE_KEYS_FILE", keys.to_str().unwrap()),
        ];
        env.extend_from_slice(more);
        let (child, api) = spawn_engine_process_env(&data.path().join("data"), &env).await;
        E2bEngine {
            child,
            e2b: format!("http://{e2b}"),
            api,
            data,
        }
    }

    fn data_dir(&self) -> std::path::PathBuf {
        self.data.path().join("data")
    }
}

impl Drop for E2bEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_left_behind(&self.data_dir());
    }
}

/// Whether `/usr/bin/python3` imports `module`.
fn python_has(module: &str) -> bool {
    std::process::Command::new("/usr/bin/python3")
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The E2B SDKs for `/usr/bin/python3`, installed from PyPI when missing (as root, once).
fn sdks() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        crate::common::ensure_host_tools();
        if nix::unistd::geteuid().is_root()
            && !(python_has("e2b") && python_has("e2b_code_interpreter"))
        {
            eprintln!("tests: installing the E2B SDKs (e2b, e2b-code-interpreter) with pip");
            let _ = std::process::Command::new("/usr/bin/python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "--root-user-action=ignore",
                    "--break-system-packages",
                    "e2b>=2.20",
                    "e2b-code-interpreter>=2",
                ])
                .status();
        }
        if python_has("e2b") && python_has("e2b_code_interpreter") {
            Ok(())
        } else {
            Err(
                "the E2B Python SDKs are not installed (pip install e2b e2b-code-interpreter)"
                    .into(),
            )
        }
    })
    .clone()
}

/// Skips (or fails under SANDBOX_MCP_REQUIRE_SANDBOX) without the SDKs.
fn require_sdks() -> bool {
    match sdks() {
        Ok(()) => true,
        Err(why) if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() => {
            panic!("the E2B SDKs are required here: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

/// Where the npm `e2b` SDK is installed for the tests (the prefix the OAuth tests' SDK uses).
const NODE_PREFIX: &str = "/usr/local/lib/sandbox-mcp-tests";

/// The E2B JavaScript SDK, installed from npm into [`NODE_PREFIX`] when missing (as root, once).
fn js_sdk() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let installed = || {
            Path::new(NODE_PREFIX)
                .join("node_modules/e2b/package.json")
                .exists()
        };
        if nix::unistd::geteuid().is_root() && !installed() {
            eprintln!("tests: installing the E2B JavaScript SDK (e2b) with npm into {NODE_PREFIX}");
            let _ = std::process::Command::new("npm")
                .args([
                    "install",
                    "--no-fund",
                    "--no-audit",
                    "--prefix",
                    NODE_PREFIX,
                    "e2b@2",
                ])
                .stdout(std::process::Stdio::null())
                .status();
        }
        if installed() {
            Ok(())
        } else {
            Err(format!("the npm e2b SDK is not installed in {NODE_PREFIX}"))
        }
    })
    .clone()
}

/// Skips (or fails under SANDBOX_MCP_REQUIRE_SANDBOX) without the JavaScript SDK.
fn require_js_sdk() -> bool {
    match js_sdk() {
        Ok(()) => true,
        Err(why) if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() => {
            panic!("the E2B JavaScript SDK is required here: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

/// Runs fixture `script` (tests/fixtures/e2b/: Python, or Node.js for `.cjs`) with the SDK
/// pointed at `engine` by the three environment variables only; its output, after asserting it
/// ended with `ALL OK` and ran every check it names.
fn run_script(engine: &E2bEngine, script: &str, key: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/e2b")
        .join(script);
    let interpreter = if script.ends_with(".cjs") {
        "node"
    } else {
        "/usr/bin/python3"
    };
    let out = std::process::Command::new(interpreter)
        .arg(&path)
        .env_clear()
        .env("NODE_PATH", format!("{NODE_PREFIX}/node_modules"))
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("E2B_API_URL", &engine.e2b)
        .env("E2B_SANDBOX_URL", &engine.e2b)
        .env("E2B_API_KEY", key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.ends_with("ALL OK\n"),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Every check the script names ran (none skipped by an early exit that still printed).
    let source = std::fs::read_to_string(&path).unwrap();
    let named: std::collections::BTreeSet<&str> = source
        .split("check(")
        .skip(1)
        .filter_map(|rest| {
            let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            rest[1..].split(quote).next()
        })
        .collect();
    let passed: std::collections::BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .collect();
    assert_eq!(passed, named, "{script}:\n{stdout}");
    stdout
}
