//! Fixtures the integration tests (`tests/`) and the benchmarks (`benches/`) share, in a crate of
//! their own so that each is compiled once rather than into both.

pub mod images;
pub mod kubernetes;
pub mod netlinks;
