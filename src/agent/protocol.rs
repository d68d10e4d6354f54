//! The engine ↔ agent protocol: one request per connection, answered by one or more frames.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Exec may send `Output`
//! frames before its final `Exec` frame; every other request gets exactly one frame back.
//! Byte payloads travel base64-encoded.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame either side accepts: an 8 MiB file base64-encoded, or a 10 MiB zip, plus JSON.
pub const MAX_FRAME: usize = 24 * 1024 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    Exec(ExecSpec),
    ReadFile {
        path: String,
        max_bytes: u64,
    },
    WriteFile {
        path: String,
        data_b64: String,
    },
    ListDir {
        path: String,
        max_entries: u64,
    },
    Delete {
        path: String,
        recursive: bool,
    },
    Move {
        from: String,
        to: String,
    },
    ZipDir {
        path: String,
        max_bytes: u64,
    },
    /// Kill every process in the sandbox except the agent (after an OOM kill, say).
    KillAll,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecSpec {
    pub command: String,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub timeout_ms: u64,
    /// Cap on each of stdout and stderr in the result, in bytes.
    pub max_output_bytes: u64,
    /// Send `Output` frames as output arrives.
    pub stream: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Pong {
        pid: u32,
        version: String,
    },
    Output {
        stream: Stream,
        data: String,
    },
    Exec(ExecOutcome),
    File {
        path: String,
        data_b64: String,
        size: u64,
    },
    Written {
        path: String,
        size: u64,
    },
    Dir {
        path: String,
        entries: Vec<DirEntry>,
        truncated: bool,
    },
    Deleted {
        path: String,
    },
    Moved {
        from: String,
        to: String,
    },
    Zip {
        path: String,
        zip_b64: String,
        zip_bytes: u64,
        files: u64,
        skipped: Vec<String>,
    },
    Done,
    Error {
        kind: ErrorKind,
        message: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub truncated: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub mtime: i64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Why an agent request failed; the engine maps each to an API error code.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    InvalidArgument,
    PermissionDenied,
    Conflict,
    PayloadTooLarge,
    Io,
}

/// Reads one frame; `Ok(None)` on a clean EOF before a frame starts.
pub async fn read_frame<R, T>(r: &mut R) -> std::io::Result<Option<T>>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    serde_json::from_slice(&buf)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Writes one frame.
pub async fn write_frame<W, T>(w: &mut W, value: &T) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = serde_json::to_vec(value)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if body.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "response too large for one frame",
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await
}
