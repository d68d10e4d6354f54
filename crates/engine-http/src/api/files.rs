//! Files inside a sandbox: read, write, list, delete, move, and download a directory as a zip.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use super::convert::Api;
use super::request::AppState;
use sandbox_mcp_api::server::{self, Caller};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{LIST_LIMIT, READ_LIMIT, WRITE_LIMIT, ZIP_LIMIT};
use sandbox_mcp_protocol::{Delete, ListDir, Move, ReadFile, WriteFile, ZipDir};

/// Deadline of a file operation.
const DEADLINE: Duration = Duration::from_secs(60);

pub(super) async fn read(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    q: server::ReadFileQuery,
) -> Result<types::FileContent, EngineError> {
    let read = ReadFile {
        path: q.path,
        max_bytes: READ_LIMIT,
    };
    let file = state
        .manager
        .agent
        .call(&id, caller.tenant(), read, DEADLINE)
        .await?;
    let want_text = !matches!(q.encoding, Some(types::FileEncoding::Base64));
    let bytes = B64
        .decode(&file.data_b64)
        .map_err(|e| EngineError::Sandbox(format!("the agent sent invalid base64: {e}")))?;
    let (content, encoding) = match String::from_utf8(bytes) {
        Ok(text) if want_text => (text, types::FileEncoding::Utf8),
        _ => (file.data_b64, types::FileEncoding::Base64),
    };
    Ok(types::FileContent {
        path: file.path,
        content,
        encoding,
        size: file.size,
    })
}

fn too_large_write(len: usize) -> EngineError {
    EngineError::PayloadTooLarge(format!(
        "the content is {len} bytes; files_write takes at most {WRITE_LIMIT} bytes"
    ))
}

pub(super) async fn write(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::WriteFileRequest,
) -> Result<types::WriteResult, EngineError> {
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
        owner: None,
        metadata: Default::default(),
    };
    let written = state
        .manager
        .agent
        .call(&id, caller.tenant(), write, DEADLINE)
        .await?;
    Ok(types::WriteResult {
        path: written.path,
        size: written.size,
    })
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    q: server::ListFilesQuery,
) -> Result<types::FileList, EngineError> {
    let list = ListDir {
        path: q.path,
        max_entries: LIST_LIMIT,
    };
    let dir = state
        .manager
        .agent
        .call(&id, caller.tenant(), list, DEADLINE)
        .await?;
    Ok(types::FileList {
        path: dir.path,
        truncated: dir.truncated,
        entries: dir.entries.into_iter().map(Api::api).collect(),
    })
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    q: server::DeleteFileQuery,
) -> Result<types::DeleteResult, EngineError> {
    let delete = Delete {
        path: q.path,
        recursive: q.recursive,
    };
    let deleted = state
        .manager
        .agent
        .call(&id, caller.tenant(), delete, DEADLINE)
        .await?;
    Ok(types::DeleteResult {
        path: deleted.path,
        deleted: true,
    })
}

pub(super) async fn rename(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::MoveFileRequest,
) -> Result<types::MoveResult, EngineError> {
    let rename = Move {
        from: body.from.to_string(),
        to: body.to.to_string(),
    };
    let moved = state
        .manager
        .agent
        .call(&id, caller.tenant(), rename, DEADLINE)
        .await?;
    Ok(types::MoveResult {
        from: moved.from,
        to: moved.to,
    })
}

pub(super) async fn download_dir(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    q: server::DownloadDirQuery,
) -> Result<types::DirArchive, EngineError> {
    let zip = ZipDir {
        path: q.path,
        max_bytes: ZIP_LIMIT,
    };
    let archive = state
        .manager
        .agent
        .call(&id, caller.tenant(), zip, DEADLINE)
        .await?;
    Ok(archive.api())
}
