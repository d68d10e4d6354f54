//! One handler per operation of `openapi/sandbox-mcp.json`, on the types generated from it: the
//! request bodies are the client's own types (so both sides validate the same constraints), and
//! every response is built as the generated type the client will parse.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use crate::agent::protocol::{FileKind, Request, Response};
use crate::client::types;
use crate::engine::error::EngineError;
use crate::engine::ids;
use crate::engine::manager::{
    CreateRequest, LIST_LIMIT, READ_LIMIT, SandboxView, WRITE_LIMIT, ZIP_LIMIT,
};
use crate::engine::server::{ApiJson, AppState, Tenant};
use crate::engine::state::{Record, Status};

type ApiResult<T> = Result<Json<T>, EngineError>;

/// Longest environment variable name accepted.
const MAX_ENV_NAME: usize = 128;
/// Longest metadata key accepted.
const MAX_METADATA_KEY: usize = 64;

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
    let mut out = BTreeMap::new();
    for (k, v) in m {
        out.insert(
            k.clone(),
            types::MetadataValue::try_from(v.clone()).map_err(internal)?,
        );
    }
    Ok(types::Metadata(out))
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
    ApiJson(body): ApiJson<types::CreateSandboxRequest>,
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
    if s.len() > 2048 {
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
    let view = state
        .manager
        .get(sandbox_id(&id)?, tenant.as_deref(), true)
        .await?;
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
    }))
}

pub async fn exec_command(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::ExecRequest>,
) -> ApiResult<types::ExecResult> {
    let id = sandbox_id(&id)?;
    let timeout_ms = body.timeout_ms.get();
    if timeout_ms > 600_000 {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_ms is {timeout_ms}; the maximum is 600000 (10 minutes). For longer work, run it in the background and poll."
        )));
    }
    let env = match &body.env {
        Some(e) => check_env(e)?,
        None => Vec::new(),
    };
    let result = state
        .manager
        .exec(
            id,
            tenant.as_deref(),
            body.command.to_string(),
            body.cwd.as_ref().map(|c| c.to_string()),
            env,
            timeout_ms,
        )
        .await?;
    let o = result.outcome;
    Ok(Json(types::ExecResult {
        exit_code: o.exit_code,
        signal: o.signal,
        stdout: o.stdout,
        stderr: o.stderr,
        truncated: o.truncated,
        stdout_bytes: o.stdout_bytes,
        stderr_bytes: o.stderr_bytes,
        timed_out: o.timed_out,
        oom_killed: Some(result.oom_killed),
        duration_ms: o.duration_ms,
    }))
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
