//! The agent client: every request to a sandbox's agent goes through here — resuming or
//! restarting the sandbox first, bounding the exchange by a deadline, and telling an agent that
//! crashed (restarted on the next call, never trusted again) from one the engine stopped on
//! purpose (a restore, a merge, a kill) and from one that is slow.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::Stream;
use sandbox_mcp_model::driver::{AgentConn, DriverError, Liveness};
use sandbox_mcp_model::ids;
use sandbox_mcp_protocol::{
    AgentError, Attach, Attached, Call, ExchangeError, ExecSpec, Frame, JobInfo, KillAll,
    ListContexts, ListJobs, Ping, encode_frame, exchange_frame, read_frame_limited, send_frame,
};
use sandbox_mcp_sys::lock;
use serde::de::DeserializeOwned;

use super::lifecycle::Lifecycle;
use super::registry::{Entry, InFlight, Registry};
use super::secrets::bound_env;
use super::{AGENT_TIMEOUT, Event, ExecResult};
use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::state::Status;

/// One exchange with an agent on `conn` (see [`sandbox_mcp_protocol::exchange`]), its
/// broken connection or protocol as the driver's error.
pub(crate) async fn exchange<C: Call>(
    conn: &mut AgentConn,
    call: C,
) -> Result<Result<C::Reply, AgentError>, DriverError> {
    sandbox_mcp_protocol::exchange(conn, call)
        .await
        .map_err(|e| DriverError::Agent(e.to_string()))
}

/// A process attached to its caller (see [`sandbox_mcp_protocol::Chunk`]): the agent's
/// connection, which carries its stdio from here on. While it is held, the sandbox is in use
/// (it is not paused for idling).
pub struct Attachment {
    pub conn: AgentConn,
    pub attached: Attached,
    _inflight: InFlight,
}

pub struct AgentClient {
    driver: DriverHandle,
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
    /// Slack over a command's own timeout (the engine's `exec_grace`).
    exec_grace: Duration,
}

impl AgentClient {
    pub(crate) fn new(
        driver: DriverHandle,
        registry: Arc<Registry>,
        lifecycle: Arc<Lifecycle>,
        exec_grace: Duration,
    ) -> Self {
        Self {
            driver,
            registry,
            lifecycle,
            exec_grace,
        }
    }

    /// How long the engine waits for the agent's answer to a command (or code) that may run
    /// `timeout_ms`: that, and the grace the agent has to report it.
    pub fn exec_deadline(&self, timeout_ms: u64) -> Duration {
        Duration::from_millis(timeout_ms) + self.exec_grace
    }

    /// Sends `call` to the sandbox's agent (resuming or restarting the sandbox first) and returns
    /// its reply; output frames are skipped. `deadline` bounds the whole exchange.
    pub async fn call<C: Call>(
        &self,
        id: &str,
        tenant: Option<&str>,
        call: C,
        deadline: Duration,
    ) -> Result<C::Reply, EngineError> {
        let (entry, _inflight, mut conn) = self.agent_conn(id, tenant).await?;
        let request = Encoded::new(&entry, call)?;
        let answer = self.deliver(id, &entry, &mut conn, &request);
        match tokio::time::timeout(deadline, answer).await {
            Ok(answer) => answer,
            Err(_) => Err(self.timed_out(id, &entry, deadline).await),
        }
    }

    /// Sends `request` on `conn` and reads the answer. An agent that never took the request
    /// (its connection reset unread: the moment an agent dies) is treated as one that refused
    /// the connection — the sandbox is repaired and the request goes, once more, to its new
    /// agent — so a caller never sees the crash. Any other failure is the caller's error, said
    /// as what happened ([`Self::interrupted`]).
    async fn deliver<R: DeserializeOwned>(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        conn: &mut AgentConn,
        request: &Encoded,
    ) -> Result<R, EngineError> {
        let since = entry.interruptions.load(Ordering::Acquire);
        let mut answer = exchange_frame(conn, &request.frame, request.limit).await;
        if let Err(e) = &answer
            && self.resendable(id, entry, e, since)
        {
            *conn = self.revive(id, entry).await?;
            answer = exchange_frame(conn, &request.frame, request.limit).await;
        }
        match answer {
            Ok(reply) => reply.map_err(EngineError::from),
            Err(e) => Err(self
                .interrupted(id, entry, since)
                .await
                .unwrap_or_else(|| DriverError::Agent(e.to_string()).into())),
        }
    }

    /// Whether a request that failed with `e` goes again to a new agent: the agent never took
    /// it, and no deliberate stop of the sandbox's processes (a restore, a merge, a kill) came
    /// since `since` — that is the caller's to hear of.
    fn resendable(&self, id: &str, entry: &Entry, e: &ExchangeError, since: u64) -> bool {
        let resend = e.not_taken() && entry.interruptions.load(Ordering::Acquire) == since;
        if resend {
            tracing::debug!(sandbox = %id, "the agent did not take a request ({e}); sending it to a new one");
        }
        resend
    }

    /// Sends `call` and returns the agent's output as it arrives, ending with the reply.
    /// Dropping the stream closes the connection, which the agent takes as a cancellation.
    pub async fn stream<C: Call>(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
        call: C,
        deadline: Duration,
    ) -> Result<
        impl Stream<Item = Result<Event<C::Reply>, EngineError>> + Send + 'static,
        EngineError,
    >
    where
        C::Reply: Send + 'static,
    {
        let (entry, inflight, mut conn) = self.agent_conn(id, tenant).await?;
        let request = Encoded::new(&entry, call)?;
        let until = tokio::time::Instant::now() + deadline;
        let since = entry.interruptions.load(Ordering::Acquire);
        let sent = send_frame(&mut conn, &request.frame).await;
        let mut streaming = Streaming {
            conn,
            _inflight: inflight,
            entry,
            client: self.clone(),
            id: id.to_string(),
            limit: request.limit,
            until,
            deadline,
            since,
            resend: Some(request),
            answered: false,
        };
        if let Err(e) = sent {
            streaming.resend_after(e).await?;
        }
        Ok(futures::stream::unfold(Some(streaming), |s| async move {
            s?.next().await
        }))
    }

    /// Starts `spec` attached to the returned connection (resuming or restarting the sandbox
    /// first).
    pub async fn attach(
        &self,
        id: &str,
        tenant: Option<&str>,
        spec: Attach,
    ) -> Result<Attachment, EngineError> {
        let (entry, inflight, mut conn) = self.agent_conn(id, tenant).await?;
        let request = Encoded::new(&entry, spec)?;
        let attached = self.deliver(id, &entry, &mut conn, &request);
        match tokio::time::timeout(AGENT_TIMEOUT, attached).await {
            Ok(attached) => Ok(Attachment {
                conn,
                attached: attached?,
                _inflight: inflight,
            }),
            Err(_) => Err(self.timed_out(id, &entry, AGENT_TIMEOUT).await),
        }
    }

    /// Runs a command to completion; on an OOM kill, the sandbox's other processes go too (v1
    /// cgroups have no oom.group), so it never limps on half-dead.
    pub async fn exec(
        &self,
        id: &str,
        tenant: Option<&str>,
        spec: ExecSpec,
    ) -> Result<ExecResult, EngineError> {
        let before = self.oom_mark(id);
        let deadline = self.exec_deadline(spec.timeout_ms);
        let outcome = self.call(id, tenant, spec, deadline).await?;
        let oom_killed = self.settle_oom(id, tenant, before).await;
        Ok(ExecResult {
            outcome,
            oom_killed,
        })
    }

    /// Oom kills counted so far, to tell whether a command ran out of memory.
    pub fn oom_mark(&self, id: &str) -> u64 {
        self.driver.oom_kills_now(id)
    }

    /// After a command finished: whether the sandbox ran out of memory since `before`; if so,
    /// its remaining processes are killed (v1 cgroups have no oom.group).
    pub async fn settle_oom(&self, id: &str, tenant: Option<&str>, before: u64) -> bool {
        let oom = self.oom_mark(id) > before;
        if oom {
            let _ = self.call(id, tenant, KillAll {}, AGENT_TIMEOUT).await;
        }
        oom
    }

    /// Background jobs of a running sandbox (a paused one is not woken up to list them).
    pub async fn jobs(&self, id: &str, tenant: Option<&str>) -> Option<Vec<JobInfo>> {
        let entry = self.registry.lookup(id, tenant).await.ok()?;
        // Asked directly: looking at a sandbox is not activity, and must not keep it from
        // being paused when idle.
        let list = self.ask_running(id, &entry, ListJobs {}).await?;
        Some(list.jobs)
    }

    /// [`Self::jobs`] for a description, which may skip the trip to the agent: an answer of no
    /// jobs stands for up to [`NO_JOBS_REUSE_MS`] while no call of the engine has started or
    /// ended in the sandbox since it was asked (none is under way). Every job is started by
    /// such a call (a command in the background, an attached process), so one started through
    /// the engine is listed by the next description; jobs a snapshot restore brings back are
    /// listed within a second. A description of a quiet sandbox in a loop then costs its agent
    /// one connection a second, not one per call.
    pub async fn described_jobs(&self, id: &str, tenant: Option<&str>) -> Option<Vec<JobInfo>> {
        let entry = self.registry.lookup(id, tenant).await.ok()?;
        if *lock(&entry.visible_status) != Status::Running {
            return None;
        }
        let untouched_since = |at: i64| entry.quiet_since().is_some_and(|active| active < at);
        let now = ids::now_ms();
        let seen = entry.no_jobs_at.load(Ordering::Acquire);
        if (0..NO_JOBS_REUSE_MS).contains(&now.saturating_sub(seen)) && untouched_since(seen) {
            return Some(Vec::new());
        }
        let quiet = untouched_since(now);
        let list = self.ask_running(id, &entry, ListJobs {}).await?;
        if quiet && list.jobs.is_empty() {
            entry.no_jobs_at.store(now, Ordering::Release);
        }
        Some(list.jobs)
    }

    /// REPL contexts alive in a running sandbox (0 when it is not running).
    pub(crate) async fn context_count(&self, id: &str, entry: &Entry) -> u64 {
        self.ask_running(id, entry, ListContexts {})
            .await
            .map_or(0, |list| list.contexts.len() as u64)
    }

    /// What a running sandbox's agent keeps that a restart would lose, asked once.
    pub(crate) async fn keeps(&self, id: &str, entry: &Entry) -> Keeps {
        let jobs = self.ask_running(id, entry, ListJobs {}).await;
        let contexts = self.ask_running(id, entry, ListContexts {}).await;
        let (Some(jobs), Some(contexts)) = (jobs, contexts) else {
            return Keeps::Unknown;
        };
        if jobs.jobs.is_empty() && contexts.contexts.is_empty() {
            Keeps::Nothing
        } else if jobs
            .jobs
            .iter()
            .all(|j| j.status == sandbox_mcp_protocol::JobState::Running)
        {
            Keeps::Running
        } else {
            Keeps::Finished
        }
    }

    /// `call`'s answer from a running sandbox's agent, asked directly and briefly (not resumed,
    /// not counted as activity); `None` when it is not running or does not answer.
    async fn ask_running<C: Call>(&self, id: &str, entry: &Entry, call: C) -> Option<C::Reply> {
        if *lock(&entry.visible_status) != Status::Running {
            return None;
        }
        let mut conn = self.driver.connect(id).await.ok()?;
        match tokio::time::timeout(Duration::from_secs(5), exchange(&mut conn, call)).await {
            Ok(Ok(Ok(reply))) => Some(reply),
            _ => None,
        }
    }

    /// A connection to the sandbox's agent, resuming or restarting the sandbox as needed.
    async fn agent_conn(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<(Arc<Entry>, InFlight, AgentConn), EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        let inflight = InFlight::new(entry.clone());
        self.lifecycle.ensure_running(id, &entry).await?;
        // Nothing has been sent if the agent cannot be reached: when it turns out to be dead
        // (crashed, OOM-killed), restart it and go on, so the caller never sees the crash.
        let conn = match self.driver.connect(id).await {
            Ok(conn) => conn,
            Err(DriverError::Gone(why)) => {
                self.registry.forget(id, Some(why.clone())).await;
                return Err(EngineError::Gone(why));
            }
            Err(_) => self.revive(id, &entry).await?,
        };
        Ok((entry, inflight, conn))
    }

    /// A connection to a new agent, after the sandbox's would not take one: a dead agent is
    /// noted ([`Self::note_agent_failure`]) and the sandbox restarted on its files.
    async fn revive(&self, id: &str, entry: &Arc<Entry>) -> Result<AgentConn, EngineError> {
        self.note_agent_failure(id, entry).await;
        self.lifecycle.ensure_running(id, entry).await?;
        Ok(self.driver.connect(id).await?)
    }

    /// After the agent hung up on a call: the error to give when the engine stopped the
    /// sandbox's processes on purpose since the call began (`since`); `None` for a real agent
    /// failure, which is noted (see [`Self::note_agent_failure`]).
    async fn interrupted(&self, id: &str, entry: &Arc<Entry>, since: u64) -> Option<EngineError> {
        if entry.interruptions.load(Ordering::Acquire) == since {
            self.note_agent_failure(id, entry).await;
            // Its pod went while the call ran: say so rather than how the connection broke.
            return self
                .registry
                .gone_reason(id, None)
                .filter(|_| !self.registry.contains(id))
                .map(EngineError::Gone);
        }
        Some(if !entry.killing.load(Ordering::Acquire) {
            EngineError::Conflict(format!(
                "sandbox {id}'s files were replaced (a snapshot restore or a merge) while this call ran, which stopped its processes; run it again"
            ))
        } else {
            EngineError::NotFound(format!("sandbox {id} was killed while this call ran"))
        })
    }

    /// After an agent failure (it hung up, or broke the protocol): an agent that is gone, or that
    /// no longer answers a ping as it should, is not trusted again — its processes are stopped and
    /// the next call starts a fresh one on the sandbox's files.
    async fn note_agent_failure(&self, id: &str, entry: &Arc<Entry>) {
        let liveness = self.driver.liveness(id).await;
        if liveness == Liveness::Gone {
            self.registry.forget(id, None).await;
            return;
        }
        if liveness == Liveness::Stopped || !self.ping(id).await {
            self.lifecycle.stop_agent(id, entry).await;
        }
    }

    /// The error for a call the agent did not answer in time. The agent is asked once more, with
    /// a ping: one that cannot answer that is wedged and is not trusted again — the sandbox's
    /// processes are stopped, and the next call starts a fresh agent on its files.
    async fn timed_out(&self, id: &str, entry: &Arc<Entry>, deadline: Duration) -> EngineError {
        if self.ping(id).await {
            return EngineError::Timeout(format!(
                "the sandbox did not answer within {} s",
                deadline.as_secs()
            ));
        }
        tracing::warn!(sandbox = %id, "the agent stopped answering; stopping the sandbox");
        self.lifecycle.stop_agent(id, entry).await;
        EngineError::Sandbox(format!(
            "the sandbox's agent stopped answering (no reply within {} s, none to a ping either), so the sandbox's processes were stopped; its files are kept and the next call restarts it",
            deadline.as_secs()
        ))
    }

    /// Whether the agent answers a ping within two seconds.
    async fn ping(&self, id: &str) -> bool {
        let ping = async {
            let mut conn = self.driver.connect(id).await.ok()?;
            exchange(&mut conn, Ping {}).await.ok()?.ok()
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), ping).await,
            Ok(Some(_))
        )
    }
}

/// A streamed call under way ([`AgentClient::stream`]).
struct Streaming {
    conn: AgentConn,
    /// The sandbox is in use while its output streams.
    _inflight: InFlight,
    entry: Arc<Entry>,
    client: Arc<AgentClient>,
    id: String,
    /// The most a frame of the answer may hold.
    limit: usize,
    /// When the answer must be complete, `deadline` after the call.
    until: tokio::time::Instant,
    deadline: Duration,
    /// The sandbox's `interruptions` when the call began.
    since: u64,
    /// The request, while it may go again to a new agent: until any answer, once.
    resend: Option<Encoded>,
    /// Whether any of the answer came.
    answered: bool,
}

impl Streaming {
    /// The next event of the answer, and what is left of the call (`None` once it ended).
    async fn next<R: DeserializeOwned>(
        mut self,
    ) -> Option<(Result<Event<R>, EngineError>, Option<Self>)> {
        loop {
            let read = read_frame_limited::<_, Frame<R>>(&mut self.conn, self.limit);
            let error = match tokio::time::timeout_at(self.until, read).await {
                Ok(Ok(Some(Frame::Output(output)))) => {
                    (self.answered, self.resend) = (true, None);
                    return Some((Ok(Event::Output(output)), Some(self)));
                }
                Ok(Ok(Some(Frame::Reply(reply)))) => return Some((Ok(Event::Reply(reply)), None)),
                Ok(Ok(Some(Frame::Error(e)))) => return Some((Err(e.into()), None)),
                Ok(Ok(None)) => ExchangeError::Closed,
                Ok(Err(e)) => ExchangeError::reading(e, self.answered),
                Err(_) => {
                    let (id, entry) = (&self.id, &self.entry);
                    let error = self.client.timed_out(id, entry, self.deadline).await;
                    return Some((Err(error), None));
                }
            };
            if let Err(why) = self.resend_after(error).await {
                return Some((Err(why), None));
            }
        }
    }

    /// After the answer failed with `error`: the request sent again to a new agent, if the
    /// agent never took it ([`AgentClient::deliver`]), or the caller's error.
    async fn resend_after(&mut self, error: ExchangeError) -> Result<(), EngineError> {
        let (client, id, entry) = (&self.client, self.id.as_str(), &self.entry);
        let request = self.resend.take();
        let Some(request) = request.filter(|_| client.resendable(id, entry, &error, self.since))
        else {
            let why = client.interrupted(id, entry, self.since).await;
            return Err(why.unwrap_or_else(|| DriverError::Agent(error.to_string()).into()));
        };
        self.conn = client.revive(id, entry).await?;
        send_frame(&mut self.conn, &request.frame)
            .await
            .map_err(|e| DriverError::Agent(e.to_string()).into())
    }
}

/// A request to an agent, encoded once (it may be sent twice: [`AgentClient::deliver`]).
struct Encoded {
    frame: Vec<u8>,
    /// The most a frame of its answer may hold.
    limit: usize,
}

impl Encoded {
    /// `call` for the sandbox of `entry`, with its bound secrets' environment.
    fn new<C: Call>(entry: &Entry, mut call: C) -> Result<Self, EngineError> {
        call.add_env(&bound_env(entry));
        let limit = call.reply_limit();
        let frame = encode_frame(&call.into())
            .map_err(|e| DriverError::Agent(format!("cannot send the request: {e}")))?;
        Ok(Self { frame, limit })
    }
}

/// How long (ms) an agent's answer of no jobs stands for a quiet sandbox's description
/// ([`AgentClient::described_jobs`]).
const NO_JOBS_REUSE_MS: i64 = 1000;

/// What a running sandbox's agent keeps ([`AgentClient::keeps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keeps {
    /// No job and no REPL context: a restart loses nothing.
    Nothing,
    /// Running jobs and REPL contexts only: their processes are all there is to carry.
    Running,
    /// A finished job, whose output and exit only the agent holds.
    Finished,
    /// The agent did not answer (or the sandbox is not running).
    Unknown,
}
