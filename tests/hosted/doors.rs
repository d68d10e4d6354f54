//! The five reference servers through each door: `sandbox-mcp run` (the binary, on stdio, with
//! its own embedded engine), `/servers/NAME/mcp`, and mounted into our own endpoint.

use std::process::Stdio;

use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;

use super::*;
use crate::common::{BIN, REFERENCE_SERVERS, exit_within, sandbox_records};

/// `sandbox-mcp run [flags] -- COMMAND` on a data dir of its own, as an MCP client starts it.
fn run_command(data: &std::path::Path, net: &TestNet, name: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env("SANDBOX_MCP_DATA_DIR", data)
        .env_remove("SANDBOX_MCP_URL")
        .env("HOSTED_CANARY", "the-host-environment-must-not-leak")
        .args(["run", "--dns-upstream", &net.dns.to_string()])
        .args(["--egress-allow", &format!("{}/32", net.net_ip)]);
    if name == "fetch" {
        cmd.args(["--allow-out", "api.example.test"]);
    }
    cmd.arg("--").args(reference_command(name));
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn every_reference_server_works_through_run() {
    crate::require_reference_servers!();
    let net = crate::require_testnet!();
    let data = tempfile::tempdir().unwrap();
    for (name, _, _) in REFERENCE_SERVERS {
        // Its stderr goes to a file, so that a run that fails says why.
        let log = data.path().join(format!("{name}.stderr"));
        let (transport, _) = TokioChildProcess::builder(run_command(data.path(), &net, name))
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        let client = ().serve(transport).await.unwrap_or_else(|e| {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("run {name}: {e}; its stderr:\n{said}")
        });
        exercise(client.peer(), name, "").await;
        if name == "everything" {
            // The host's environment stays on the host.
            let r = tool(client.peer(), "get-env", json!({})).await;
            assert!(
                !said(&r).contains("the-host-environment-must-not-leak"),
                "{}",
                said(&r)
            );
            assert!(said(&r).contains("PATH"), "{}", said(&r));
        }
        client.cancel().await.unwrap();
    }
    // Every run ended its sandbox (and its engine, which no other process shares).
    let left = sandbox_records(data.path());
    assert!(left.is_empty(), "a run left its sandbox behind: {left:?}");
}

/// `run`'s other flags, with values that work: `--env` reaches the server, `--secret` as a stand-in
/// (never the value), `--shape` sizes its sandbox, and `--name` is what `servers log` finds it by.
#[tokio::test(flavor = "multi_thread")]
async fn runs_flags_reach_the_server_and_its_sandbox() {
    crate::require_reference_servers!();
    let data = tempfile::tempdir().unwrap();
    let on_data = |args: &[&str]| {
        let mut c = std::process::Command::new(BIN);
        c.args(args)
            .env("SANDBOX_MCP_DATA_DIR", data.path())
            .env_remove("SANDBOX_MCP_URL");
        c
    };
    let mut set = on_data(&["secrets", "set", "tok", "--host", "api.example.test"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut set.stdin.take().unwrap(), b"the-run-secret-value\n").unwrap();
    let out = set.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env("SANDBOX_MCP_DATA_DIR", data.path())
        .env_remove("SANDBOX_MCP_URL")
        .args([
            "run",
            "--env",
            "RUN_ENV=set-by-flag",
            "--secret",
            "API_TOKEN=tok",
        ])
        .args([
            "--shape",
            "memory_mb=512,vcpus=1",
            "--cwd",
            "/tmp",
            "--name",
            "flagged",
        ])
        .arg("--")
        .args(reference_command("everything"));
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.unwrap();
    let env = said(&tool(client.peer(), "get-env", json!({})).await);
    assert!(env.contains("set-by-flag"), "{env}");
    assert!(env.contains("sbxsecret_"), "{env}");
    assert!(!env.contains("the-run-secret-value"), "{env}");
    let db = rusqlite::Connection::open(data.path().join("state.db")).unwrap();
    let (memory, vcpus): (i64, f64) = db
        .query_row("SELECT memory_mb, vcpus FROM sandboxes", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((memory, vcpus), (512, 1.0));
    let log = on_data(&["servers", "log", "flagged"]).output().unwrap();
    let shown = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.status.success(),
        "{}",
        String::from_utf8_lossy(&log.stderr)
    );
    // Its sandbox, its memory, the server's stderr.
    assert!(
        shown.contains("Running")
            && shown.contains("memory")
            && shown.contains("mcp-server-everything"),
        "{shown}"
    );
    client.cancel().await.unwrap();
    assert!(sandbox_records(data.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_reference_server_works_over_streamable_http() {
    crate::require_reference_servers!();
    let net = crate::require_testnet!();
    let hosted = Hosted::start(Some(&net)).await;
    let token = hosted.token("alice");
    for (name, _, _) in REFERENCE_SERVERS {
        hosted
            .register_ok(None, name, reference_registration(name))
            .await;
        let client = hosted.connect(name, &token).await;
        exercise(client.peer(), name, "").await;
        assert_eq!(
            hosted.sandboxes_of(name).len(),
            1,
            "{name}: one session, one sandbox"
        );
        client.cancel().await.unwrap();
        hosted
            .wait_until(&format!("{name}'s session sandbox is gone"), || {
                hosted.sandboxes_of(name).is_empty()
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_reference_server_works_mounted_into_the_main_endpoint() {
    crate::require_reference_servers!();
    let net = crate::require_testnet!();
    let names: Vec<String> = REFERENCE_SERVERS
        .iter()
        .map(|(n, _, _)| n.to_string())
        .collect();
    let hosted = Hosted::start_with(Some(&net), |o| o.mount_servers = names.clone(), "core").await;
    for name in &names {
        hosted
            .register_ok(None, name, reference_registration(name))
            .await;
    }
    let token = hosted.token("alice");
    let client = hosted.client_at("/mcp", &token, ()).await;
    let tools = tool_names(client.peer()).await;
    // Our own tools and every mounted server's, namespaced.
    assert!(tools.contains(&"sandbox_exec".to_string()), "{tools:?}");
    for name in &names {
        assert!(
            tools.iter().any(|t| t.starts_with(&format!("{name}__"))),
            "{name}: {tools:?}"
        );
        exercise(client.peer(), name, &format!("{name}__")).await;
    }
    // One sandbox per mounted server for this session, ended with it.
    for name in &names {
        assert_eq!(hosted.sandboxes_of(name).len(), 1, "{name}");
    }
    client.cancel().await.unwrap();
    for name in &names {
        hosted
            .wait_until(&format!("the session's {name} sandbox is gone"), || {
                hosted.sandboxes_of(name).is_empty()
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_speaks_streamable_http_itself_is_proxied_per_session() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let mut body = reference_registration("everything");
    body["command"] = json!([reference_command("everything")[0], "streamableHttp"]);
    body["env_vars"] = json!({"PORT": "3001"});
    body["http_port"] = json!(3001);
    hosted.register_ok(None, "everything-http", body).await;
    let token = hosted.token("alice");
    let a = hosted.connect("everything-http", &token).await;
    let b = hosted.connect("everything-http", &token).await;
    exercise(a.peer(), "everything", "").await;
    exercise(b.peer(), "everything", "").await;
    // Each session its own sandbox (and server, on the same port in each).
    assert_eq!(hosted.sandboxes_of("everything-http").len(), 2);
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    hosted
        .wait_until("the HTTP server's sandboxes are gone", || {
            hosted.sandboxes_of("everything-http").is_empty()
        })
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_run_and_its_sandbox() {
    crate::require_reference_servers!();
    let data = tempfile::tempdir().unwrap();
    let (mut child, _stdin, _stdout) = initialized_run(data.path(), Stdio::null());
    let sandboxes = || {
        std::fs::read_dir(data.path().join("sandboxes"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("sbx_"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(
        sandboxes(),
        1,
        "the server runs in a sandbox of the run's engine"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = exit_within(&mut child, 60, "run on SIGTERM");
    assert!(status.success(), "{status:?}");
    let left = sandbox_records(data.path());
    assert!(left.is_empty(), "run left its sandbox behind: {left:?}");
}

/// Two `run`s on one data dir share the engine the first one serves, and the second's server
/// speaks through it. When the first ends, so does that engine and the second's stream: the
/// second ends too, saying why and what to do, and kills its sandbox (taking the engine over to
/// do it) rather than leave it paused with nothing to end it.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_engine_ends_with_another_run_says_so_and_leaves_no_sandbox() {
    crate::require_reference_servers!();
    let data = tempfile::tempdir().unwrap();
    let log = |name: &str| Stdio::from(std::fs::File::create(data.path().join(name)).unwrap());
    // The first answers once its engine is up and serving it; the second attaches to that.
    let (mut first, first_in, _first_out) = initialized_run(data.path(), log("first.stderr"));
    let (mut second, _second_in, _second_out) = initialized_run(data.path(), log("second.stderr"));
    drop(first_in);
    assert!(exit_within(&mut first, 60, "the first run at EOF").success());
    let status = exit_within(&mut second, 60, "the second run once its engine went");
    let said = std::fs::read_to_string(data.path().join("second.stderr")).unwrap();
    let left = sandbox_records(data.path());
    crate::common::kill_left_behind(data.path());
    assert!(!status.success(), "{status:?}: {said}");
    assert!(
        said.contains("another sandbox-mcp process on this data dir")
            && said.contains("SANDBOX_MCP_DATA_DIR"),
        "{said}"
    );
    assert!(
        left.is_empty(),
        "the second run's sandbox was left: {left:?}"
    );
}

/// `sandbox-mcp run -- mcp-server-time` on data dir `data`, its stderr to `stderr`, once it has
/// answered `initialize`: its engine is up and its server runs.
fn initialized_run(
    data: &std::path::Path,
    stderr: Stdio,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::{BufRead, Write};
    let mut child = std::process::Command::new(BIN)
        .env("SANDBOX_MCP_DATA_DIR", data)
        .env_remove("SANDBOX_MCP_URL")
        .args(["run", "--"])
        .args(reference_command("time"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, "{}", crate::common::INITIALIZE_LINE).unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("mcp-time"), "{line}");
    (child, stdin, stdout)
}
