//! Real third-party MCP servers for the hosted-server tests: three from npm
//! (`@modelcontextprotocol/server-everything`, `-filesystem`, `-memory`) and two from PyPI
//! (`mcp-server-time`, `mcp-server-fetch`), installed on this machine under /usr (which the base
//! template shows) at test setup — never fetched from inside a sandbox.

use std::path::Path;

/// The five reference servers: name, the program they install, the package.
pub const REFERENCE_SERVERS: [(&str, &str, &str); 5] = [
    (
        "everything",
        "mcp-server-everything",
        "npm:@modelcontextprotocol/server-everything",
    ),
    (
        "filesystem",
        "mcp-server-filesystem",
        "npm:@modelcontextprotocol/server-filesystem",
    ),
    (
        "memory",
        "mcp-server-memory",
        "npm:@modelcontextprotocol/server-memory",
    ),
    ("time", "mcp-server-time", "pip:mcp-server-time"),
    ("fetch", "mcp-server-fetch", "pip:mcp-server-fetch"),
];

/// Where a server's program is, under /usr (so a sandbox sees it too).
pub fn server_program(program: &str) -> Option<String> {
    ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| format!("{d}/{program}"))
        .find(|p| Path::new(p).exists())
}

/// Installs whichever reference server is missing (as root: npm -g, Debian's pip); the missing
/// ones named when they cannot be.
pub fn reference_servers() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        super::ensure_host_tools();
        let missing = || {
            REFERENCE_SERVERS
                .iter()
                .filter(|(_, program, _)| server_program(program).is_none())
                .map(|(_, _, package)| *package)
                .collect::<Vec<_>>()
        };
        let want = missing();
        if want.is_empty() {
            return Ok(());
        }
        if nix::unistd::geteuid().is_root() {
            let npm: Vec<&str> = want.iter().filter_map(|p| p.strip_prefix("npm:")).collect();
            let pip: Vec<&str> = want.iter().filter_map(|p| p.strip_prefix("pip:")).collect();
            if !npm.is_empty() {
                eprintln!("tests: installing {} with npm", npm.join(" "));
                let _ = std::process::Command::new("npm")
                    .args(["install", "-g", "--no-fund", "--no-audit"])
                    .args(&npm)
                    .stdout(std::process::Stdio::null())
                    .status();
            }
            if !pip.is_empty() {
                eprintln!("tests: installing {} with pip", pip.join(" "));
                let _ = std::process::Command::new("/usr/bin/python3")
                    .args(["-m", "pip", "install", "-q", "--break-system-packages"])
                    .args(["--root-user-action=ignore", "--disable-pip-version-check"])
                    .args(&pip)
                    .status();
            }
        }
        let still = missing();
        if still.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "needs the reference MCP servers installed under /usr: {}",
                still.join(" ")
            ))
        }
    })
    .clone()
}

#[macro_export]
macro_rules! require_reference_servers {
    () => {
        $crate::require_sandboxes!();
        if let Err(reason) = $crate::common::reference_servers() {
            if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                panic!("{reason}");
            }
            eprintln!("SKIPPED {}: {reason}", module_path!());
            return;
        }
    };
}
