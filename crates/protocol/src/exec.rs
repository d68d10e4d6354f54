//! Running a command to its end: what to run, and what it printed (capped, with the full streams
//! kept in the sandbox when they were cut) and how it ended.

use serde::{Deserialize, Serialize};

use crate::call::OUTPUT_REPLY;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecSpec {
    pub command: String,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub timeout_ms: u64,
    /// Cap on each of stdout and stderr in the result, in bytes.
    pub max_output_bytes: u64,
    /// Send `Output` frames as output arrives.
    pub stream: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub truncated: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// Full copies of truncated streams, inside the sandbox.
    #[serde(default)]
    pub stdout_file: Option<String>,
    #[serde(default)]
    pub stderr_file: Option<String>,
}

call!(Exec(ExecSpec) => ExecOutcome, limit: |_: &ExecSpec| OUTPUT_REPLY, env);
