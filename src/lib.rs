//! sandbox-mcp: an MCP server that gives AI agents isolated Linux sandboxes, with the sandbox
//! engine built in.
//!
//! Data flow: an MCP client → the MCP layer (`sandbox-mcp-server`: tools generated from
//! `tool-defs/` and `openapi/` at build time with `sandbox-mcp-codegen`) → the client generated
//! from the spec (`sandbox-mcp-api`) → HTTP → the engine (`sandbox-mcp-engine`, the control
//! plane) → a driver (`sandbox-mcp-linux`, `sandbox-mcp-kube`) → the agent inside each sandbox
//! (`sandbox-mcp-agent`). This crate is the binary that brings them together: [`cli`] (one
//! module per subcommand), [`wiring`] (which driver an engine runs) and [`local_engine`] (the
//! MCP server's engine, served here or shared with another process).

pub mod cli;
pub mod local_engine;
pub mod wiring;
