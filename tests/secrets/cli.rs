//! The command line: `sandbox-mcp secrets` reads the value from stdin and never prints it, and
//! `--egress-ca` is checked on both commands.

use crate::common::*;
use crate::require_sandboxes;

use super::VALUE;

/// `sandbox-mcp secrets`: the value comes from stdin and never comes back out.
#[test]
fn secrets_cli_reads_stdin_and_never_prints_the_value() {
    use std::io::Write;
    let dir = TempData::new();
    let run = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(BIN)
            .arg("secrets")
            .args(args)
            .env("SANDBOX_MCP_DATA_DIR", dir.data())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A refused command may exit before reading stdin: a broken pipe here is fine.
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, said) = run(
        &[
            "set",
            "gh",
            "--host",
            "api.github.test",
            "--header",
            "Authorization",
            "--format",
            "Bearer {value}",
        ],
        &format!("{VALUE}\n"),
    );
    assert!(ok, "{said}");
    assert!(!said.contains(VALUE), "{said}");
    let (ok, listed) = run(&["list"], "");
    assert!(
        ok && listed.contains("gh") && listed.contains("api.github.test"),
        "{listed}"
    );
    assert!(!listed.contains(VALUE));
    // No hosts, or an empty value: refused with what to do.
    let (ok, said) = run(&["set", "gh2"], "v");
    assert!(!ok && said.contains("--host"), "{said}");
    let (ok, said) = run(&["set", "gh2", "--host", "a.test"], "\n");
    assert!(!ok && said.contains("empty"), "{said}");
    let (ok, said) = run(&["rm", "gh"], "");
    assert!(ok, "{said}");
    let (ok, said) = run(&["rm", "gh"], "");
    assert!(!ok && said.contains("no secret named gh"), "{said}");
    // The key file is the operator's alone.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.data().join("secrets.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

/// `--egress-ca` (and `SANDBOX_MCP_EGRESS_CA`) on both commands: a file with no certificate
/// stops the engine from starting, saying which file and why.
#[test]
fn egress_ca_is_checked_on_both_commands() {
    require_sandboxes!();
    let dir = TempData::new();
    let bad = dir.dir.path().join("not-a-ca.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let bad = bad.to_str().unwrap();
    let engine = std::process::Command::new("timeout")
        .args(["20", BIN, "engine", "--listen", "127.0.0.1:0"])
        .env("SANDBOX_MCP_DATA_DIR", dir.data())
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .env("SANDBOX_MCP_EGRESS_CA", bad)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&engine.stderr);
    assert!(!engine.status.success());
    assert!(
        said.contains(&format!("--egress-ca {bad}: no PEM certificate in it")),
        "{said}"
    );
    let embedded = std::process::Command::new("timeout")
        .args(["20", BIN, "--egress-ca", bad])
        .env_remove("SANDBOX_MCP_URL")
        .env("SANDBOX_MCP_DATA_DIR", dir.data())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&embedded.stderr);
    assert!(said.contains("no PEM certificate in it"), "{said}");
}
