//! The `namespaces` driver: each sandbox is a set of Linux namespaces with an overlay root,
//! cgroup limits, dropped capabilities, Landlock and seccomp, and the agent as its PID 1.
//!
//! [`plan`] computes what to build (pure); [`launcher`] (the hidden `__launch` subcommand) creates
//! the namespaces from outside and execs the agent, which builds the rest from inside
//! ([`inside`]); [`driver`] drives both from the engine; [`cgroups`], [`disk`], [`netns`],
//! [`seccomp`], [`uids`] and [`step`] are the pieces (syscall wrappers shared with the agent: `crate::sys`).

pub mod cgroups;
pub mod disk;
pub mod driver;
pub mod inside;
pub mod launcher;
pub(crate) mod netns;
pub mod plan;
pub(crate) mod seccomp;
pub(crate) mod step;
pub(crate) mod uids;

pub use driver::NamespacesDriver;
