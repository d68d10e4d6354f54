//! The MCP server: tools/list and tools/call over the generated registry, dispatch and client.
//!
//! Data flow for a call: [`args`] validates the arguments against the schema the model saw and
//! fills defaults → the generated dispatch (`OUT_DIR/dispatch.rs`) calls the typed client →
//! [`shape`] caps the result or turns a failure into the tool-def's message. [`server`] wires that
//! into rmcp; [`stdio`] frames the protocol on stdin/stdout; [`backend`] finds the control plane.

pub mod args;
pub mod backend;
pub mod call;
pub mod hosted;
pub mod http;
pub mod jsonrpc;
pub mod keys;
pub(crate) mod progress;
pub mod server;
pub mod session;
pub mod shape;
pub mod stdio;
pub mod tooldefs;

/// The generated dispatch from tool name to typed client call (see `sandbox-mcp-codegen`).
pub mod dispatch {
    include!(concat!(env!("OUT_DIR"), "/dispatch.rs"));
}
