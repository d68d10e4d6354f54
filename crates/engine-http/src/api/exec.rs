//! Commands: run one to completion (or start it as a background job), or stream its output.

use std::time::Duration;

use super::convert::Api;
use super::ndjson;
use super::request::{AppState, check_env};
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::{Caller, Ndjson};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{EXEC_OUTPUT_CAP, ExecResult};
use sandbox_mcp_protocol::{ExecSpec, StartJob};

/// Longest `timeout_ms` of a command.
const MAX_TIMEOUT_MS: u64 = limits::exec_request::TIMEOUT_MS_MAXIMUM;

/// Checks an exec request; the command, cwd and environment for the agent.
fn exec_spec(body: &types::ExecRequest, stream: bool) -> Result<ExecSpec, EngineError> {
    let timeout_ms = body.timeout_ms.get();
    if timeout_ms > MAX_TIMEOUT_MS {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_ms is {timeout_ms}; the maximum is {MAX_TIMEOUT_MS} (10 minutes). For longer work, set background and poll the job."
        )));
    }
    let env = match &body.env {
        Some(e) => check_env(e)?,
        None => Vec::new(),
    };
    Ok(ExecSpec {
        command: body.command.to_string(),
        cwd: body.cwd.as_ref().map(|c| c.to_string()),
        env,
        timeout_ms,
        max_output_bytes: EXEC_OUTPUT_CAP,
        stream,
    })
}

/// Starts a background job: the answer is immediate, with its id.
async fn start_job(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
    spec: ExecSpec,
) -> Result<types::ExecResult, EngineError> {
    let start = StartJob {
        command: spec.command,
        cwd: spec.cwd,
        env: spec.env,
    };
    let job = state
        .manager
        .agent
        .call(id, tenant, start, Duration::from_secs(60))
        .await?;
    let mut r: types::ExecResult = Api::api(ExecResult {
        outcome: Default::default(),
        oom_killed: false,
    });
    r.oom_killed = None;
    r.job_id = Some(job.job_id);
    Ok(r)
}

pub(super) async fn exec_command(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::ExecRequest,
) -> Result<types::ExecResult, EngineError> {
    let id: &str = &id;
    let spec = exec_spec(&body, false)?;
    if body.background {
        return start_job(state, id, caller.tenant(), spec).await;
    }
    let result = state.manager.agent.exec(id, caller.tenant(), spec).await?;
    Ok(result.api())
}

pub(super) async fn exec_command_stream(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::ExecRequest,
) -> Result<Ndjson, EngineError> {
    let id = id.to_string();
    let spec = exec_spec(&body, true)?;
    if body.background {
        // Nothing to stream: the job starts and the answer is immediate.
        let job = start_job(state, &id, caller.tenant(), spec).await?;
        return Ok(ndjson::result_only(
            serde_json::to_value(job).map_err(|e| EngineError::Response(e.into()))?,
        ));
    }
    let deadline = state.manager.agent.exec_deadline(spec.timeout_ms);
    let before = state.manager.agent.oom_mark(&id);
    let events = state
        .manager
        .agent
        .stream(&id, caller.tenant(), spec, deadline)
        .await?;
    let manager = state.manager.clone();
    let tenant = caller.into_tenant();
    Ok(ndjson::events(events, move |outcome| {
        let (manager, id, tenant) = (manager.clone(), id.clone(), tenant.clone());
        async move {
            let oom_killed = manager
                .agent
                .settle_oom(&id, tenant.as_deref(), before)
                .await;
            let result: types::ExecResult = Api::api(ExecResult {
                outcome,
                oom_killed,
            });
            serde_json::to_value(result).map_err(|e| EngineError::Response(e.into()))
        }
    }))
}
