//! Files inside a sandbox: read, write, list, delete, move, and download a directory as a zip.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use super::convert::Api;
use super::request::{ApiJson, ApiQuery, AppState, Tenant, sandbox_id};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{LIST_LIMIT, READ_LIMIT, WRITE_LIMIT, ZIP_LIMIT};
use sandbox_mcp_protocol::{Delete, ListDir, Move, ReadFile, WriteFile, ZipDir};

/// Deadline of a file operation.
const DEADLINE: Duration = Duration::from_secs(60);

type ApiResult<T> = Result<Json<T>, EngineError>;

#[derive(Deserialize)]
pub(super) struct ReadQuery {
    path: String,
    encoding: Option<types::FileEncoding>,
}

#[derive(Deserialize)]
pub(super) struct PathQuery {
    path: String,
}

#[derive(Deserialize)]
pub(super) struct DeleteQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

pub(super) async fn read(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> ApiResult<types::FileContent> {
    let read = ReadFile {
        path: q.path,
        max_bytes: READ_LIMIT,
    };
    let file = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), read, DEADLINE)
        .await?;
    let want_text = !matches!(q.encoding, Some(types::FileEncoding::Base64));
    let bytes = B64
        .decode(&file.data_b64)
        .map_err(|e| EngineError::Sandbox(format!("the agent sent invalid base64: {e}")))?;
    let (content, encoding) = match String::from_utf8(bytes) {
        Ok(text) if want_text => (text, types::FileEncoding::Utf8),
        _ => (file.data_b64, types::FileEncoding::Base64),
    };
    Ok(Json(types::FileContent {
        path: file.path,
        content,
        encoding,
        size: file.size,
    }))
}

fn too_large_write(len: usize) -> EngineError {
    EngineError::PayloadTooLarge(format!(
        "the content is {len} bytes; files_write takes at most {WRITE_LIMIT} bytes"
    ))
}

pub(super) async fn write(
    State(state): State<AppState>,
    tenant: Tenant,
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
    let write = WriteFile {
        path: body.path.to_string(),
        data_b64,
    };
    let written = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), write, DEADLINE)
        .await?;
    Ok(Json(types::WriteResult {
        path: written.path,
        size: written.size,
    }))
}

pub(super) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<types::FileList> {
    let list = ListDir {
        path: q.path,
        max_entries: LIST_LIMIT,
    };
    let dir = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), list, DEADLINE)
        .await?;
    Ok(Json(types::FileList {
        path: dir.path,
        truncated: dir.truncated,
        entries: dir.entries.into_iter().map(Api::api).collect(),
    }))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult<types::DeleteResult> {
    let delete = Delete {
        path: q.path,
        recursive: q.recursive,
    };
    let deleted = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), delete, DEADLINE)
        .await?;
    Ok(Json(types::DeleteResult {
        path: deleted.path,
        deleted: true,
    }))
}

pub(super) async fn rename(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::MoveFileRequest>,
) -> ApiResult<types::MoveResult> {
    let rename = Move {
        from: body.from.to_string(),
        to: body.to.to_string(),
    };
    let moved = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), rename, DEADLINE)
        .await?;
    Ok(Json(types::MoveResult {
        from: moved.from,
        to: moved.to,
    }))
}

pub(super) async fn download_dir(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<types::DirArchive> {
    let zip = ZipDir {
        path: q.path,
        max_bytes: ZIP_LIMIT,
    };
    let archive = state
        .manager
        .agent
        .call(sandbox_id(&id)?, tenant.as_deref(), zip, DEADLINE)
        .await?;
    Ok(Json(archive.api()))
}
