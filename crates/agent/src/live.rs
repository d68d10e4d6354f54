//! Live state: the process trees this agent started, described for a checkpoint, and restored
//! trees taken over.
//!
//! The engine dumps a tree (a code context's interpreter, a background job) from the outside and
//! restores it into another sandbox, whose agent made fresh pipes for it ([`Pending::make`]) and
//! then takes it over ([`adopt`]) as if it had started it. A restored process is not the agent's
//! child (the restore made it), so its end is seen through a pidfd, not the reaper, and its exit
//! status is unknown.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::jobs::Jobs;
use super::reaper::Exit;
use super::repl::Contexts;
use super::spawn::error;
use sandbox_mcp_protocol::{AgentError, ErrorKind, PipeRole, Tree, TreeKind, TreeList};

/// Most pipe sets kept for restores in flight.
const MAX_PENDING: usize = 64;
/// Most pipes one restored tree may ask for.
const MAX_PIPES: usize = 8;

/// Pipes made for restores in flight: the agent's ends, by key.
#[derive(Default)]
pub(crate) struct Pending {
    sets: RefCell<HashMap<String, Vec<(PipeRole, OwnedFd)>>>,
}

/// The agent's end of a pipe made for a restored tree.
pub(crate) struct AgentEnds {
    ends: Vec<(PipeRole, OwnedFd)>,
}

impl AgentEnds {
    /// The agent's end for `role` (each role once).
    pub(crate) fn take(&mut self, role: PipeRole) -> Result<OwnedFd, AgentError> {
        let i = self
            .ends
            .iter()
            .position(|(r, _)| *r == role)
            .ok_or_else(|| {
                error(
                    ErrorKind::InvalidArgument,
                    format!("no {role:?} pipe was made"),
                )
            })?;
        Ok(self.ends.swap_remove(i).1)
    }
}

impl Pending {
    /// Makes one pipe per role; keeps the agent's ends under `key` and returns the process's.
    pub(crate) fn make(&self, key: String, roles: &[PipeRole]) -> Result<Vec<OwnedFd>, AgentError> {
        if roles.len() > MAX_PIPES {
            return Err(error(
                ErrorKind::InvalidArgument,
                "too many pipes for one tree",
            ));
        }
        let mut sets = self.sets.borrow_mut();
        if sets.len() >= MAX_PENDING && !sets.contains_key(&key) {
            return Err(error(ErrorKind::Conflict, "too many restores in flight"));
        }
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for role in roles {
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| error(ErrorKind::Io, format!("cannot create a pipe: {e}")))?;
            let (mine, process) = if role.process_reads() { (w, r) } else { (r, w) };
            ours.push((*role, mine));
            theirs.push(process);
        }
        sets.insert(key, ours);
        Ok(theirs)
    }

    pub(crate) fn take(&self, key: &str) -> Option<AgentEnds> {
        self.sets
            .borrow_mut()
            .remove(key)
            .map(|ends| AgentEnds { ends })
    }
}

/// Every tree the agent could hand over now, and what it cannot.
pub(crate) fn list(contexts: &Contexts, jobs: &Jobs) -> TreeList {
    let (mut trees, mut skipped) = contexts.trees();
    let (job_trees, job_skipped) = jobs.trees();
    trees.extend(job_trees);
    skipped.extend(job_skipped);
    TreeList { trees, skipped }
}

/// Takes over a restored tree: registers it as the context or job it was, on the pipes kept
/// under its key.
pub(crate) fn adopt(
    contexts: &Contexts,
    jobs: &Jobs,
    tree: Tree,
    pid: i32,
    ends: AgentEnds,
) -> Result<(), AgentError> {
    let exit = watch_exit(pid)?;
    match tree.kind {
        kind @ TreeKind::Context { .. } => contexts.adopt(kind, pid, ends, exit),
        kind @ TreeKind::Job { .. } => jobs.adopt(kind, pid, ends, exit),
    }
}

/// Turns a descriptor into an async pipe end.
pub(crate) fn receiver(fd: OwnedFd) -> Result<pipe::Receiver, AgentError> {
    pipe::Receiver::from_owned_fd(fd)
        .map_err(|e| error(ErrorKind::Io, format!("cannot watch a restored pipe: {e}")))
}

pub(crate) fn sender(fd: OwnedFd) -> Result<pipe::Sender, AgentError> {
    pipe::Sender::from_owned_fd(fd)
        .map_err(|e| error(ErrorKind::Io, format!("cannot feed a restored pipe: {e}")))
}

/// Resolves when `pid` ends (through a pidfd: the process is not the agent's child).
fn watch_exit(pid: i32) -> Result<oneshot::Receiver<Exit>, AgentError> {
    // SAFETY: pidfd_open on an integer pid; the result is a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
    if raw < 0 {
        return Err(error(
            ErrorKind::Io,
            format!(
                "the restored process {pid} is not there: {}",
                std::io::Error::last_os_error()
            ),
        ));
    }
    // SAFETY: pidfd_open just returned this descriptor, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: the AsyncFd owns the descriptor, which stays open and the same until it drops.
    let watched = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .map_err(|e| error(ErrorKind::Io, format!("cannot watch process {pid}: {e}")))?;
    let (tx, rx) = oneshot::channel();
    tokio::task::spawn_local(async move {
        let _ = watched.readable().await;
        let _ = tx.send(Exit::Unknown);
    });
    Ok(rx)
}
