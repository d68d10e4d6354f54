//! The `sandbox-mcp` binary: dispatches to the CLI, or to the hidden launcher and agent entry
//! points when re-executed by the engine (checked first, so a sandbox's init starts without
//! parsing arguments or setting up logging).

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args_os().nth(1).as_ref().and_then(|a| a.to_str()) {
        Some("__launch") => sandbox_mcp::engine::linux::launcher::main(),
        Some("__agent") => match sandbox_mcp::agent::server::run(
            sandbox_mcp::engine::linux::launcher::AGENT_LISTEN_FD,
            sandbox_mcp::engine::linux::launcher::AGENT_STATUS_FD,
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        },
        _ => sandbox_mcp::cli::main(),
    }
}
