//! The engine ↔ agent protocol: one request per connection, answered by one or more frames.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Exec may send `Output`
//! frames before its final `Exec` frame; every other request gets exactly one frame back.
//! Byte payloads travel base64-encoded.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame either side accepts: an 8 MiB file base64-encoded, or a 10 MiB zip, plus JSON.
pub const MAX_FRAME: usize = 24 * 1024 * 1024;
/// Largest answer to a request whose answer is small (everything but file contents, zips,
/// listings and command output): the engine never buffers more than this of it.
const SMALL_REPLY: usize = 256 * 1024;
/// Room for command output in one frame: capped text is at most a few tens of KiB, but JSON
/// escapes a control byte as six characters.
const OUTPUT_REPLY: usize = 2 * 1024 * 1024;

impl Request {
    /// The largest frame the engine accepts in answer to this request. The agent runs inside the
    /// sandbox: whatever it sends is bounded by what the request can produce before the engine
    /// buffers it.
    pub fn reply_limit(&self) -> usize {
        let encoded = |bytes: u64| (bytes as usize).saturating_mul(4) / 3 + SMALL_REPLY;
        match self {
            Request::ReadFile { max_bytes, .. } | Request::ZipDir { max_bytes, .. } => {
                encoded(*max_bytes).min(MAX_FRAME)
            }
            // Up to 1000 entries of names up to 255 bytes, escaped.
            Request::ListDir { .. } => 4 * 1024 * 1024,
            Request::JobStatus { max_bytes, .. } => {
                ((*max_bytes as usize).saturating_mul(6) + SMALL_REPLY).min(MAX_FRAME)
            }
            Request::Exec(_) | Request::RunCode(_) | Request::ListJobs => OUTPUT_REPLY,
            _ => SMALL_REPLY,
        }
    }
}

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
    RunCode(RunCodeSpec),
    CreateContext {
        language: Language,
        cwd: Option<String>,
    },
    ListContexts,
    DeleteContext {
        context_id: String,
    },
    /// Start a command in the background; answered at once with the job.
    StartJob {
        command: String,
        cwd: Option<String>,
        env: Vec<(String, String)>,
    },
    JobStatus {
        job_id: String,
        since_offset: u64,
        max_bytes: u64,
    },
    KillJob {
        job_id: String,
    },
    ListJobs,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Node,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunCodeSpec {
    pub code: String,
    /// A context made with `CreateContext`; `None` uses the language's default context.
    pub context_id: Option<String>,
    /// Language of the default context (ignored when `context_id` names one).
    pub language: Language,
    pub timeout_ms: u64,
    pub max_output_bytes: u64,
    pub stream: bool,
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
    Exec(Box<ExecOutcome>),
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
    Code(Box<CodeOutcome>),
    Context(ContextInfo),
    Contexts {
        contexts: Vec<ContextInfo>,
    },
    ContextDeleted {
        context_id: String,
    },
    Job(Box<JobInfo>),
    Jobs {
        jobs: Vec<JobInfo>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CodeOutcome {
    pub context_id: String,
    pub language: Language,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub truncated: bool,
    pub stdout_file: Option<String>,
    pub stderr_file: Option<String>,
    /// repr() / util.inspect() of the last expression, when it has a value.
    pub result: Option<String>,
    pub error: Option<CodeError>,
    pub timed_out: bool,
    /// The interpreter died during this call; its state is gone and the next call starts fresh.
    pub context_lost: bool,
    /// This call ran in a fresh interpreter because the previous one had died.
    pub context_restarted: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CodeError {
    pub name: String,
    pub message: String,
    pub traceback: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextInfo {
    pub context_id: String,
    pub language: Language,
    pub cwd: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Whether an interpreter is running for it (a context starts one on first use).
    pub alive: bool,
    pub is_default: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Running,
    Exited,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobInfo {
    pub job_id: String,
    pub command: String,
    pub status: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// Bytes the job has written (stdout and stderr, interleaved as written).
    pub output_bytes: u64,
    /// The job's output log inside the sandbox.
    pub log_file: String,
    /// Output from `offset` to `next_offset` (JobStatus only).
    pub output: Option<String>,
    pub offset: u64,
    pub next_offset: u64,
    /// Bytes before `offset` that were dropped from the log to keep it bounded.
    pub dropped_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
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
    /// Full copies of truncated streams, inside the sandbox.
    #[serde(default)]
    pub stdout_file: Option<String>,
    #[serde(default)]
    pub stderr_file: Option<String>,
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
    /// The sandbox's disk is full (its quota, or the store).
    DiskFull,
    Io,
}

/// Reads one frame of at most [`MAX_FRAME`] bytes; `Ok(None)` on a clean EOF before a frame
/// starts.
pub async fn read_frame<R, T>(r: &mut R) -> std::io::Result<Option<T>>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    read_frame_limited(r, MAX_FRAME).await
}

/// Reads one frame of at most `limit` bytes (checked before anything is buffered).
pub async fn read_frame_limited<R, T>(r: &mut R, limit: usize) -> std::io::Result<Option<T>>
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
    if len > limit.min(MAX_FRAME) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "a frame of {len} bytes exceeds the {}-byte limit",
                limit.min(MAX_FRAME)
            ),
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod frame_tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_over_the_request_s_limit_is_refused_before_it_is_read() {
        // A header claiming 20 MiB, and nothing behind it: refused on the header alone.
        let claimed = (20u32 << 20).to_be_bytes();
        let mut input: &[u8] = &claimed;
        let limit = Request::Ping.reply_limit();
        let err = read_frame_limited::<_, Response>(&mut input, limit)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        // Requests that carry file contents allow what they can carry, and no more.
        let read = Request::ReadFile {
            path: "x".into(),
            max_bytes: 1 << 20,
        };
        assert!(read.reply_limit() > (1 << 20) * 4 / 3 && read.reply_limit() < 2 << 20);
        assert!(Request::ListJobs.reply_limit() <= MAX_FRAME);
    }
}
