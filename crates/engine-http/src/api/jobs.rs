//! Background jobs: page through one's output, or stop it.

use std::time::Duration;

use super::convert::TryApi;
use super::request::AppState;
use sandbox_mcp_api::server::{self, Caller};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::JOB_PAGE;
use sandbox_mcp_protocol::{JobStatus, KillJob};

const DEADLINE: Duration = Duration::from_secs(30);

/// A path's job id; a malformed one is simply not found.
fn job_id(raw: &str) -> Result<String, EngineError> {
    types::JobId::try_from(raw.to_string())
        .map(|j| j.to_string())
        .map_err(|_| {
            EngineError::NotFound(format!(
                "job {} does not exist; sandbox_info lists the sandbox's jobs",
                raw.chars().take(40).collect::<String>()
            ))
        })
}

pub(super) async fn get(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    job: String,
    q: server::GetJobQuery,
) -> Result<types::JobStatus, EngineError> {
    let status = JobStatus {
        job_id: job_id(&job)?,
        since_offset: q.since_offset,
        max_bytes: JOB_PAGE,
    };
    let job = state
        .manager
        .agent
        .call(&id, caller.tenant(), status, DEADLINE)
        .await?;
    job.try_api()
}

pub(super) async fn kill(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    job: String,
) -> Result<types::JobStatus, EngineError> {
    let kill = KillJob {
        job_id: job_id(&job)?,
    };
    let job = state
        .manager
        .agent
        .call(&id, caller.tenant(), kill, DEADLINE)
        .await?;
    job.try_api()
}
