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

/// A server whose tokens expire in [`TTL`], trusting and allowed to fetch from the test internet,
/// which serves a client metadata document; the document's URL.
async fn setup(net: &TestNet) -> (OAuthServer, String) {
    let s = OAuthServer::start_with(Setup {
        ttl: TTL,
        ca_file: Some(net.ca_pem()),
        allow_nets: vec![net.subnet.clone()],
        ..Setup::default()
    })
    .await;
    let url = format!("https://{}/static/sdk-client.json", net.net_ip);
    let doc = json!({"client_id": url, "client_name": "SDK via metadata document",
        "redirect_uris": [REDIRECT], "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"], "token_endpoint_auth_method": "none"});
    std::fs::write(
        net.dir.path().join("static/sdk-client.json"),
        doc.to_string(),
    )
    .unwrap();
    (s, url)
}

/// Runs a client twice: registering itself (with `registered` added to `env`), and with the
/// metadata document at `document` as its client_id. Each run must sign in once, use the tools
/// and refresh; every grant is `tenant`'s.
async fn both_ways(
    s: &OAuthServer,
    (program, script): (&str, &str),
    env: Vec<(&str, String)>,
    registered: Vec<(&str, String)>,
    document: &str,
    tenant: &str,
) -> Value {
    let mut first = env.clone();
    first.extend(registered);
    let out = client_run(program, script, &first).await;
    check_run(&out, &format!("{script}, registered"));
    assert!(
        out["client_id"]
            .as_str()
            .unwrap()
            .starts_with("smcp_client_"),
        "{out}"
    );
    let mut second = env;
    second.push(("REDIRECT_URL", REDIRECT.to_string()));
    second.push(("CIMD_URL", document.to_string()));
    let by_document = client_run(program, script, &second).await;
    check_run(&by_document, &format!("{script}, metadata document"));
    assert_eq!(by_document["client_id"], document);
    let grants = sandbox_mcp_oauth::Store::open(s.dir.path())
        .unwrap()
        .grants()
        .unwrap();
    assert!(
        grants.len() >= 2 && grants.iter().all(|g| g.tenant == tenant),
        "{grants:?}"
    );
    out
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
    let net = crate::require_testnet!();
    let (s, document) = setup(&net).await;
    let wait = (TTL + Duration::from_millis(1500)).as_millis().to_string();
    let env = vec![
        ("SERVER_URL", s.mcp()),
        ("ACCESS_KEY", s.key("alpha")),
        ("WAIT_EXPIRY_MS", wait),
    ];
    // Registered, it also creates a sandbox, runs a command in it and kills it.
    let mut registered = vec![("REDIRECT_URL", REDIRECT.to_string())];
    let sandboxes = sandbox_support().is_ok();
    if sandboxes {
        registered.push(("DO_SANDBOX", "1".into()));
    }
    let out = both_ways(
        &s,
        ("node", "ts_client.cjs"),
        env,
        registered,
        &document,
        "alpha",
    )
    .await;
    if sandboxes {
        assert!(
            out["exec"]
                .as_str()
                .unwrap()
                .contains("signed-in-through-oauth"),
            "{out}"
        );
    }
}

#[tokio::test]
async fn the_python_sdk_signs_in_in_a_real_browser_uses_the_tools_and_refreshes() {
    if let Err(reason) = clients() {
        return skip_or_fail("the Python SDK and a browser", &reason);
    }
    let net = crate::require_testnet!();
    let (s, document) = setup(&net).await;
    let wait = (TTL + Duration::from_millis(1500))
        .as_secs_f64()
        .to_string();
    let env = vec![
        ("SERVER_URL", s.mcp()),
        ("ACCESS_KEY", s.key("beta")),
        ("WAIT_EXPIRY_S", wait),
    ];
    // Registered, the page in Chromium (the script serves its own callback).
    let registered = vec![("BROWSER", "1".to_string())];
    both_ways(
        &s,
        ("/usr/bin/python3", "py_client.py"),
        env,
        registered,
        &document,
        "beta",
    )
    .await;
}
