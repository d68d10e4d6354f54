//! Command line: `sandbox-mcp` (stdio MCP server, the default), `sandbox-mcp engine` (the control
//! plane alone), `sandbox-mcp tools` (the tool table) and `sandbox-mcp keys` (HTTP access keys).
//! Every setting also has an environment variable, so MCP client configs can set them without
//! arguments. Each subcommand takes only its own flags: `engine --http` is an error, not ignored,
//! and a serve flag before a subcommand is refused too (environment variables never conflict).
//!
//! The arguments are declared in [`args`]; each subcommand's work is in a module named after it;
//! [`settings`] turns arguments into the engine's configuration, and [`process`] holds what the
//! long-running subcommands share (logging, the signals that stop them).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use args::{Cli, Command};

mod args;
mod engine;
mod keys;
mod oauth;
mod process;
mod run;
mod secrets;
mod serve;
mod servers;
mod settings;
mod template;
mod tools;
mod workspace;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match runtime_for(&cli).build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox-mcp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        None => runtime.block_on(serve::run(cli.serve)),
        Some(Command::Serve(args)) => runtime.block_on(serve::run(args)),
        Some(Command::Engine(args)) => runtime.block_on(engine::run(args)),
        Some(Command::Tools(args)) => tools::run(&args.tools, args.json),
        Some(Command::Keys(args)) => keys::run(&args.data, args.command),
        Some(Command::Secrets(args)) => secrets::run(&args.data, args.command),
        Some(Command::Template(args)) => runtime.block_on(template::run(&args.data, args.command)),
        Some(Command::Servers(args)) => runtime.block_on(servers::run(args)),
        Some(Command::Workspace(args)) => runtime.block_on(workspace::run(args)),
        Some(Command::Oauth(args)) => oauth::run(&args.data, args.command),
        Some(Command::Run(args)) => match runtime.block_on(run::run(args)) {
            Ok(code) => {
                runtime.shutdown_timeout(Duration::from_millis(100));
                return ExitCode::from(code.clamp(0, 255) as u8);
            }
            Err(e) => Err(e),
        },
    };
    // Sandboxes and sockets are shut down already; don't wait for idle blocking threads.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-mcp: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes in one line, each said once: a message that already ends with its
/// cause's words (most of ours quote it) does not get them again.
pub fn error_text(e: &anyhow::Error) -> String {
    sandbox_mcp_engine::error::chain(e.as_ref())
}

/// The stdio server answers one client: one worker thread serves it, where the default starts
/// a worker per core before the first byte is read (64 threads on a 64-core host). An engine it
/// comes to serve itself gets a pool of its own then (`local_engine`). Every other command gets
/// a worker per core.
fn runtime_for(cli: &Cli) -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = worker_threads(cli) {
        builder.worker_threads(workers);
    }
    builder.enable_all();
    builder
}

/// The runtime's worker threads for a command line; `None`: one per core.
fn worker_threads(cli: &Cli) -> Option<usize> {
    let stdio = match &cli.command {
        None => cli.serve.http.is_none(),
        Some(Command::Serve(args)) => args.http.is_none(),
        Some(_) => false,
    };
    stdio.then_some(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stdio_server_runs_on_one_worker() {
        let workers = |args: &[&str]| worker_threads(&Cli::try_parse_from(args).unwrap());
        assert_eq!(workers(&["sandbox-mcp"]), Some(1));
        assert_eq!(workers(&["sandbox-mcp", "serve"]), Some(1));
        assert_eq!(workers(&["sandbox-mcp", "--tools", "core"]), Some(1));
        assert_eq!(workers(&["sandbox-mcp", "--http", "127.0.0.1:0"]), None);
        assert_eq!(
            workers(&["sandbox-mcp", "serve", "--http", "127.0.0.1:0"]),
            None
        );
        assert_eq!(workers(&["sandbox-mcp", "engine"]), None);
    }
}
