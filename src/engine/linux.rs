//! The `namespaces` driver: each sandbox is a set of Linux namespaces with an overlay root,
//! cgroup limits, dropped capabilities, Landlock and seccomp, and the agent as its PID 1.
//!
//! [`plan`] computes what to build (pure), [`launcher`] builds it (the hidden `__launch`
//! subcommand), [`driver`] drives both from the engine; [`cgroups`], [`disk`], [`seccomp`],
//! [`landlock`] and [`sys`] are the pieces.

pub mod cgroups;
pub mod disk;
pub mod driver;
pub mod landlock;
pub mod launcher;
pub mod plan;
pub mod seccomp;
pub mod sys;

pub use driver::NamespacesDriver;
