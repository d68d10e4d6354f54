//! The agent: PID 1 inside every sandbox.
//!
//! The engine never touches a sandbox's files or processes from outside. It connects to the
//! agent's unix socket (one connection per request) and the agent does the work from inside the
//! sandbox's own root, so paths with `..`, absolute symlinks or `/proc/self/root` resolve within
//! the sandbox by construction. The agent also reaps orphaned processes (it is their init),
//! enforces exec timeouts and caps output as it arrives.
//!
//! It runs the same binary as the engine, re-executed by the launcher under a hidden subcommand
//! after every restriction is in place (namespaces, pivot_root, capabilities, seccomp).

/// A desktop's screen size (stored in sandbox records too).
pub use sandbox_mcp_protocol::Screen;

pub mod accounts;
pub(crate) mod attach;
pub(crate) mod capture;
pub(crate) mod desktop;
pub(crate) mod exec;
pub mod files;
pub(crate) mod jobs;
pub(crate) mod listing;
pub(crate) mod live;
pub mod pod;
pub(crate) mod reaper;
pub(crate) mod repl;
pub(crate) mod safe_open;
pub mod server;
pub mod spawn;
pub mod terminal;
pub(crate) mod watch;
pub(crate) mod xattrs;
