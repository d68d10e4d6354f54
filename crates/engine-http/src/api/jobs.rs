//! Background jobs: page through one's output, or stop it.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;

use super::convert::TryApi;
use super::request::{ApiQuery, AppState, Tenant, sandbox_id};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::JOB_PAGE;
use sandbox_mcp_protocol::{JobStatus, KillJob};

const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
pub(super) struct JobQuery {
    #[serde(default)]
    since_offset: u64,
}

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
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, job)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<JobQuery>,
) -> Result<Json<types::JobStatus>, EngineError> {
    let status = JobStatus {
        job_id: job_id(&job)?,
        since_offset: q.since_offset,
        max_bytes: JOB_PAGE,
    };
    let job = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), status, DEADLINE)
        .await?;
    Ok(Json(job.try_api()?))
}

pub(super) async fn kill(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, job)): Path<(String, String)>,
) -> Result<Json<types::JobStatus>, EngineError> {
    let kill = KillJob {
        job_id: job_id(&job)?,
    };
    let job = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), kill, DEADLINE)
        .await?;
    Ok(Json(job.try_api()?))
}
