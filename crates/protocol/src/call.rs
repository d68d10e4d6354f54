//! How each request names its reply: the [`Call`] trait, the [`Request`] every request travels
//! as, and the `call!` macro the request modules bind each request type with, to its variant, its
//! reply and the largest answer the engine will buffer for it (small unless the request says).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::frame::MAX_FRAME;
use crate::{
    Adopt, Attach, ConnectPort, CreateContext, Delete, DeleteContext, ExecSpec, HandOverEgress,
    Input, JobStatus, KillAll, KillJob, ListContexts, ListDir, ListJobs, ListTrees, MakePipes,
    Move, Ping, ReadFile, RunCodeSpec, Screenshot, StartDesktop, StartJob, Stat, Unwatch, WatchDir,
    WatchEvents, WriteFile, ZipDir,
};

/// Largest answer to a request whose answer is small (everything but file contents, zips,
/// listings and command output): the engine never buffers more than this of it.
pub(crate) const SMALL_REPLY: usize = 256 * 1024;

/// Room for command output in one frame: capped text is at most a few tens of KiB, but JSON
/// escapes a control byte as six characters.
pub(crate) const OUTPUT_REPLY: usize = 2 * 1024 * 1024;

/// A request to the agent, and what it answers.
pub trait Call: Into<Request> {
    type Reply: Serialize + DeserializeOwned;

    /// The largest frame the engine accepts in answer. The agent runs inside the sandbox:
    /// whatever it sends is bounded by what the request can produce before the engine buffers it.
    fn reply_limit(&self) -> usize {
        SMALL_REPLY
    }

    /// Adds variables a command starts with ahead of its own (a sandbox's bound secrets'
    /// stand-ins); requests that start no command ignore them.
    fn add_env(&mut self, _env: &[(String, String)]) {}
}

/// Puts `env` ahead of `into` (a variable the request sets itself wins).
pub(crate) fn prepend(into: &mut Vec<(String, String)>, env: &[(String, String)]) {
    let mut all = env.to_vec();
    all.append(into);
    *into = all;
}

/// Every request, as it travels (tagged by `op`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping(Ping),
    Exec(ExecSpec),
    ReadFile(ReadFile),
    WriteFile(WriteFile),
    ListDir(ListDir),
    Stat(Stat),
    Delete(Delete),
    Move(Move),
    ZipDir(ZipDir),
    KillAll(KillAll),
    RunCode(RunCodeSpec),
    CreateContext(CreateContext),
    ListContexts(ListContexts),
    DeleteContext(DeleteContext),
    StartJob(StartJob),
    JobStatus(JobStatus),
    KillJob(KillJob),
    ListJobs(ListJobs),
    HandOverEgress(HandOverEgress),
    ConnectPort(ConnectPort),
    StartDesktop(StartDesktop),
    Screenshot(Screenshot),
    Input(Input),
    Attach(Attach),
    ListTrees(ListTrees),
    MakePipes(MakePipes),
    Adopt(Adopt),
    WatchDir(WatchDir),
    WatchEvents(WatchEvents),
    Unwatch(Unwatch),
}

/// Binds a request type to its variant of [`Request`] and to its reply.
macro_rules! call {
    ($variant:ident($request:ident) => $reply:ty) => {
        call!($variant($request) => $reply, limit: $crate::call::small);
    };
    // With `env`: a request that starts a command with an environment of its own.
    ($variant:ident($request:ident) => $reply:ty, limit: $limit:expr $(, $env:ident)?) => {
        impl From<$request> for $crate::Request {
            fn from(r: $request) -> Self {
                $crate::Request::$variant(r)
            }
        }
        impl $crate::Call for $request {
            type Reply = $reply;
            #[allow(clippy::redundant_closure_call)]
            fn reply_limit(&self) -> usize {
                ($limit)(self)
            }
            $(call!(@$env);)?
        }
    };
    (@env) => {
        fn add_env(&mut self, env: &[(String, String)]) {
            $crate::call::prepend(&mut self.env, env);
        }
    };
}

pub(crate) fn small<T>(_: &T) -> usize {
    SMALL_REPLY
}

/// Room for `bytes` sent base64-encoded, plus the rest of the frame.
pub(crate) fn encoded(bytes: u64) -> usize {
    ((bytes as usize).saturating_mul(4) / 3 + SMALL_REPLY).min(MAX_FRAME)
}
