//! Files: envd's `/files` (download; upload as multipart or an octet stream, gzip or not) and its
//! `filesystem` Connect service (stat, list, make a directory, move, remove), on the agent's
//! file calls. Paths are the sandbox's own, resolved by the agent as for the engine's own API.

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{READ_LIMIT, WRITE_LIMIT};
use sandbox_mcp_protocol::{
    Delete, Dir, DirEntry, FileKind, ListDir, Move, ReadFile, Stat, WriteFile,
};

use crate::connect::{self, RpcError};
use crate::envd::{SignedUrl, file_sandbox, sandbox};
use crate::{Door, Failure};

/// Largest upload body taken (a multipart body carries a little more than its files).
pub(crate) const UPLOAD_LIMIT: usize = WRITE_LIMIT + 64 * 1024;
/// Deadline of one file call to the agent.
const DEADLINE: Duration = Duration::from_secs(60);
/// Most entries a directory listing returns.
const LIST_MAX: u64 = 10_000;

#[derive(Deserialize)]
pub(crate) struct FileQuery {
    path: Option<String>,
    /// The account uploaded files belong to (the sandbox's default when absent).
    username: Option<String>,
    /// A signed URL's signature and expiry (seconds since the epoch), in place of a token.
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

impl FileQuery {
    fn signed(&self, operation: &'static str) -> SignedUrl<'_> {
        SignedUrl {
            path: self.path.as_deref().unwrap_or(""),
            operation,
            user: self.username.as_deref().unwrap_or(""),
            signature: self.signature.as_deref(),
            expiration: self.signature_expiration,
        }
    }
}

pub(crate) async fn download(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
) -> Response {
    let s = match file_sandbox(&door, &headers, &q.signed("read")).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let Some(path) = q.path.filter(|p| !p.is_empty()) else {
        return Failure::bad("the path query parameter is required").into_response();
    };
    if let Err(e) = crate::user::acting(&door, &s.id, None).await {
        return Failure::from(e).into_response();
    }
    let read = ReadFile {
        path: crate::absolute(&path),
        max_bytes: READ_LIMIT * 8,
    };
    match door.manager.agent.call(&s.id, None, read, DEADLINE).await {
        Ok(file) => match B64.decode(&file.data_b64) {
            Ok(bytes) => {
                ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
            }
            Err(e) => Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the agent sent invalid base64: {e}"),
            )
            .into_response(),
        },
        Err(e) => Failure::from(e).into_response(),
    }
}

pub(crate) async fn upload(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
    body: axum::body::Bytes,
) -> Response {
    let s = match file_sandbox(&door, &headers, &q.signed("write")).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let files = match uploaded(&headers, q.path, &body) {
        Ok(f) => f,
        Err(f) => return f.into_response(),
    };
    let named = q.username.filter(|u| !u.is_empty());
    // E2B's file metadata: `X-Metadata-KEY: VALUE` headers, kept with lowercased keys (the agent
    // checks them).
    let metadata: std::collections::BTreeMap<String, String> = headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().strip_prefix("x-metadata-")?;
            Some((key.to_string(), value.to_str().ok()?.to_string()))
        })
        .collect();
    let owner = match crate::user::acting(&door, &s.id, named).await {
        Ok(o) => o,
        Err(e) => return Failure::from(e).into_response(),
    };
    let mut written = Vec::new();
    for (path, data) in files {
        if data.len() > WRITE_LIMIT {
            return Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{path} is {} bytes; a file written here is at most {WRITE_LIMIT} bytes",
                    data.len()
                ),
            )
            .into_response();
        }
        let write = WriteFile {
            path: crate::absolute(&path),
            data_b64: B64.encode(&data),
            owner: Some(owner.clone()),
            metadata: metadata.clone(),
        };
        match door.manager.agent.call(&s.id, None, write, DEADLINE).await {
            Ok(w) => {
                let mut info = serde_json::json!({
                    "name": std::path::Path::new(&w.path)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    "type": "file",
                    "path": w.path,
                });
                if !metadata.is_empty() {
                    info["metadata"] = serde_json::json!(metadata);
                }
                written.push(info);
            }
            Err(e) => return Failure::from(e).into_response(),
        }
    }
    axum::Json(written).into_response()
}

/// The files of an upload: one octet stream at `path`, or each part of a multipart body (its
/// file name the path, as the SDKs send it).
fn uploaded(
    headers: &HeaderMap,
    path: Option<String>,
    body: &[u8],
) -> Result<Vec<(String, Vec<u8>)>, Failure> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let gzip = match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str()) {
        None | Some(Ok("identity")) => false,
        Some(Ok("gzip")) => true,
        _ => return Err(Failure::bad("Content-Encoding is gzip or nothing")),
    };
    if let Some(boundary) = content_type
        .strip_prefix("multipart/form-data")
        .and_then(|rest| {
            rest.split(';')
                .find_map(|p| p.trim().strip_prefix("boundary="))
        })
    {
        let boundary = boundary.trim_matches('"');
        return multipart(body, boundary, path.as_deref());
    }
    let path = path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Failure::bad("the path query parameter is required"))?;
    let data = if gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .take(WRITE_LIMIT as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| Failure::bad(format!("the gzip body is invalid: {e}")))?;
        out
    } else {
        body.to_vec()
    };
    Ok(vec![(path, data)])
}

/// A `multipart/form-data` body's file parts: (the part's file name, or `fallback`, and bytes).
fn multipart(
    body: &[u8],
    boundary: &str,
    fallback: Option<&str>,
) -> Result<Vec<(String, Vec<u8>)>, Failure> {
    if boundary.is_empty() || boundary.len() > 200 {
        return Err(Failure::bad(
            "a multipart body needs a boundary of 1-200 characters",
        ));
    }
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    // Everything before the first delimiter is a preamble.
    let start = memchr::memmem::find(rest, delimiter.as_bytes())
        .ok_or_else(|| Failure::bad("the multipart body has no part"))?;
    rest = &rest[start + delimiter.len()..];
    let next = format!("\r\n--{boundary}");
    loop {
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| Failure::bad("a malformed multipart body"))?;
        let head_end = memchr::memmem::find(rest, b"\r\n\r\n")
            .ok_or_else(|| Failure::bad("a multipart part without headers' end"))?;
        let head = std::str::from_utf8(&rest[..head_end])
            .map_err(|_| Failure::bad("multipart headers are not UTF-8"))?;
        let content = &rest[head_end + 4..];
        let end = memchr::memmem::find(content, next.as_bytes())
            .ok_or_else(|| Failure::bad("a multipart part without its closing delimiter"))?;
        let filename = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            if !name.trim().eq_ignore_ascii_case("content-disposition") {
                return None;
            }
            value.split(';').find_map(|p| {
                p.trim()
                    .strip_prefix("filename=")
                    .map(|f| f.trim_matches('"').to_string())
            })
        });
        let path = filename
            .filter(|f| !f.is_empty())
            .or_else(|| fallback.map(str::to_string))
            .ok_or_else(|| Failure::bad("a multipart part names no file"))?;
        parts.push((path, content[..end].to_vec()));
        rest = &content[end + next.len()..];
    }
    Ok(parts)
}

pub(crate) async fn rpc(
    State(door): State<Arc<Door>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let s = match sandbox(&door, &headers).await {
        Ok(s) => s,
        Err(r) => return r.rpc().into_response(),
    };
    // The sandbox's home is there before anything names it.
    if let Err(e) = crate::user::acting(&door, &s.id, None).await {
        return RpcError::from(e).into_response();
    }
    let mut req: Req = match connect::request(&headers, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    for path in [&mut req.path, &mut req.source, &mut req.destination] {
        if !path.is_empty() {
            *path = crate::absolute(path);
        }
    }
    let id = s.id.as_str();
    connect::reply(match method.as_str() {
        "Stat" => stat(&door, id, req.path())
            .await
            .map(|e| serde_json::json!({"entry": e})),
        "ListDir" => list(&door, id, req.path(), req.depth).await,
        "MakeDir" => match crate::user::named(&headers) {
            Ok(named) => make_dir(&door, id, req.path(), named).await,
            Err(e) => Err(e),
        },
        "Move" => moved(&door, id, &req).await,
        "Remove" => remove(&door, id, req.path()).await,
        other => Err(RpcError::new(
            "unimplemented",
            format!("no method filesystem.Filesystem/{other}"),
        )),
    })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Req {
    path: String,
    source: String,
    destination: String,
    /// How many levels a listing descends (1: the directory's own entries).
    depth: Option<u32>,
}

impl Req {
    fn path(&self) -> &str {
        &self.path
    }
}

pub(crate) fn entry(dir: &str, e: &DirEntry) -> serde_json::Value {
    let path = if dir.ends_with('/') {
        format!("{dir}{}", e.name)
    } else {
        format!("{dir}/{}", e.name)
    };
    // As envd, a symlink is described by what it leads to, and where.
    let dir = e.kind == FileKind::Dir || (e.kind == FileKind::Symlink && e.target_is_dir);
    let mut v = serde_json::json!({
        "name": e.name,
        "type": if dir { "FILE_TYPE_DIRECTORY" } else { "FILE_TYPE_FILE" },
        "path": path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(dir, e.mode),
        "owner": e.owner,
        "group": e.group,
        "modifiedTime": chrono::DateTime::from_timestamp(e.mtime, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    });
    if let Some(target) = &e.target {
        v["symlinkTarget"] = target.clone().into();
    }
    if !e.metadata.is_empty() {
        v["metadata"] = serde_json::json!(e.metadata);
    }
    v
}

/// Permissions as envd writes them (Go's `FileMode.String`): a letter for each special bit that
/// is set (`d` directory, `u` setuid, `g` setgid, `t` sticky), or `-` for none, then `rwx` three
/// times.
fn permissions(dir: bool, mode: u32) -> String {
    let mut s: String = [
        (dir, 'd'),
        (mode & 0o4000 != 0, 'u'),
        (mode & 0o2000 != 0, 'g'),
    ]
    .into_iter()
    .chain([(mode & 0o1000 != 0, 't')])
    .filter_map(|(set, c)| set.then_some(c))
    .collect();
    if s.is_empty() {
        s.push('-');
    }
    for shift in [6, 3, 0] {
        for (bit, c) in [(4, 'r'), (2, 'w'), (1, 'x')] {
            s.push(if (mode >> shift) & bit != 0 { c } else { '-' });
        }
    }
    s
}

async fn listing(door: &Door, id: &str, path: &str) -> Result<Dir, EngineError> {
    let list = ListDir {
        path: path.to_string(),
        max_entries: LIST_MAX,
    };
    door.manager.agent.call(id, None, list, DEADLINE).await
}

/// An entry, as the agent describes it (a symlink by what it leads to, see [`entry`]).
async fn stat(door: &Door, id: &str, path: &str) -> Result<serde_json::Value, RpcError> {
    if path.is_empty() {
        return Err(RpcError::invalid("path is required"));
    }
    if path.trim_end_matches('/').is_empty() {
        return Ok(serde_json::json!({"name": "/", "type": "FILE_TYPE_DIRECTORY", "path": "/"}));
    }
    let stat = Stat {
        path: path.to_string(),
    };
    let dir = door.manager.agent.call(id, None, stat, DEADLINE).await?;
    dir.entries
        .first()
        .map(|e| entry(&dir.path, e))
        .ok_or_else(|| RpcError::not_found(format!("{path} does not exist")))
}

/// Deepest listing taken.
const MAX_DEPTH: u32 = 16;

async fn list(
    door: &Door,
    id: &str,
    path: &str,
    depth: Option<u32>,
) -> Result<serde_json::Value, RpcError> {
    let depth = depth.filter(|d| *d > 0).unwrap_or(1);
    if depth > MAX_DEPTH {
        return Err(RpcError::invalid(format!("depth is at most {MAX_DEPTH}")));
    }
    let mut entries = Vec::new();
    // Depth first, each directory's entries in name order with what is under each right after
    // it (as envd walks), within the listing budget. The stack holds entries still to be given,
    // the next on top, each with its level.
    let mut pending: Vec<(serde_json::Value, bool, u32)> = Vec::new();
    let mut next_dir = Some((path.to_string(), 1));
    loop {
        if let Some((dir_path, level)) = next_dir.take() {
            let dir = listing(door, id, &dir_path).await?;
            pending.extend(
                dir.entries
                    .iter()
                    .rev()
                    .map(|e| (entry(&dir.path, e), e.kind == FileKind::Dir, level)),
            );
        }
        let Some((v, is_dir, level)) = pending.pop() else {
            break;
        };
        if is_dir && level < depth {
            next_dir = Some((
                v["path"].as_str().unwrap_or_default().to_string(),
                level + 1,
            ));
        }
        entries.push(v);
        if entries.len() as u64 >= LIST_MAX {
            return Err(RpcError::new(
                "resource_exhausted",
                format!("the listing holds more than {LIST_MAX} entries; list less deep"),
            ));
        }
    }
    Ok(serde_json::json!({"entries": entries}))
}

/// A directory with its parents; `already_exists` when it was there (the SDKs answer `false`).
async fn make_dir(
    door: &Door,
    id: &str,
    path: &str,
    named: Option<String>,
) -> Result<serde_json::Value, RpcError> {
    if path.is_empty() {
        return Err(RpcError::invalid("path is required"));
    }
    if stat(door, id, path).await.is_ok() {
        return Err(RpcError::new(
            "already_exists",
            format!("{path} already exists"),
        ));
    }
    // The agent makes a file's parent directories: a placeholder made and deleted leaves them.
    let owner = crate::user::acting(door, id, named).await?;
    let marker = crate::placeholder(path.trim_end_matches('/'));
    let write = WriteFile {
        path: marker.clone(),
        data_b64: String::new(),
        owner: Some(owner),
        metadata: Default::default(),
    };
    door.manager.agent.call(id, None, write, DEADLINE).await?;
    let delete = Delete {
        path: marker,
        recursive: false,
    };
    door.manager.agent.call(id, None, delete, DEADLINE).await?;
    Ok(serde_json::json!({"entry": stat(door, id, path).await?}))
}

async fn moved(door: &Door, id: &str, req: &Req) -> Result<serde_json::Value, RpcError> {
    if req.source.is_empty() || req.destination.is_empty() {
        return Err(RpcError::invalid("source and destination are required"));
    }
    let m = Move {
        from: req.source.clone(),
        to: req.destination.clone(),
    };
    let done = door.manager.agent.call(id, None, m, DEADLINE).await?;
    Ok(serde_json::json!({"entry": stat(door, id, &done.to).await?}))
}

async fn remove(door: &Door, id: &str, path: &str) -> Result<serde_json::Value, RpcError> {
    if path.is_empty() {
        return Err(RpcError::invalid("path is required"));
    }
    let d = Delete {
        path: path.to_string(),
        recursive: true,
    };
    match door.manager.agent.call(id, None, d, DEADLINE).await {
        // As envd: removing what is not there is done.
        Ok(_) | Err(EngineError::NotFound(_)) => Ok(serde_json::json!({})),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn multipart_parts_are_found_with_their_file_names() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c\"\r\n\r\n\r\n--x\r\n--XyZ--\r\n";
        let parts = multipart(body, "XyZ", None).unwrap();
        assert_eq!(
            parts,
            vec![
                ("/a/b.txt".to_string(), b"hello".to_vec()),
                ("c".to_string(), b"\r\n--x".to_vec())
            ]
        );
    }

    #[test]
    fn permissions_are_written_as_envd_writes_them() {
        assert_eq!(permissions(false, 0o644), "-rw-r--r--");
        assert_eq!(permissions(true, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(true, 0o1777), "dtrwxrwxrwx");
        assert_eq!(permissions(false, 0o4755), "urwxr-xr-x");
        assert_eq!(permissions(false, 0), "----------");
    }

    #[test]
    fn a_malformed_multipart_body_is_refused() {
        for body in [
            &b"no delimiter"[..],
            b"--B\r\nContent-Disposition: form-data\r\n\r\nno end",
            b"--B\r\nno header end",
            b"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--B--",
        ] {
            assert!(multipart(body, "B", None).is_err(), "{body:?}");
        }
        assert!(multipart(b"--B--", "", None).is_err());
    }
}
