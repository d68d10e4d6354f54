//! Code in persistent interpreters: run a cell (or stream its output), and manage contexts.

use std::time::Duration;

use super::convert::{Api, TryApi};
use super::ndjson;
use super::request::AppState;
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::{Caller, Ndjson};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::EXEC_OUTPUT_CAP;
use sandbox_mcp_protocol::{CreateContext, DeleteContext, ListContexts, RunCodeSpec};

/// Longest `timeout_ms` of a cell.
const MAX_TIMEOUT_MS: u64 = limits::run_code_request::TIMEOUT_MS_MAXIMUM;
/// Deadline of the context operations.
const CONTEXT_DEADLINE: Duration = Duration::from_secs(30);

fn code_spec(body: types::RunCodeRequest, stream: bool) -> Result<RunCodeSpec, EngineError> {
    let timeout_ms = body.timeout_ms.get();
    if timeout_ms > MAX_TIMEOUT_MS {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_ms is {timeout_ms}; the maximum is {MAX_TIMEOUT_MS} (10 minutes)"
        )));
    }
    Ok(RunCodeSpec {
        code: body.code.to_string(),
        context_id: body.context_id.map(|c| c.to_string()),
        language: body.language.api(),
        timeout_ms,
        max_output_bytes: EXEC_OUTPUT_CAP,
        stream,
        env: Vec::new(),
    })
}

pub(super) async fn run_code(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::RunCodeRequest,
) -> Result<types::RunCodeResult, EngineError> {
    let spec = code_spec(body, false)?;
    let deadline = state.manager.agent.exec_deadline(spec.timeout_ms);
    let outcome = state
        .manager
        .agent
        .call(&id, caller.tenant(), spec, deadline)
        .await?;
    outcome.try_api()
}

pub(super) async fn run_code_stream(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::RunCodeRequest,
) -> Result<Ndjson, EngineError> {
    let spec = code_spec(body, true)?;
    let deadline = state.manager.agent.exec_deadline(spec.timeout_ms);
    let events = state
        .manager
        .agent
        .stream(&id, caller.tenant(), spec, deadline)
        .await?;
    Ok(ndjson::events(events, |outcome| async move {
        let result: types::RunCodeResult = outcome.try_api()?;
        serde_json::to_value(result).map_err(|e| EngineError::Response(e.into()))
    }))
}

pub(super) async fn list_contexts(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::CodeContextList, EngineError> {
    let list = state
        .manager
        .agent
        .call(&id, caller.tenant(), ListContexts {}, CONTEXT_DEADLINE)
        .await?;
    Ok(types::CodeContextList {
        contexts: list
            .contexts
            .into_iter()
            .map(TryApi::try_api)
            .collect::<Result<_, _>>()?,
    })
}

pub(super) async fn create_context(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::CreateContextRequest,
) -> Result<types::CodeContext, EngineError> {
    let create = CreateContext {
        language: body.language.api(),
        cwd: body.cwd.map(|c| c.to_string()),
        env: Vec::new(),
    };
    // Starting an interpreter can take a while on a cold cache.
    let context = state
        .manager
        .agent
        .call(&id, caller.tenant(), create, Duration::from_secs(60))
        .await?;
    context.try_api()
}

pub(super) async fn delete_context(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    context_id: String,
) -> Result<types::DeleteContextResult, EngineError> {
    let context = types::ContextId::try_from(context_id.clone()).map_err(|_| {
        EngineError::NotFound(format!(
            "code context {} does not exist; call sandbox_code_context_list to see the contexts",
            context_id.chars().take(40).collect::<String>()
        ))
    })?;
    let delete = DeleteContext {
        context_id: context.to_string(),
    };
    state
        .manager
        .agent
        .call(&id, caller.tenant(), delete, CONTEXT_DEADLINE)
        .await?;
    Ok(types::DeleteContextResult {
        context_id: context,
        deleted: true,
    })
}
