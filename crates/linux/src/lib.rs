//! The `namespaces` driver: each sandbox is a set of Linux namespaces with an overlay root,
//! cgroup limits, dropped capabilities, Landlock and seccomp, and the agent as its PID 1.
//!
//! [`plan`] computes what to build (pure); [`launcher`] (the hidden `__launch` subcommand) creates
//! the namespaces from outside and execs the agent, which builds the rest from inside
//! ([`inside`]); [`driver`] drives both from the engine; [`cgroups`], [`disk`], [`netns`],
//! [`seccomp`], [`uids`] and [`step`] are the pieces (syscall wrappers shared with the agent: `sandbox_mcp_sys::syscalls`).

pub mod cgroups;
pub mod criu;
pub mod disk;
pub mod driver;
pub mod inside;
pub mod launcher;
pub mod netns;
pub mod plan;
mod procs;
pub mod seccomp;
pub mod step;
pub mod uids;

pub use driver::NamespacesDriver;
