//! The integration suite, as one test binary (one link, shared fixtures). Tests that need real
//! sandboxes skip with the missing kernel feature named, unless SANDBOX_MCP_REQUIRE_SANDBOX is set
//! (as in CI), where a missing feature fails instead.
// Test helpers are `pub` so that every test module can reach them; nothing here is exported.
#![allow(
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod common;

// Shared with the benchmarks: compiled once, in a crate of its own.
use sandbox_mcp_testkit::{images, netlinks};

mod code_jobs;
mod codegen_validator;
mod conformance;
mod containment;
mod desktop;
mod docs;
mod e2b;
mod engine_api;
mod engine_budgets;
mod engine_lifecycle;
mod faults;
mod forks;
mod fuzz_replay;
mod hang_ups;
mod hosted;
mod http_transport;
mod in_process;
mod kubernetes;
mod live;
mod mcp_calls;
mod network;
mod oauth;
mod previews;
mod secrets;
mod secrets_hostile;
mod snapshots;
mod stdio;
mod templates;
mod testnet;
mod timeouts;
mod volumes;
