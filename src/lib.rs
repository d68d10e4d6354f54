//! sandbox-mcp: an MCP server that gives AI agents isolated Linux sandboxes, with the sandbox
//! engine built in.
//!
//! Data flow: an MCP client → [`mcp`] (tools generated from `tool-defs/` and `openapi/` at build
//! time by `build.rs` with the `sandbox-mcp-codegen` crate) → [`client`] (generated from the
//! spec) → HTTP → [`engine`] (the control plane) → the [`agent`] inside each sandbox.

pub mod cli;
pub mod local_engine;
pub mod wiring;
