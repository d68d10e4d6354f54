//! Live state: the process trees the agent started (code contexts, background jobs), as the
//! engine needs them to checkpoint them in one sandbox and bring them back in another (a fork
//! with memory). The engine dumps and restores the processes itself; the agent only says which
//! trees it has and which of its pipes each holds, then makes new pipes for a restored tree and
//! takes it over.

use serde::{Deserialize, Serialize};

use crate::code::Language;

/// Which process trees the agent started and still runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListTrees {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TreeList {
    pub trees: Vec<Tree>,
    /// Processes the agent runs that cannot be carried (an attached process, a desktop): what
    /// each is, for the caller.
    pub skipped: Vec<String>,
}

/// One process tree the agent started: its root's pid (in the sandbox) and the agent's pipes it
/// holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tree {
    pub kind: TreeKind,
    pub pid: i32,
    pub pipes: Vec<TreePipe>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TreeKind {
    Context {
        context_id: String,
        language: Language,
        cwd: String,
        created_at: i64,
        is_default: bool,
    },
    Job {
        job_id: String,
        command: String,
        started_at: i64,
        output_bytes: u64,
        dropped_bytes: u64,
        log_file: String,
    },
}

impl TreeKind {
    /// How the caller names it: `context python`, `job job_3`.
    pub fn describe(&self) -> String {
        match self {
            TreeKind::Context { context_id, .. } => format!("code context {context_id}"),
            TreeKind::Job { job_id, .. } => format!("job {job_id}"),
        }
    }
}

/// One of the agent's pipes a tree holds, by its inode (the same for both ends).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreePipe {
    pub inode: u64,
    pub role: PipeRole,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PipeRole {
    /// An interpreter's stdout, stderr, answers; a job's merged output: the process writes.
    Stdout,
    Stderr,
    Answers,
    Output,
    /// An interpreter's requests: the process reads.
    Requests,
}

impl PipeRole {
    /// Whether the process holds the pipe's read end (else its write end).
    pub fn process_reads(self) -> bool {
        self == PipeRole::Requests
    }
}

/// Makes one new pipe per role, keeps the agent's ends under `key`, and passes the process's
/// ends to the engine (one byte with SCM_RIGHTS ahead of the reply, in this order), for a
/// restore to give the restored tree.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MakePipes {
    pub key: String,
    pub roles: Vec<PipeRole>,
}

/// Takes over the restored tree `tree` (its root now `pid`) with the pipes kept under `key`;
/// `pid: None` discards them (the restore failed).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Adopt {
    pub key: String,
    pub tree: Tree,
    pub pid: Option<i32>,
}

call!(ListTrees(ListTrees) => TreeList);
call!(MakePipes(MakePipes) => crate::Done);
call!(Adopt(Adopt) => crate::Done);
