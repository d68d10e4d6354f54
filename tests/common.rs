//! Shared test fixtures: a real engine on a temporary data dir, real sandboxes, an rmcp client
//! talking to the real MCP server over an in-process pipe.
//!
//! By kind: [`host`] (whether this machine can run sandboxes, the tools the tests need, and what
//! engines leave on it), [`engine`] (an engine in this process, on a temporary data dir),
//! [`mcp`] (an MCP client of the real server, and calls through it) and [`processes`] (engines
//! as processes of their own, and the API they serve). Everything is re-exported here, so tests
//! name it `crate::common::…`.

pub const KEY: &str = "test-key-0123456789";
pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

mod engine;
mod host;
mod mcp;
mod processes;
mod servers;
mod wire;

pub use engine::*;
pub use host::*;
pub use mcp::*;
pub use processes::*;
pub use servers::*;
pub use wire::*;
