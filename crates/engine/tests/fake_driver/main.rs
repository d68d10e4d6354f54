//! The engine on the fake driver (`sandbox_mcp_testkit::fake`): its lifecycles, crash recovery,
//! fork rollback, deadlines, OOM reports and vanished sandboxes, each tested by an ordinary
//! user on any machine.
//!
//! These tests need nothing from the host: no root, no user, mount, pid or network namespaces,
//! no cgroups, overlayfs or btrfs, no network (not even loopback — the engine is called
//! in-process, and its agents are tasks on in-memory pipes). A temporary directory holds the
//! engine's data dir (SQLite records, its CA) and the fake's sandbox directories. They run with
//! every `cargo test` at the workspace root; CI (`.ci/run`) also runs them as `nobody` in a
//! network namespace with no interface up, which is how to see that they need nothing:
//!
//! ```text
//! cargo test -p sandbox-mcp-engine --test fake_driver --no-run   # prints the binary's path
//! unshare --net setpriv --reuid=65534 --regid=65534 --clear-groups <a copy nobody can run>
//! ```
//!
//! Times are asserted as generous upper bounds only (a busy two-core machine must not fail
//! them): what is checked is that a hung agent ends in an error, not how fast.

// Tests: a fixture that cannot be made, or a result that is not what was expected, fails the
// test that asked for it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

mod crashes;
mod faults;
mod forks;
mod lifecycle;
mod pools;
mod recovery;
mod timeouts;
