//! One handler per operation of `openapi/sandbox-mcp.json`, on the types generated from it: the
//! request bodies are the client's own types (so both sides validate the same constraints), and
//! every response is built as the generated type the client will parse.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use axum::body::Body;
use axum::response::IntoResponse;
use futures::StreamExt;

use crate::agent::protocol::{
    CodeOutcome, ContextInfo, ExecOutcome, ExecSpec, FileKind, JobInfo, JobState, Language,
    Request, Response, RunCodeSpec,
};
use crate::client::types;
use crate::engine::error::EngineError;
use crate::engine::ids;
use crate::engine::manager::{
    CreateRequest, EXEC_GRACE, EXEC_OUTPUT_CAP, JOB_PAGE, LIST_LIMIT, READ_LIMIT, SandboxView,
    WRITE_LIMIT, ZIP_LIMIT, agent_error,
};
use crate::engine::server::{ApiJson, ApiJsonOrEmpty, AppState, Tenant};
use crate::engine::state::{Record, Status};

type ApiResult<T> = Result<Json<T>, EngineError>;

/// Longest environment variable name accepted.
const MAX_ENV_NAME: usize = 128;
/// Longest metadata key accepted.
const MAX_METADATA_KEY: usize = 64;
/// Most metadata pairs and environment variables (the spec's `maxProperties`).
const MAX_METADATA_PAIRS: usize = 32;
const MAX_ENV_VARS: usize = 64;

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("response does not fit the API: {e}"))
}

/// A path's sandbox id; a malformed one is simply not found (no oracle for id formats).
fn sandbox_id(raw: &str) -> Result<&str, EngineError> {
    if ids::is_sandbox_id(raw) {
        Ok(raw)
    } else {
        Err(EngineError::sandbox_not_found(
            raw.chars().take(64).collect::<String>().as_str(),
        ))
    }
}

fn status_type(s: Status) -> types::SandboxStatus {
    match s {
        Status::Running => types::SandboxStatus::Running,
        Status::Creating | Status::Paused | Status::Killing => types::SandboxStatus::Paused,
    }
}

fn shape_type(s: &crate::engine::driver::Shape) -> types::Shape {
    types::Shape {
        vcpus: s.vcpus,
        memory_mb: s.memory_mb,
        disk_mb: s.disk_mb,
        max_pids: s.max_pids,
    }
}

fn metadata_type(m: &BTreeMap<String, String>) -> Result<types::Metadata, EngineError> {
    if m.len() > MAX_METADATA_PAIRS {
        return Err(EngineError::InvalidArgument(format!(
            "metadata has {} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            m.len()
        )));
    }
    let mut out = BTreeMap::new();
    for (k, v) in m {
        out.insert(
            k.clone(),
            types::MetadataValue::try_from(v.clone()).map_err(internal)?,
        );
    }
    Ok(types::Metadata(out))
}

fn job_summary(j: &JobInfo) -> Result<types::JobSummary, EngineError> {
    Ok(types::JobSummary {
        job_id: types::JobId::try_from(j.job_id.clone()).map_err(internal)?,
        command: j.command.clone(),
        status: job_state(j.status),
        exit_code: j.exit_code,
        signal: j.signal,
        started_at: ids::rfc3339(j.started_at),
        finished_at: j.finished_at.map(ids::rfc3339),
        output_bytes: j.output_bytes,
        log_file: j.log_file.clone(),
    })
}

fn job_state(s: JobState) -> types::JobState {
    match s {
        JobState::Running => types::JobState::Running,
        JobState::Exited => types::JobState::Exited,
    }
}

fn job_status(j: JobInfo) -> Result<types::JobStatus, EngineError> {
    Ok(types::JobStatus {
        job_id: types::JobId::try_from(j.job_id.clone()).map_err(internal)?,
        status: job_state(j.status),
        exit_code: j.exit_code,
        signal: j.signal,
        started_at: ids::rfc3339(j.started_at),
        finished_at: j.finished_at.map(ids::rfc3339),
        output_bytes: j.output_bytes,
        log_file: j.log_file,
        has_more: j.next_offset < j.output_bytes,
        output: j.output.unwrap_or_default(),
        offset: j.offset,
        next_offset: j.next_offset,
        dropped_bytes: j.dropped_bytes,
        command: j.command,
    })
}

fn language_type(l: Language) -> types::Language {
    match l {
        Language::Python => types::Language::Python,
        Language::Node => types::Language::Node,
    }
}

fn language_of(l: types::Language) -> Language {
    match l {
        types::Language::Python => Language::Python,
        types::Language::Node => Language::Node,
    }
}

fn context_type(c: ContextInfo) -> Result<types::CodeContext, EngineError> {
    Ok(types::CodeContext {
        context_id: types::ContextId::try_from(c.context_id).map_err(internal)?,
        language: language_type(c.language),
        cwd: c.cwd,
        created_at: ids::rfc3339(c.created_at),
        alive: c.alive,
        is_default: c.is_default,
    })
}

fn code_result(o: CodeOutcome) -> Result<types::RunCodeResult, EngineError> {
    Ok(types::RunCodeResult {
        context_id: types::ContextId::try_from(o.context_id).map_err(internal)?,
        language: language_type(o.language),
        result: o.result,
        error: o.error.map(|e| types::CodeError {
            name: e.name,
            message: e.message,
            traceback: e.traceback,
        }),
        stdout: o.stdout,
        stderr: o.stderr,
        stdout_bytes: o.stdout_bytes,
        stderr_bytes: o.stderr_bytes,
        truncated: o.truncated,
        stdout_file: o.stdout_file,
        stderr_file: o.stderr_file,
        timed_out: o.timed_out,
        context_lost: o.context_lost,
        context_restarted: o.context_restarted,
        duration_ms: o.duration_ms,
    })
}

fn exec_result(o: ExecOutcome, oom_killed: bool) -> types::ExecResult {
    types::ExecResult {
        exit_code: o.exit_code,
        signal: o.signal,
        stdout: o.stdout,
        stderr: o.stderr,
        truncated: o.truncated,
        stdout_bytes: o.stdout_bytes,
        stderr_bytes: o.stderr_bytes,
        stdout_file: o.stdout_file,
        stderr_file: o.stderr_file,
        timed_out: o.timed_out,
        oom_killed: Some(oom_killed),
        duration_ms: o.duration_ms,
        job_id: None,
    }
}

fn sandbox_type(view: &SandboxView) -> Result<types::Sandbox, EngineError> {
    let r: &Record = &view.record;
    Ok(types::Sandbox {
        id: types::SandboxId::try_from(r.id.clone()).map_err(internal)?,
        name: r.name.clone(),
        status: status_type(r.status),
        template: r.template.clone(),
        shape: shape_type(&r.shape),
        metadata: metadata_type(&r.metadata)?,
        env_var_names: r.env.iter().map(|(k, _)| k.clone()).collect(),
        created_at: ids::rfc3339(r.created_at),
        last_active_at: ids::rfc3339(r.last_active_at),
        expires_at: r.expires_at.map(ids::rfc3339),
        jobs: view
            .jobs
            .iter()
            .map(job_summary)
            .collect::<Result<Vec<_>, _>>()?,
        usage: view.usage.map(|(u, disk)| types::Usage {
            cpu_seconds: u.cpu_seconds,
            memory_bytes: u.memory_bytes,
            pids: u.pids,
            disk_bytes: disk,
        }),
    })
}

fn check_metadata(
    m: &BTreeMap<String, types::MetadataValue>,
) -> Result<BTreeMap<String, String>, EngineError> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        if k.is_empty()
            || k.chars().count() > MAX_METADATA_KEY
            || k.contains([',', '='])
            || k.contains('\0')
        {
            return Err(EngineError::InvalidArgument(format!(
                "metadata key {k:?} is invalid: use 1-{MAX_METADATA_KEY} characters without `,`, `=` or NUL"
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::InvalidArgument(format!(
                "metadata value of {k:?} contains a NUL byte"
            )));
        }
        out.insert(k.clone(), v.to_string());
    }
    Ok(out)
}

fn check_env(env: &types::EnvVars) -> Result<Vec<(String, String)>, EngineError> {
    if env.len() > MAX_ENV_VARS {
        return Err(EngineError::InvalidArgument(format!(
            "{} environment variables given; at most {MAX_ENV_VARS} are allowed",
            env.len()
        )));
    }
    let mut out = Vec::new();
    for (k, v) in env.iter() {
        let valid = !k.is_empty()
            && k.len() <= MAX_ENV_NAME
            && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(EngineError::InvalidArgument(format!(
                "environment variable name {:?} is invalid: use letters, digits and `_`, not starting with a digit, at most {MAX_ENV_NAME} characters",
                k.chars().take(MAX_ENV_NAME + 1).collect::<String>()
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::InvalidArgument(format!(
                "environment variable {k} contains a NUL byte"
            )));
        }
        out.push((k.clone(), v.to_string()));
    }
    Ok(out)
}

pub async fn health(State(state): State<AppState>) -> ApiResult<types::Health> {
    Ok(Json(types::Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        driver: state.manager.driver().name().into(),
    }))
}

pub async fn list_templates(State(state): State<AppState>) -> ApiResult<types::TemplateList> {
    let templates = state
        .manager
        .templates()
        .iter()
        .map(|t| {
            Ok(types::Template {
                name: types::TemplateName::try_from(t.name.clone()).map_err(internal)?,
                description: t.description.clone(),
                shape: shape_type(&t.shape),
                default: t.name == crate::engine::templates::BASE,
            })
        })
        .collect::<Result<Vec<_>, EngineError>>()?;
    Ok(Json(types::TemplateList { templates }))
}

pub async fn create_sandbox(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<types::CreateSandboxRequest>,
) -> Result<(StatusCode, Json<types::Sandbox>), EngineError> {
    let metadata = match &body.metadata {
        Some(m) => check_metadata(&m.0)?,
        None => BTreeMap::new(),
    };
    let env = match &body.env_vars {
        Some(e) => check_env(e)?,
        None => Vec::new(),
    };
    if let Some(t) = body.timeout_seconds
        && t.get() > 2_592_000
    {
        return Err(EngineError::InvalidArgument(
            "timeout_seconds is at most 2592000 (30 days)".into(),
        ));
    }
    let view = state
        .manager
        .create(CreateRequest {
            name: body.name.as_ref().map(|n| n.to_string()),
            template: body.template.as_ref().map(|t| t.to_string()),
            metadata,
            env,
            timeout_seconds: body.timeout_seconds.map(|t| t.get()),
            tenant,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(sandbox_type(&view)?)))
}

#[derive(Deserialize)]
pub struct ListQuery {
    status: Option<types::SandboxStatus>,
    metadata: Option<String>,
}

/// `key=value,key=value` → pairs.
fn parse_metadata_filter(s: &str) -> Result<Vec<(String, String)>, EngineError> {
    if s.chars().count() > 2048 {
        return Err(EngineError::InvalidArgument(
            "metadata filter is longer than 2048 characters".into(),
        ));
    }
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    EngineError::InvalidArgument(format!(
                        "metadata filter {pair:?} is not `key=value`; write pairs like `project=demo,owner=alice`"
                    ))
                })
        })
        .collect()
}

pub async fn list_sandboxes(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<types::SandboxList> {
    let Query(query) = query.map_err(|e| EngineError::InvalidArgument(e.body_text()))?;
    let filter = match &query.metadata {
        Some(m) => parse_metadata_filter(m)?,
        None => Vec::new(),
    };
    let status = query.status.map(|s| match s {
        types::SandboxStatus::Running => Status::Running,
        types::SandboxStatus::Paused => Status::Paused,
    });
    let sandboxes = state
        .manager
        .list(status, &filter, tenant.as_deref())
        .into_iter()
        .map(|record| {
            sandbox_type(&SandboxView {
                record,
                usage: None,
                jobs: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(types::SandboxList { sandboxes }))
}

pub async fn get_sandbox(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::Sandbox> {
    let id = sandbox_id(&id)?;
    let mut view = state.manager.get(id, tenant.as_deref(), true).await?;
    view.jobs = state
        .manager
        .jobs(id, tenant.as_deref())
        .await
        .unwrap_or_default();
    Ok(Json(sandbox_type(&view)?))
}

pub async fn update_sandbox(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::UpdateSandboxRequest>,
) -> ApiResult<types::Sandbox> {
    let metadata = check_metadata(&body.metadata.0)?;
    let view = state
        .manager
        .update_metadata(sandbox_id(&id)?, tenant.as_deref(), metadata)
        .await?;
    Ok(Json(sandbox_type(&view)?))
}

pub async fn kill_sandbox(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::KillResult> {
    let id = sandbox_id(&id)?;
    state.manager.kill(id, tenant.as_deref()).await?;
    Ok(Json(types::KillResult {
        id: types::SandboxId::try_from(id.to_string()).map_err(internal)?,
        killed: true,
    }))
}

pub async fn pause_sandbox(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::Sandbox> {
    let view = state
        .manager
        .pause(sandbox_id(&id)?, tenant.as_deref())
        .await?;
    Ok(Json(sandbox_type(&view)?))
}

pub async fn resume_sandbox(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::Sandbox> {
    let view = state
        .manager
        .resume(sandbox_id(&id)?, tenant.as_deref())
        .await?;
    Ok(Json(sandbox_type(&view)?))
}

pub async fn get_sandbox_metrics(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::SandboxMetrics> {
    let id = sandbox_id(&id)?;
    let m = state.manager.metrics(id, tenant.as_deref()).await?;
    Ok(Json(types::SandboxMetrics {
        id: types::SandboxId::try_from(id.to_string()).map_err(internal)?,
        status: status_type(m.status),
        cpu_seconds: m.usage.cpu_seconds,
        memory_bytes: m.usage.memory_bytes,
        memory_peak_bytes: m.usage.memory_peak_bytes,
        memory_limit_bytes: m.usage.memory_limit_bytes,
        pids: m.usage.pids,
        pids_limit: m.usage.pids_limit,
        disk_bytes: m.disk_bytes,
        disk_limit_bytes: m.disk_limit_bytes,
        limits_enforced: m.limits_enforced,
        disk_limit_enforced: m.disk_limit_enforced,
    }))
}

/// Checks an exec request; the command, cwd and environment for the agent.
fn exec_spec(body: &types::ExecRequest, stream: bool) -> Result<ExecSpec, EngineError> {
    let timeout_ms = body.timeout_ms.get();
    if timeout_ms > 600_000 {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_ms is {timeout_ms}; the maximum is 600000 (10 minutes). For longer work, set background and poll the job."
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

pub async fn exec_command(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::ExecRequest>,
) -> ApiResult<types::ExecResult> {
    let id = sandbox_id(&id)?;
    let spec = exec_spec(&body, false)?;
    if body.background {
        let request = Request::StartJob {
            command: spec.command,
            cwd: spec.cwd,
            env: spec.env,
        };
        return match state
            .manager
            .request(id, tenant.as_deref(), request, Duration::from_secs(60))
            .await?
        {
            Response::Job(job) => {
                let mut r = exec_result(ExecOutcome::default(), false);
                r.oom_killed = None;
                r.job_id = Some(job.job_id);
                Ok(Json(r))
            }
            other => Err(unexpected(other)),
        };
    }
    let result = state
        .manager
        .exec(
            id,
            tenant.as_deref(),
            spec.command,
            spec.cwd,
            spec.env,
            spec.timeout_ms,
        )
        .await?;
    Ok(Json(exec_result(result.outcome, result.oom_killed)))
}

/// An NDJSON response from a stream of agent frames; `finish` turns the final frame into the
/// `result` event.
async fn event_stream<F, Fut>(
    frames: impl futures::Stream<Item = Result<Response, EngineError>> + Send + 'static,
    finish: F,
) -> axum::response::Response
where
    F: Fn(Response) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<serde_json::Value, EngineError>> + Send,
{
    let request_id = crate::engine::server::current_request_id();
    let finish = std::sync::Arc::new(finish);
    let error_event = move |e: EngineError, request_id: &str| {
        let (_, code) = e.status_and_code();
        serde_json::json!({"type": "error", "error": {"error_code": code, "message": e.to_string(), "request_id": request_id}})
    };
    let lines = frames.then(move |frame| {
        let finish = finish.clone();
        let request_id = request_id.clone();
        async move {
            let event = match frame {
                Ok(Response::Output { stream, data }) => {
                    serde_json::json!({"type": "output", "stream": stream, "data": data})
                }
                Ok(r @ Response::Error { .. }) => error_event(agent_error(r), &request_id),
                Err(e) => error_event(e, &request_id),
                Ok(last) => match finish(last).await {
                    Ok(result) => serde_json::json!({"type": "result", "result": result}),
                    Err(e) => error_event(e, &request_id),
                },
            };
            let mut line = serde_json::to_vec(&event).unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line))
        }
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::engine::server::NDJSON,
        )],
        Body::from_stream(lines),
    )
        .into_response()
}

pub async fn exec_command_stream(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::ExecRequest>,
) -> Result<axum::response::Response, EngineError> {
    if body.background {
        // Nothing to stream: the job starts and the answer is immediate.
        let result = exec_command(State(state), Tenant(tenant), Path(id), ApiJson(body)).await?;
        let value = serde_json::to_value(result.0).map_err(internal)?;
        let line = serde_json::json!({"type": "result", "result": value}).to_string() + "\n";
        return Ok((
            [(
                axum::http::header::CONTENT_TYPE,
                crate::engine::server::NDJSON,
            )],
            line,
        )
            .into_response());
    }
    let id = sandbox_id(&id)?.to_string();
    let spec = exec_spec(&body, true)?;
    let deadline = Duration::from_millis(spec.timeout_ms) + EXEC_GRACE;
    let before = state.manager.oom_mark(&id).await;
    let frames = state
        .manager
        .agent_stream(&id, tenant.as_deref(), Request::Exec(spec), deadline)
        .await?;
    let manager = state.manager.clone();
    Ok(event_stream(frames, move |last| {
        let manager = manager.clone();
        let id = id.clone();
        let tenant = tenant.clone();
        async move {
            match last {
                Response::Exec(outcome) => {
                    let oom = manager.settle_oom(&id, tenant.as_deref(), before).await;
                    serde_json::to_value(exec_result(*outcome, oom)).map_err(internal)
                }
                other => Err(unexpected(other)),
            }
        }
    })
    .await)
}

fn code_spec(body: types::RunCodeRequest, stream: bool) -> Result<RunCodeSpec, EngineError> {
    let timeout_ms = body.timeout_ms.get();
    if timeout_ms > 600_000 {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_ms is {timeout_ms}; the maximum is 600000 (10 minutes)"
        )));
    }
    Ok(RunCodeSpec {
        code: body.code.to_string(),
        context_id: body.context_id.map(|c| c.to_string()),
        language: language_of(body.language),
        timeout_ms,
        max_output_bytes: EXEC_OUTPUT_CAP,
        stream,
    })
}

pub async fn run_code(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::RunCodeRequest>,
) -> ApiResult<types::RunCodeResult> {
    let id = sandbox_id(&id)?;
    match state
        .manager
        .run_code(id, tenant.as_deref(), code_spec(body, false)?)
        .await?
    {
        Response::Code(outcome) => Ok(Json(code_result(*outcome)?)),
        other => Err(unexpected(other)),
    }
}

pub async fn run_code_stream(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::RunCodeRequest>,
) -> Result<axum::response::Response, EngineError> {
    let id = sandbox_id(&id)?;
    let spec = code_spec(body, true)?;
    let deadline = Duration::from_millis(spec.timeout_ms) + EXEC_GRACE;
    let frames = state
        .manager
        .agent_stream(id, tenant.as_deref(), Request::RunCode(spec), deadline)
        .await?;
    Ok(event_stream(frames, |last| async move {
        match last {
            Response::Code(outcome) => {
                serde_json::to_value(code_result(*outcome)?).map_err(internal)
            }
            other => Err(unexpected(other)),
        }
    })
    .await)
}

pub async fn list_code_contexts(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<types::CodeContextList> {
    match state
        .manager
        .request(
            sandbox_id(&id)?,
            tenant.as_deref(),
            Request::ListContexts,
            Duration::from_secs(30),
        )
        .await?
    {
        Response::Contexts { contexts } => Ok(Json(types::CodeContextList {
            contexts: contexts
                .into_iter()
                .map(context_type)
                .collect::<Result<_, _>>()?,
        })),
        other => Err(unexpected(other)),
    }
}

pub async fn create_code_context(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::CreateContextRequest>,
) -> Result<(StatusCode, Json<types::CodeContext>), EngineError> {
    let request = Request::CreateContext {
        language: language_of(body.language),
        cwd: body.cwd.map(|c| c.to_string()),
    };
    match state
        .manager
        .request(
            sandbox_id(&id)?,
            tenant.as_deref(),
            request,
            Duration::from_secs(60),
        )
        .await?
    {
        Response::Context(c) => Ok((StatusCode::CREATED, Json(context_type(c)?))),
        other => Err(unexpected(other)),
    }
}

pub async fn delete_code_context(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path((id, context_id)): Path<(String, String)>,
) -> ApiResult<types::DeleteContextResult> {
    let context = types::ContextId::try_from(context_id.clone()).map_err(|_| {
        EngineError::NotFound(format!(
            "code context {} does not exist; call sandbox_code_context_list to see the contexts",
            context_id.chars().take(40).collect::<String>()
        ))
    })?;
    let request = Request::DeleteContext {
        context_id: context.to_string(),
    };
    match state
        .manager
        .request(
            sandbox_id(&id)?,
            tenant.as_deref(),
            request,
            Duration::from_secs(30),
        )
        .await?
    {
        Response::ContextDeleted { .. } => Ok(Json(types::DeleteContextResult {
            context_id: context,
            deleted: true,
        })),
        other => Err(unexpected(other)),
    }
}

#[derive(Deserialize)]
pub struct JobQuery {
    #[serde(default)]
    since_offset: u64,
}

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

pub async fn get_job(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path((id, job)): Path<(String, String)>,
    q: Result<Query<JobQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<types::JobStatus> {
    let q = query(q)?;
    let request = Request::JobStatus {
        job_id: job_id(&job)?,
        since_offset: q.since_offset,
        max_bytes: JOB_PAGE,
    };
    match state
        .manager
        .request(
            sandbox_id(&id)?,
            tenant.as_deref(),
            request,
            Duration::from_secs(30),
        )
        .await?
    {
        Response::Job(j) => Ok(Json(job_status(*j)?)),
        other => Err(unexpected(other)),
    }
}

pub async fn kill_job(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path((id, job)): Path<(String, String)>,
) -> ApiResult<types::JobStatus> {
    let request = Request::KillJob {
        job_id: job_id(&job)?,
    };
    match state
        .manager
        .request(
            sandbox_id(&id)?,
            tenant.as_deref(),
            request,
            Duration::from_secs(30),
        )
        .await?
    {
        Response::Job(j) => Ok(Json(job_status(*j)?)),
        other => Err(unexpected(other)),
    }
}

#[derive(Deserialize)]
pub struct ReadQuery {
    path: String,
    encoding: Option<types::FileEncoding>,
}

#[derive(Deserialize)]
pub struct PathQuery {
    path: String,
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

fn query<T>(
    q: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, EngineError> {
    q.map(|Query(v)| v)
        .map_err(|e| EngineError::InvalidArgument(e.body_text()))
}

fn unexpected(r: Response) -> EngineError {
    EngineError::Sandbox(format!("unexpected answer from the sandbox's agent: {r:?}"))
}

pub async fn read_file(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<ReadQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<types::FileContent> {
    let q = query(q)?;
    let request = Request::ReadFile {
        path: q.path,
        max_bytes: READ_LIMIT,
    };
    match state
        .manager
        .file_op(sandbox_id(&id)?, tenant.as_deref(), request)
        .await?
    {
        Response::File {
            path,
            data_b64,
            size,
        } => {
            let want_text = !matches!(q.encoding, Some(types::FileEncoding::Base64));
            let bytes = B64
                .decode(&data_b64)
                .map_err(|e| EngineError::Sandbox(format!("the agent sent invalid base64: {e}")))?;
            let (content, encoding) = match String::from_utf8(bytes) {
                Ok(text) if want_text => (text, types::FileEncoding::Utf8),
                _ => (data_b64, types::FileEncoding::Base64),
            };
            Ok(Json(types::FileContent {
                path,
                content,
                encoding,
                size,
            }))
        }
        other => Err(unexpected(other)),
    }
}

pub async fn write_file(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::WriteFileRequest>,
) -> ApiResult<types::WriteResult> {
    let content = body.content.to_string();
    let data_b64 = match body.encoding {
        Some(types::FileEncoding::Base64) => {
            let decoded = B64.decode(content.trim()).map_err(|e| {
                EngineError::InvalidArgument(format!(
                    "content is not valid base64 ({e}); send text with encoding utf8, or standard base64 with padding"
                ))
            })?;
            if decoded.len() > WRITE_LIMIT {
                return Err(too_large_write(decoded.len()));
            }
            B64.encode(decoded)
        }
        _ => {
            if content.len() > WRITE_LIMIT {
                return Err(too_large_write(content.len()));
            }
            B64.encode(content.as_bytes())
        }
    };
    let request = Request::WriteFile {
        path: body.path.to_string(),
        data_b64,
    };
    match state
        .manager
        .file_op(sandbox_id(&id)?, tenant.as_deref(), request)
        .await?
    {
        Response::Written { path, size } => Ok(Json(types::WriteResult { path, size })),
        other => Err(unexpected(other)),
    }
}

fn too_large_write(len: usize) -> EngineError {
    EngineError::PayloadTooLarge(format!(
        "the content is {len} bytes; files_write takes at most {WRITE_LIMIT} bytes"
    ))
}

pub async fn list_files(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<types::FileList> {
    let q = query(q)?;
    let request = Request::ListDir {
        path: q.path,
        max_entries: LIST_LIMIT,
    };
    match state
        .manager
        .file_op(sandbox_id(&id)?, tenant.as_deref(), request)
        .await?
    {
        Response::Dir {
            path,
            entries,
            truncated,
        } => Ok(Json(types::FileList {
            path,
            truncated,
            entries: entries
                .into_iter()
                .map(|e| types::FileEntry {
                    name: e.name,
                    type_: match e.kind {
                        FileKind::File => types::FileType::File,
                        FileKind::Dir => types::FileType::Dir,
                        FileKind::Symlink => types::FileType::Symlink,
                        FileKind::Other => types::FileType::Other,
                    },
                    size: e.size,
                    mtime: ids::rfc3339(e.mtime * 1000),
                })
                .collect(),
        })),
        other => Err(unexpected(other)),
    }
}

pub async fn delete_file(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<types::DeleteResult> {
    let q = query(q)?;
    let request = Request::Delete {
        path: q.path,
        recursive: q.recursive,
    };
    match state
        .manager
        .file_op(sandbox_id(&id)?, tenant.as_deref(), request)
        .await?
    {
        Response::Deleted { path } => Ok(Json(types::DeleteResult {
            path,
            deleted: true,
        })),
        other => Err(unexpected(other)),
    }
}

pub async fn move_file(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::MoveFileRequest>,
) -> ApiResult<types::MoveResult> {
    let request = Request::Move {
        from: body.from.to_string(),
        to: body.to.to_string(),
    };
    match state
        .manager
        .file_op(sandbox_id(&id)?, tenant.as_deref(), request)
        .await?
    {
        Response::Moved { from, to } => Ok(Json(types::MoveResult { from, to })),
        other => Err(unexpected(other)),
    }
}

pub async fn download_dir(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<types::DirArchive> {
    let q = query(q)?;
    let request = Request::ZipDir {
        path: q.path,
        max_bytes: ZIP_LIMIT,
    };
    match state
        .manager
        .file_op(sandbox_id(&id)?, tenant.as_deref(), request)
        .await?
    {
        Response::Zip {
            path,
            zip_b64,
            zip_bytes,
            files,
            skipped,
        } => Ok(Json(types::DirArchive {
            path,
            zip_base64: zip_b64,
            zip_bytes,
            files,
            skipped,
        })),
        other => Err(unexpected(other)),
    }
}
