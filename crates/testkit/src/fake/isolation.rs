//! The fake's isolation: slots from a set, agents as incarnations of a task served over
//! in-memory pipes, liveness and freezing as flags those connections watch.

use std::future::Future;
use std::pin::Pin;

use sandbox_mcp_model::driver::{AgentConn, DriverError, Isolation, Liveness, StartSpec, Usage};
use tokio::sync::watch;

use super::{AgentContext, Condition, FakeDriver, Incarnation, agent, lock};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Bytes the in-memory pipe to an agent buffers each way (a frame larger than this is written
/// as the other side reads, as on a socket).
const PIPE_BYTES: usize = 256 * 1024;

/// Slots the fake hands out: as many as a host's uid ranges would be.
const SLOTS: u32 = 4096;

impl Isolation for FakeDriver {
    fn claim_slots(&self, taken: &[u32], count: usize) -> Result<Vec<u32>, DriverError> {
        let mut state = lock(&self.inner.state);
        let free: Vec<u32> = (0..SLOTS)
            .filter(|s| !taken.contains(s) && !state.slots.contains(s))
            .take(count)
            .collect();
        if free.len() < count {
            return Err(DriverError::Exhausted(format!(
                "the fake driver has {} of {count} slots free",
                free.len()
            )));
        }
        state.slots.extend(free.iter().copied());
        Ok(free)
    }

    fn release_slot(&self, slot: u32) {
        lock(&self.inner.state).slots.remove(&slot);
    }

    fn reconcile_slots(&self, held: &[u32]) {
        lock(&self.inner.state).slots = held.iter().copied().collect();
    }

    fn close(&self) {}

    fn start<'a>(&'a self, spec: &'a StartSpec) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let dir = self.inner.sandbox_dir(&spec.id);
            let (fail, stall) = {
                let mut state = lock(&self.inner.state);
                if let Some(why) = state.sandboxes.get(&spec.id).and_then(|s| s.gone.clone()) {
                    return Err(DriverError::Gone(why));
                }
                let fail = take_one(&mut state.fail_starts);
                let stall = !fail && take_one(&mut state.stall_starts);
                (fail, stall)
            };
            // The sandbox's storage, if it has none yet (a fork's child has its copy already).
            std::fs::create_dir_all(dir.join("root"))
                .map_err(DriverError::io("make the sandbox's directory"))?;
            if fail {
                return Err(DriverError::Launch(format!(
                    "the fake driver was told to fail starting sandbox {}",
                    spec.id
                )));
            }
            if stall {
                std::future::pending::<()>().await;
            }
            let mut state = lock(&self.inner.state);
            state.generations += 1;
            let generation = state.generations;
            let sandbox = state.sandboxes.entry(spec.id.clone()).or_default();
            sandbox.kill_agent();
            sandbox.starts += 1;
            sandbox.env = spec.env.clone();
            sandbox.workdir = spec.workdir.clone();
            sandbox.agent = Some(Incarnation {
                generation,
                condition: watch::Sender::new(Condition::default()),
            });
            Ok(())
        })
    }

    fn connect<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<AgentConn, DriverError>> {
        Box::pin(async move {
            let context = {
                let state = lock(&self.inner.state);
                let sandbox = state.sandboxes.get(id);
                if let Some(why) = sandbox.and_then(|s| s.gone.clone()) {
                    return Err(DriverError::Gone(why));
                }
                let Some((sandbox, agent)) = sandbox.and_then(|s| Some((s, s.agent.as_ref()?)))
                else {
                    return Err(DriverError::Agent(format!(
                        "cannot reach sandbox {id}'s agent: connection refused (it is not running)"
                    )));
                };
                AgentContext {
                    inner: self.inner.clone(),
                    id: id.to_string(),
                    generation: agent.generation,
                    files: self.inner.sandbox_dir(id),
                    env: sandbox.env.clone(),
                    workdir: sandbox.workdir.clone().unwrap_or_else(|| "/root".into()),
                    condition: agent.condition.subscribe(),
                }
            };
            let (engine_end, agent_end) = tokio::io::duplex(PIPE_BYTES);
            tokio::spawn(agent::serve(context, agent_end));
            Ok(Box::new(engine_end) as AgentConn)
        })
    }

    fn liveness<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Liveness> {
        Box::pin(async move {
            let state = lock(&self.inner.state);
            match state.sandboxes.get(id) {
                Some(s) if s.gone.is_some() => Liveness::Gone,
                Some(s) => match &s.agent {
                    Some(agent) if agent.condition.borrow().frozen => Liveness::Frozen,
                    Some(_) => Liveness::Running,
                    None => Liveness::Stopped,
                },
                // Known to no fake yet: stopped if its files are there (a host after a reboot).
                None if self.inner.sandbox_dir(id).is_dir() => Liveness::Stopped,
                None => Liveness::Gone,
            }
        })
    }

    fn freeze(&self, id: &str) -> Result<(), DriverError> {
        self.set_frozen(id, true)
    }

    fn thaw(&self, id: &str) -> Result<(), DriverError> {
        self.set_frozen(id, false)
    }

    fn stop(&self, id: &str) -> Result<(), DriverError> {
        if let Some(s) = lock(&self.inner.state).sandboxes.get_mut(id) {
            s.kill_agent();
        }
        Ok(())
    }

    fn destroy(&self, id: &str) -> Result<(), DriverError> {
        if let Some(mut s) = lock(&self.inner.state).sandboxes.remove(id) {
            s.kill_agent();
        }
        match std::fs::remove_dir_all(self.inner.sandbox_dir(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(DriverError::io("remove the sandbox's directory")(e))
            }
            _ => Ok(()),
        }
    }

    fn usage(&self, id: &str) -> Usage {
        let state = lock(&self.inner.state);
        let Some(s) = state.sandboxes.get(id) else {
            return Usage::default();
        };
        Usage {
            pids: u64::from(s.agent.is_some()),
            oom_kills: s.oom_kills,
            ..Usage::default()
        }
    }
}

impl FakeDriver {
    fn set_frozen(&self, id: &str, frozen: bool) -> Result<(), DriverError> {
        let state = lock(&self.inner.state);
        match state.sandboxes.get(id) {
            Some(s) if s.gone.is_some() => Err(DriverError::Gone(format!("sandbox {id} is gone"))),
            Some(s) => {
                if let Some(agent) = &s.agent {
                    agent.condition.send_modify(|c| c.frozen = frozen);
                }
                Ok(())
            }
            // Nothing runs: nothing to freeze or thaw.
            None => Ok(()),
        }
    }
}

/// Uses up one of `count`, if any is left.
fn take_one(count: &mut usize) -> bool {
    if *count == 0 {
        return false;
    }
    *count -= 1;
    true
}
