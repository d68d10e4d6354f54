//! The engine: the control plane behind `openapi/sandbox-mcp.json`.
//!
//! [`server`] serves the API over HTTP with bearer keys; [`api`] implements each operation on the
//! generated types; [`manager`] composes the [`services`] (sandbox lifecycles, quotas, timers,
//! snapshots, templates…); [`state`] keeps every acknowledged record in SQLite; a driver does the
//! isolation (the model's interface, called through [`driver::DriverHandle`]; which one is the
//! binary's choice: the namespaces driver of `sandbox-mcp-linux`, or `sandbox-mcp-kube`'s pods).
//! [`local`] runs or finds the engine for a data dir when the MCP server embeds it;
//! `sandbox-mcp-network` carries sandboxes' traffic out under their egress rules; [`preview`]
//! serves their ports as preview URLs.

pub mod api;
pub mod driver;
pub mod error;
pub mod local;
pub mod manager;
pub mod preview;
pub(crate) mod records;
pub mod server;
pub mod services;
pub mod state;
