//! Commands run in the background: starting one, reading its output from an offset, killing it,
//! listing them.

use serde::{Deserialize, Serialize};

use crate::call::{OUTPUT_REPLY, SMALL_REPLY, small};
use crate::frame::MAX_FRAME;

/// Start a command in the background; answered at once with the job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartJob {
    pub command: String,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobStatus {
    pub job_id: String,
    pub since_offset: u64,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KillJob {
    pub job_id: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListJobs {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobList {
    pub jobs: Vec<JobInfo>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Running,
    Exited,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobInfo {
    pub job_id: String,
    pub command: String,
    pub status: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// Bytes the job has written (stdout and stderr, interleaved as written).
    pub output_bytes: u64,
    /// The job's output log inside the sandbox.
    pub log_file: String,
    /// Output from `offset` to `next_offset` (JobStatus only).
    pub output: Option<String>,
    pub offset: u64,
    pub next_offset: u64,
    /// Bytes before `offset` that were dropped from the log to keep it bounded.
    pub dropped_bytes: u64,
}

call!(StartJob(StartJob) => JobInfo, limit: small, env);
call!(JobStatus(JobStatus) => JobInfo, limit: |r: &JobStatus| {
    ((r.max_bytes as usize).saturating_mul(6) + SMALL_REPLY).min(MAX_FRAME)
});
call!(KillJob(KillJob) => JobInfo);
call!(ListJobs(ListJobs) => JobList, limit: |_: &ListJobs| OUTPUT_REPLY);
