//! Fixtures the integration tests (`tests/`) and the benchmarks (`benches/`) share, in a crate of
//! their own so that each is compiled once rather than into both; and [`fake`], the fake driver
//! the engine's own tests run on without root.
// Fixtures for tests and benchmarks: one that cannot be made fails the test that asked for it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod engine;
pub mod fake;
pub mod images;
pub mod kubernetes;
pub mod netlinks;
pub mod procfs;
pub mod stdio;
