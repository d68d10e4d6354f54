//! The `sandbox-mcp` binary: dispatches to the CLI, or to the hidden launcher and agent entry
//! points when re-executed by the engine (checked first, so a sandbox's init starts without
//! parsing arguments or setting up logging).

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args_os().nth(1).as_ref().and_then(|a| a.to_str()) {
        Some("__launch") => sandbox_mcp_linux::launcher::main(),
        Some("__agent") => agent(),
        Some("__agent-pod") => exit(sandbox_mcp_agent::pod::run_agent()),
        Some("__agent-mux") => exit(sandbox_mcp_agent::pod::run_mux()),
        Some("__install") => exit(sandbox_mcp_agent::pod::install(std::env::args_os().nth(2))),
        _ => sandbox_mcp::cli::main(),
    }
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-mcp: {}", sandbox_mcp::cli::error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The sandbox's init: build the sandbox around this process, then serve as its agent.
fn agent() -> ExitCode {
    use sandbox_mcp_agent::{server, spawn};
    use sandbox_mcp_linux::{inside, launcher};
    let entered = match inside::enter() {
        Ok(entered) => entered,
        Err(e) => {
            server::report_failure(launcher::AGENT_STATUS_FD, &e.to_string());
            return ExitCode::FAILURE;
        }
    };
    spawn::set_default_cwd(entered.workdir);
    spawn::confine_commands(spawn::Confinement {
        caps: entered.commands.caps,
        landlock: entered.commands.landlock,
        user: entered.user,
    });
    match server::run(
        launcher::AGENT_LISTEN_FD,
        launcher::AGENT_STATUS_FD,
        entered.env,
        entered.egress,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
