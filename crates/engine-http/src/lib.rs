//! The engine over HTTP: the control plane of `openapi/sandbox-mcp.json` served on the engine
//! core's services (`sandbox-mcp-engine`), which know nothing of HTTP.
//!
//! [`server`] serves the API over HTTP with bearer keys and runs the manager's timers; [`api`]
//! implements each operation on the types generated from the spec; [`preview`] serves sandboxes'
//! ports as preview URLs on a listener of its own; [`local`] runs or finds the engine for a data
//! dir when the MCP server embeds it.

pub mod api;
mod in_process;
pub mod local;
pub mod preview;
pub mod server;
