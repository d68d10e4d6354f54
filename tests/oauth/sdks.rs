//! Clients that only speak OAuth: the official TypeScript SDK (npm `@modelcontextprotocol/sdk`)
//! and Python SDK (PyPI `mcp`), unmodified, each through discovery from a 401, registration
//! (dynamic, and by a client metadata document served over HTTPS from the test internet), sign-in
//! with PKCE, the token, the tools, and a refresh when the access token expires. The Python run
//! drives the sign-in page in a real browser (Debian's Chromium through Selenium).
//!
//! The clients are installed by the test when missing (as root: npm into
//! [`NODE_PREFIX`], pip, apt); without them the tests skip naming what is missing, and fail under
//! `SANDBOX_MCP_REQUIRE_SANDBOX`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use super::{OAuthServer, REDIRECT, Setup};
use crate::common::sandbox_support;
use crate::testnet::TestNet;

/// Where the TypeScript SDK is installed for the tests (a prefix of its own, so nothing global
/// changes).
const NODE_PREFIX: &str = "/usr/local/lib/sandbox-mcp-tests";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/oauth");
/// Access tokens of the SDK runs live this long, so each run sees one expire and refreshes.
const TTL: Duration = Duration::from_secs(3);

fn skip_or_fail(what: &str, reason: &str) {
    if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
        panic!("{what} is required here: {reason}");
    }
    eprintln!("SKIPPED {what}: {reason}");
}

fn run(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn python_has(module: &str) -> bool {
    run("/usr/bin/python3", &["-c", &format!("import {module}")])
}

/// Installs what is missing (once per process); says what still is.
fn clients() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        crate::common::ensure_host_tools();
        let sdk = format!("{NODE_PREFIX}/node_modules/@modelcontextprotocol/sdk/package.json");
        let root = nix::unistd::geteuid().is_root();
        if root && !Path::new(&sdk).exists() {
            eprintln!("tests: installing @modelcontextprotocol/sdk with npm into {NODE_PREFIX}");
            run(
                "npm",
                &[
                    "install",
                    "--no-fund",
                    "--no-audit",
                    "--prefix",
                    NODE_PREFIX,
                    "@modelcontextprotocol/sdk@1",
                ],
            );
        }
        let pip = |pkg: &str| {
            run(
                "/usr/bin/python3",
                &[
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "--root-user-action=ignore",
                    "--break-system-packages",
                    pkg,
                ],
            )
        };
        if root && !python_has("mcp.client.auth") {
            eprintln!("tests: installing the Python MCP SDK with pip");
            pip("mcp>=1.23");
        }
        if root && !python_has("selenium") {
            eprintln!("tests: installing selenium with pip");
            pip("selenium>=4.20");
        }
        if root
            && !(Path::new("/usr/bin/chromium").exists()
                && Path::new("/usr/bin/chromedriver").exists())
        {
            eprintln!("tests: installing chromium and chromium-driver with apt-get");
            let install = [
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "chromium",
                "chromium-driver",
            ];
            let _ = run("apt-get", &install)
                || (run("apt-get", &["update", "-qq"]) && run("apt-get", &install));
        }
        let mut missing = vec![];
        if !Path::new(&sdk).exists() {
            missing.push("npm @modelcontextprotocol/sdk");
        }
        if !python_has("mcp.client.auth") {
            missing.push("PyPI mcp");
        }
        if !python_has("selenium") {
            missing.push("PyPI selenium");
        }
        if !Path::new("/usr/bin/chromedriver").exists() {
            missing.push("Debian chromium-driver");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("not installed: {}", missing.join(", ")))
        }
    })
    .clone()
}

/// Runs a client script with `env`; its one JSON line.
async fn client_run(program: &str, script: &str, env: &[(&str, String)]) -> Value {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg(format!("{FIXTURES}/{script}"))
        .env("NODE_PATH", format!("{NODE_PREFIX}/node_modules"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{script} took over 3 minutes"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// A server whose tokens expire in [`TTL`], and the test internet serving a client metadata
/// document (when this machine can make one).
async fn setup() -> (OAuthServer, Option<(TestNet, String)>) {
    let net = match TestNet::start() {
        Ok(n) => Some(n),
        Err(reason) => {
            skip_or_fail("client metadata documents (the test internet)", &reason);
            None
        }
    };
    let s = OAuthServer::start_with(Setup {
        ttl: TTL,
        ca_file: net.as_ref().map(|n| n.ca_pem()),
        allow_nets: net.iter().map(|n| n.subnet.clone()).collect(),
        ..Setup::default()
    })
    .await;
    let net = net.map(|n| {
        let url = format!("https://{}/static/sdk-client.json", n.net_ip);
        let doc = json!({"client_id": url, "client_name": "SDK via metadata document",
            "redirect_uris": [REDIRECT], "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"], "token_endpoint_auth_method": "none"});
        std::fs::write(n.dir.path().join("static/sdk-client.json"), doc.to_string()).unwrap();
        (n, url)
    });
    (s, net)
}

fn check_run(out: &Value, how: &str) {
    let tools = out["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "sandbox_exec"), "{how}: {out}");
    assert_eq!(out["listed"], true, "{how}: {out}");
    assert_eq!(out["after_refresh"], true, "{how}: {out}");
    assert_eq!(
        out["refreshed"], true,
        "{how}: the expired token was refreshed: {out}"
    );
    assert_eq!(
        out["sign_ins"], 1,
        "{how}: one sign-in, then refreshes: {out}"
    );
}

#[tokio::test]
async fn the_typescript_sdk_signs_in_uses_the_tools_and_refreshes() {
    if let Err(reason) = clients() {
        return skip_or_fail("the TypeScript SDK", &reason);
    }
    let (s, net) = setup().await;
    let key = s.key("alpha");
    let wait = (TTL + Duration::from_millis(1500)).as_millis().to_string();
    let mut env = vec![
        ("SERVER_URL", s.mcp()),
        ("ACCESS_KEY", key.clone()),
        ("REDIRECT_URL", REDIRECT.to_string()),
        ("WAIT_EXPIRY_MS", wait.clone()),
    ];
    if sandbox_support().is_ok() {
        env.push(("DO_SANDBOX", "1".into()));
    }
    // Dynamic client registration.
    let out = client_run("node", "ts_client.cjs", &env).await;
    check_run(&out, "TypeScript, registered");
    assert!(
        out["client_id"]
            .as_str()
            .unwrap()
            .starts_with("smcp_client_"),
        "{out}"
    );
    if sandbox_support().is_ok() {
        assert!(
            out["exec"]
                .as_str()
                .unwrap()
                .contains("signed-in-through-oauth"),
            "{out}"
        );
    }
    // A client metadata document instead.
    if let Some((_net, url)) = &net {
        let mut env = env.clone();
        env.retain(|(k, _)| *k != "DO_SANDBOX");
        env.push(("CIMD_URL", url.clone()));
        let out = client_run("node", "ts_client.cjs", &env).await;
        check_run(&out, "TypeScript, metadata document");
        assert_eq!(out["client_id"], url.as_str());
    }
    // What the runs left: grants for tenant alpha and the clients that made them.
    let grants = sandbox_mcp_oauth::Store::open(s.dir.path())
        .unwrap()
        .grants()
        .unwrap();
    assert!(grants.iter().all(|g| g.tenant == "alpha"), "{grants:?}");
}

#[tokio::test]
async fn the_python_sdk_signs_in_in_a_real_browser_uses_the_tools_and_refreshes() {
    if let Err(reason) = clients() {
        return skip_or_fail("the Python SDK and a browser", &reason);
    }
    let (s, net) = setup().await;
    let key = s.key("beta");
    let wait = (TTL + Duration::from_millis(1500))
        .as_secs_f64()
        .to_string();
    let env = vec![
        ("SERVER_URL", s.mcp()),
        ("ACCESS_KEY", key.clone()),
        ("WAIT_EXPIRY_S", wait.clone()),
    ];
    // Dynamic registration, the page in Chromium.
    let mut browser = env.clone();
    browser.push(("BROWSER", "1".into()));
    let out = client_run("/usr/bin/python3", "py_client.py", &browser).await;
    check_run(&out, "Python in a browser, registered");
    assert!(
        out["client_id"]
            .as_str()
            .unwrap()
            .starts_with("smcp_client_"),
        "{out}"
    );
    // A client metadata document.
    if let Some((_net, url)) = &net {
        let mut env = env.clone();
        env.push(("REDIRECT_URL", REDIRECT.to_string()));
        env.push(("CIMD_URL", url.clone()));
        let out = client_run("/usr/bin/python3", "py_client.py", &env).await;
        check_run(&out, "Python, metadata document");
        assert_eq!(out["client_id"], url.as_str());
    }
    let grants = sandbox_mcp_oauth::Store::open(s.dir.path())
        .unwrap()
        .grants()
        .unwrap();
    assert!(
        !grants.is_empty() && grants.iter().all(|g| g.tenant == "beta"),
        "{grants:?}"
    );
}
