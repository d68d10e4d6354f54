//! Settings: `--help` documents every setting, RUST_LOG is applied or refused by name, a malformed
//! URL fails at startup with an example, an engine that cannot start says why once, and
//! subcommands refuse flags that are not theirs, and `tools --json` is what `tools/list` sends.

use std::process::Command;

use sandbox_mcp_testkit::engine::free_port;

use crate::common::BIN;

#[test]
fn help_documents_every_setting() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "SANDBOX_MCP_URL",
        "SANDBOX_MCP_API_KEY",
        "SANDBOX_MCP_DATA_DIR",
        "SANDBOX_MCP_TIMEOUT",
        "SANDBOX_MCP_TOOLS",
        "engine",
        "tools",
    ] {
        assert!(
            help.contains(needle),
            "--help does not mention {needle}:\n{help}"
        );
    }
    let out = Command::new(BIN).arg("tools").output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("sandbox_exec") && table.contains("health"),
        "{table}"
    );
}

/// RUST_LOG takes a level or `target=level,…`; anything else is named on stderr and the default
/// applies, and `target=level` does filter by target.
#[test]
fn rust_log_is_applied_or_refused_by_name() {
    let run = |filter: &str| {
        let port = free_port();
        let out = Command::new(BIN)
            .env("SANDBOX_MCP_URL", format!("http://127.0.0.1:{port}"))
            .env("RUST_LOG", filter)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        // (stdin is empty: the server exits before any initialize, which is not the point here)
        assert!(
            out.stdout.is_empty(),
            "{filter}: stdout carries only JSON-RPC"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let bad = run("sandbox_mcp=loud");
    assert!(
        bad.contains("RUST_LOG=\"sandbox_mcp=loud\" ignored") && bad.contains("target=level"),
        "{bad}"
    );
    // The server logs where its control plane is at debug: shown for its own target only.
    let ours = run("sandbox_mcp=debug");
    assert!(ours.contains("DEBUG sandbox_mcp"), "{ours}");
    let others = run("rmcp=debug");
    assert!(!others.contains("DEBUG sandbox_mcp"), "{others}");
}

#[test]
fn a_malformed_url_fails_at_startup_with_an_example() {
    for url in [
        "localhost:7070",
        "ftp://example.com",
        "http://",
        "not a url",
    ] {
        let out = Command::new(BIN)
            .env("SANDBOX_MCP_URL", url)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{url}: started anyway");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("invalid SANDBOX_MCP_URL") && err.contains("http://10.0.0.5:7070"),
            "{url}: {err}"
        );
        assert!(out.stdout.is_empty(), "{url}: stdout carries only JSON-RPC");
    }
}

/// An engine that cannot start says why, each cause once: the driver's reason is quoted by the
/// message that wraps it, and is not printed again after it.
#[test]
fn an_engine_that_cannot_start_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d".repeat(120));
    let out = Command::new(BIN)
        .args(["engine", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("SANDBOX_MCP_ENGINE_KEYS", crate::common::KEY)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "it started anyway");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot set up the sandbox driver")
            && err.matches("is too long for unix sockets").count() == 1,
        "{err}"
    );
}

/// Each subcommand takes only its own flags: a flag of another one is an error, never silently
/// ignored; environment variables (which MCP client configs set for everything) never conflict.
#[test]
fn subcommands_refuse_flags_that_are_not_theirs() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env_remove("SANDBOX_MCP_URL");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["engine", "--http", "127.0.0.1:1"][..],
        &["engine", "--rate-limit", "5"],
        &["keys", "--tools", "core", "list"],
        &["tools", "--max-sandboxes", "3"],
        &["--tools", "core", "engine"],
    ] {
        let (ok, stderr) = run(args, &[]);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            stderr.contains("unexpected argument") || stderr.contains("cannot be used with"),
            "{args:?}: {stderr}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr) = run(
        &["keys", "list"],
        &[
            ("SANDBOX_MCP_HTTP", "127.0.0.1:9"),
            ("SANDBOX_MCP_TOOLS", "core"),
            ("SANDBOX_MCP_DATA_DIR", dir.path().to_str().unwrap()),
        ],
    );
    assert!(ok, "{stderr}");
}

/// The tools are resolved beside the server's start, not before it; a `--tools` that names
/// nothing is still checked at once (against the names alone) and ends the server with the
/// choices, though stdin stays open and a client has sent `initialize`.
#[test]
fn an_unknown_toolset_ends_the_server_at_start_with_the_choices() {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(["--tools", "sandbox_exec,nope"])
        .env("SANDBOX_MCP_URL", "http://127.0.0.1:9")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = writeln!(stdin, "{}", crate::common::INITIALIZE_LINE);
    let status = crate::common::exit_within(
        &mut child,
        20,
        "the server must not keep running with an unknown toolset",
    );
    drop(stdin);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("nope") && err.contains("toolsets: all"),
        "{err}"
    );
}

/// `tools --json` prints exactly what `tools/list` sends, for the default toolset and another.
#[test]
fn tools_json_is_what_tools_list_sends() {
    use std::io::{BufRead, Write};
    for toolset in ["all", "core"] {
        let printed = Command::new(BIN)
            .args(["tools", "--json", "--tools", toolset])
            .output()
            .unwrap();
        assert!(printed.status.success(), "{printed:?}");
        let printed: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
        let data = tempfile::tempdir().unwrap();
        // No engine is needed to list tools: the URL has none behind it.
        let mut child = Command::new(BIN)
            .env("SANDBOX_MCP_DATA_DIR", data.path())
            .env("SANDBOX_MCP_URL", "http://127.0.0.1:9")
            .env("SANDBOX_MCP_TOOLS", toolset)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{}", crate::common::INITIALIZE_LINE).unwrap();
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
        )
        .unwrap();
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list"}}"#).unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let listed = loop {
            let line = lines
                .next()
                .expect("the server ended before answering")
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == 2 {
                break v["result"].clone();
            }
        };
        drop(stdin);
        crate::common::exit_within(&mut child, 20, "the server must end at EOF");
        assert_eq!(printed["tools"], listed["tools"], "{toolset}");
        assert!(!listed["tools"].as_array().unwrap().is_empty());
    }
}
