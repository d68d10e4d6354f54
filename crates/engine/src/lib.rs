//! The engine core: the control plane behind `openapi/sandbox-mcp.json`, without its HTTP side
//! (`sandbox-mcp-engine-http` serves it).
//!
//! [`manager`] composes the [`services`] (sandbox lifecycles, quotas, timers, the agent client,
//! snapshots, templates, previews, secrets, desktops…); [`state`] keeps every acknowledged record
//! in SQLite; [`driver`] is the one async handle through which the services reach the isolation
//! and storage of a driver (known only by the model's interface); [`error`] is every way an
//! operation fails, and the HTTP status and `error_code` each failure leaves the engine with.

pub(crate) mod disk_meter;
pub mod driver;
pub mod error;
pub mod manager;
pub(crate) mod records;
pub mod services;
pub mod state;
