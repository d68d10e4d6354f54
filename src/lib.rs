//! sandbox-mcp: an MCP server that gives AI agents isolated Linux sandboxes, with the sandbox
//! engine built in.
//!
//! Data flow: an MCP client → [`mcp`] (tools generated from `tool-defs/` and `openapi/` at build
//! time, see `build.rs` and [`codegen`](../build/index.html)) → [`client`] (generated from the
//! spec) → HTTP → [`engine`] (the control plane) → the [`agent`] inside each sandbox.

pub mod agent;
pub mod cli;
pub mod client;
pub mod engine;
pub mod fs_tree;
pub mod fuzzing;
pub mod jsonschema;
pub mod keys;
pub mod mcp;
pub mod tooldefs;
