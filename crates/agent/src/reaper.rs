//! Zombie reaping for PID 1.
//!
//! Every process orphaned inside the sandbox is re-parented to the agent, so the agent must wait
//! for all of them, not only its own children. One task waits for any child on each SIGCHLD and
//! hands the status to whoever registered interest in that pid; the rest are simply reaped.
//! The agent runs on a single-threaded runtime, so a pid is always registered before the task can
//! observe its exit.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// It ended, how is unknown: a restored process, not the agent's child, is reaped elsewhere.
    Unknown,
}

#[derive(Clone, Default)]
pub struct Reaper {
    waiters: Rc<RefCell<HashMap<i32, oneshot::Sender<Exit>>>>,
}

impl Reaper {
    /// Starts the reaping task on the current (single-threaded) runtime.
    pub fn start() -> std::io::Result<Self> {
        let reaper = Self::default();
        let mut signals = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let task = reaper.clone();
        tokio::task::spawn_local(async move {
            loop {
                task.reap_all();
                if signals.recv().await.is_none() {
                    break;
                }
            }
        });
        Ok(reaper)
    }

    /// Registers interest in `pid`'s exit. Call right after spawning, before any await.
    pub(crate) fn watch(&self, pid: i32) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().insert(pid, tx);
        rx
    }

    fn reap_all(&self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.deliver(pid.as_raw(), Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    self.deliver(pid.as_raw(), Exit::Signal(signal as i32));
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    fn deliver(&self, pid: i32, exit: Exit) {
        if let Some(tx) = self.waiters.borrow_mut().remove(&pid) {
            let _ = tx.send(exit);
        }
    }
}
