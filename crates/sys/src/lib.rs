//! Host primitives every other layer of sandbox-mcp stands on, and which know nothing of what a
//! sandbox means:
//!
//! - [`syscalls`]: one-syscall wrappers the launcher and the agent need and nix does not have,
//!   and the few sequences of nix calls whose order or check every caller needs;
//! - [`mounts`]: the one `/proc/self/mountinfo` parser;
//! - [`fs_tree`]: walking, measuring and deleting trees a sandbox wrote, iteratively and never
//!   through a link;
//! - [`durable`]: writes that survive a crash (temporary file, fsync, rename, fsync), file locks;
//! - [`layers`] and [`stack`]: template layers on disk — capturing and copying a sandbox's upper
//!   directories with whiteouts and id shifts, and reading a file of a layer stack as a sandbox
//!   would see it;
//! - [`budget`]: the engine process's own descriptors and memory.

pub mod budget;
pub mod durable;
pub mod fs_tree;
pub mod layers;
pub mod mounts;
pub mod stack;
pub mod syscalls;

pub use syscalls::{lock, now_ms};
