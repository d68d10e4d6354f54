//! An engine as a process of its own: the real binary's `engine` subcommand on a loopback port,
//! set up alike by the tests and the benchmarks (their key, room for a thousand sandboxes, no
//! idle pause). Each adds its own settings and output, spawns it and waits for it in its way.

use std::path::Path;
use std::process::Command;

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `bin engine --listen 127.0.0.1:<port>` on the data dir `data`, accepting `key`, with room for
/// a thousand sandboxes and no idle pause; not yet spawned.
pub fn command(bin: &str, data: &Path, key: &str, port: u16) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["engine", "--listen", &format!("127.0.0.1:{port}")])
        .env("SANDBOX_MCP_DATA_DIR", data)
        .env("SANDBOX_MCP_ENGINE_KEYS", key)
        .env("SANDBOX_MCP_MAX_SANDBOXES", "1000")
        .env("SANDBOX_MCP_IDLE_PAUSE", "0");
    command
}
