//! The engine ↔ agent protocol: one request per connection, answered by frames.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Each request is a type that
//! names its reply ([`Call::Reply`]); the agent answers with a [`Frame`] of that type — exec and
//! run_code may send `Output` frames before it — or with an `Error` frame. So an agent handler
//! that returned the wrong reply would not compile, and an agent that sent one anyway fails the
//! engine's decoding with one error. Byte payloads travel base64-encoded.

pub mod keys;
pub mod mux;

/// The display every desktop sandbox uses; `DISPLAY` is set to it for every command.
pub const DISPLAY: &str = ":0";

use serde::de::DeserializeOwned;
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

/// A request to the agent, and what it answers.
pub trait Call: Into<Request> {
    type Reply: Serialize + DeserializeOwned;

    /// The largest frame the engine accepts in answer. The agent runs inside the sandbox:
    /// whatever it sends is bounded by what the request can produce before the engine buffers it.
    fn reply_limit(&self) -> usize {
        SMALL_REPLY
    }

    /// Adds variables a command starts with ahead of its own (a sandbox's bound secrets'
    /// stand-ins); requests that start no command ignore them.
    fn add_env(&mut self, _env: &[(String, String)]) {}
}

/// Puts `env` ahead of `into` (a variable the request sets itself wins).
fn prepend(into: &mut Vec<(String, String)>, env: &[(String, String)]) {
    let mut all = env.to_vec();
    all.append(into);
    *into = all;
}

/// Every request, as it travels (tagged by `op`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping(Ping),
    Exec(ExecSpec),
    ReadFile(ReadFile),
    WriteFile(WriteFile),
    ListDir(ListDir),
    Delete(Delete),
    Move(Move),
    ZipDir(ZipDir),
    KillAll(KillAll),
    RunCode(RunCodeSpec),
    CreateContext(CreateContext),
    ListContexts(ListContexts),
    DeleteContext(DeleteContext),
    StartJob(StartJob),
    JobStatus(JobStatus),
    KillJob(KillJob),
    ListJobs(ListJobs),
    HandOverEgress(HandOverEgress),
    ConnectPort(ConnectPort),
    StartDesktop(StartDesktop),
    Screenshot(Screenshot),
    Input(Input),
}

/// Binds a request type to its variant of [`Request`] and to its reply.
macro_rules! call {
    ($variant:ident($request:ident) => $reply:ty) => {
        call!($variant($request) => $reply, limit: small);
    };
    ($variant:ident($request:ident) => $reply:ty, limit: $limit:expr) => {
        impl From<$request> for Request {
            fn from(r: $request) -> Self {
                Request::$variant(r)
            }
        }
        impl Call for $request {
            type Reply = $reply;
            #[allow(clippy::redundant_closure_call)]
            fn reply_limit(&self) -> usize {
                ($limit)(self)
            }
        }
    };
    // A request that starts a command with an environment of its own.
    ($variant:ident($request:ident) => $reply:ty, limit: $limit:expr, env) => {
        impl From<$request> for Request {
            fn from(r: $request) -> Self {
                Request::$variant(r)
            }
        }
        impl Call for $request {
            type Reply = $reply;
            #[allow(clippy::redundant_closure_call)]
            fn reply_limit(&self) -> usize {
                ($limit)(self)
            }
            fn add_env(&mut self, env: &[(String, String)]) {
                prepend(&mut self.env, env);
            }
        }
    };
}

fn small<T>(_: &T) -> usize {
    SMALL_REPLY
}

/// Room for `bytes` sent base64-encoded, plus the rest of the frame.
fn encoded(bytes: u64) -> usize {
    ((bytes as usize).saturating_mul(4) / 3 + SMALL_REPLY).min(MAX_FRAME)
}

/// Is the agent there, and which one is it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Ping {}

/// Unprivileged sandboxes: the engine asks for the egress sockets the agent made in the
/// sandbox's network namespace. Before the reply frame, the agent sends one byte over the
/// connection, carrying the two descriptors (TCP listener, DNS socket) when it has them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HandOverEgress {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EgressHandover {
    /// Why the agent has no sockets to hand over (the kernel refused the rules, say).
    pub why_not: Option<String>,
}

/// Unprivileged sandboxes: a preview's way in. The agent connects to `127.0.0.1:port` in the
/// sandbox's namespace and passes the connected socket the same way as [`HandOverEgress`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectPort {
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PortConnected {
    /// Nothing listens on the port.
    pub refused: bool,
    /// Another reason there is no connection.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pong {
    pub pid: u32,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReadFile {
    pub path: String,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileData {
    pub path: String,
    pub data_b64: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WriteFile {
    pub path: String,
    pub data_b64: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Written {
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ListDir {
    pub path: String,
    pub max_entries: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Dir {
    pub path: String,
    pub entries: Vec<DirEntry>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Delete {
    pub path: String,
    pub recursive: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Deleted {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Move {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Moved {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ZipDir {
    pub path: String,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Zip {
    pub path: String,
    pub zip_b64: String,
    pub zip_bytes: u64,
    pub files: u64,
    pub skipped: Vec<String>,
}

/// Kill every process in the sandbox except the agent (after an OOM kill, say).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KillAll {}

/// A request done, with nothing to report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Done {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CreateContext {
    pub language: Language,
    pub cwd: Option<String>,
    /// Variables the interpreter starts with beside the sandbox's (bound secrets' stand-ins).
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListContexts {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextList {
    pub contexts: Vec<ContextInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeleteContext {
    pub context_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextDeleted {
    pub context_id: String,
}

/// Start a command in the background; answered at once with the job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartJob {
    pub command: String,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobStatus {
    pub job_id: String,
    pub since_offset: u64,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KillJob {
    pub job_id: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListJobs {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobList {
    pub jobs: Vec<JobInfo>,
}

call!(Ping(Ping) => Pong);
call!(HandOverEgress(HandOverEgress) => EgressHandover);
call!(ConnectPort(ConnectPort) => PortConnected);
call!(Exec(ExecSpec) => ExecOutcome, limit: |_: &ExecSpec| OUTPUT_REPLY, env);
call!(ReadFile(ReadFile) => FileData, limit: |r: &ReadFile| encoded(r.max_bytes));
call!(WriteFile(WriteFile) => Written);
// Up to 1000 entries of names up to 255 bytes, escaped.
call!(ListDir(ListDir) => Dir, limit: |_: &ListDir| 4 * 1024 * 1024);
call!(Delete(Delete) => Deleted);
call!(Move(Move) => Moved);
call!(ZipDir(ZipDir) => Zip, limit: |r: &ZipDir| encoded(r.max_bytes));
call!(KillAll(KillAll) => Done);
call!(RunCode(RunCodeSpec) => CodeOutcome, limit: |_: &RunCodeSpec| OUTPUT_REPLY, env);
call!(CreateContext(CreateContext) => ContextInfo, limit: small, env);
call!(ListContexts(ListContexts) => ContextList);
call!(DeleteContext(DeleteContext) => ContextDeleted);
call!(StartJob(StartJob) => JobInfo, limit: small, env);
call!(JobStatus(JobStatus) => JobInfo, limit: |r: &JobStatus| {
    ((r.max_bytes as usize).saturating_mul(6) + SMALL_REPLY).min(MAX_FRAME)
});
call!(KillJob(KillJob) => JobInfo);
call!(StartDesktop(StartDesktop) => DesktopStarted);
call!(Screenshot(Screenshot) => Shot, limit: |r: &Screenshot| encoded(r.screen.raw_bytes()));
call!(Input(Input) => InputDone);
call!(ListJobs(ListJobs) => JobList, limit: |_: &ListJobs| OUTPUT_REPLY);

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
    /// Variables an interpreter this cell starts gets beside the sandbox's (a running one keeps
    /// its own).
    #[serde(default)]
    pub env: Vec<(String, String)>,
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

/// What the agent sends back: output as it happens (exec and run_code only), then the reply or
/// an error.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame<R> {
    Output(Output),
    Reply(R),
    Error(AgentError),
}

/// Output a command printed, streamed while it runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Output {
    pub stream: Stream,
    pub data: String,
}

/// Why a request failed; the engine maps the kind to an API error code.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
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

/// A desktop's screen size. Every desktop request carries it, so an agent that restarted, or a
/// sandbox whose display server was killed (a restore stops every process), brings the display
/// back up as it was, instead of failing.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Screen {
    pub width: u16,
    pub height: u16,
}

impl Screen {
    /// Bytes of the screen as 8-bit RGB: what a PNG of it can cost at worst.
    pub fn raw_bytes(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height) * 3 + 4096
    }
}

/// Start the display server and the window manager (if they are not running already).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartDesktop {
    pub screen: Screen,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DesktopStarted {
    /// False when it was running already.
    pub started: bool,
    /// The window manager running, if the sandbox has one.
    pub window_manager: Option<String>,
}

/// The screen as a PNG, with the pointer drawn in, scaled by `scale` (0 < scale ≤ 1).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Screenshot {
    pub screen: Screen,
    pub scale: f64,
    /// Wait (up to a second) until the screen stops changing first.
    pub settle: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Shot {
    /// Size of the PNG (the screen's, times the scale).
    pub width: u32,
    pub height: u32,
    pub cursor_x: i32,
    pub cursor_y: i32,
    pub png_b64: String,
}

/// Mouse and keyboard input, in screen pixels.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Input {
    pub screen: Screen,
    pub action: InputAction,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputAction {
    Move {
        x: u16,
        y: u16,
    },
    /// `count` presses of `button` (1 left, 2 middle, 3 right), at (x, y) or where the pointer is.
    Click {
        at: Option<(u16, u16)>,
        button: u8,
        count: u8,
    },
    Drag {
        from: (u16, u16),
        to: (u16, u16),
    },
    /// Wheel clicks; `button` 4 up, 5 down, 6 left, 7 right.
    Scroll {
        at: Option<(u16, u16)>,
        button: u8,
        amount: u8,
    },
    Type {
        text: String,
    },
    /// Key combinations separated by spaces (`ctrl+s`, `Return`, `ctrl+a BackSpace`).
    Key {
        keys: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InputDone {
    pub cursor_x: i32,
    pub cursor_y: i32,
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
    // A clean end is one before the header starts; an end inside it is a broken frame.
    match r.read_exact(&mut len[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut len[1..]).await?;
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

/// Writes an `Output` frame (its reply type does not matter: the frame carries none).
pub async fn write_output<W: AsyncWrite + Unpin>(
    w: &mut W,
    stream: Stream,
    data: String,
) -> std::io::Result<()> {
    write_frame(w, &Frame::<Done>::Output(Output { stream, data })).await
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

/// Why an exchange with an agent ended without its reply or its error.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("the sandbox's agent hung up: {0}")]
    HungUp(#[source] std::io::Error),
    #[error("the sandbox's agent closed the connection (it may have run out of memory)")]
    Closed,
    #[error("the sandbox's agent broke the protocol: {0}")]
    Broken(#[source] std::io::Error),
}

/// One exchange with an agent on `conn`: sends `call` and reads frames until its reply or the
/// agent's error (output frames are skipped). The outer error is a broken connection or
/// protocol; deadlines, activity and recovery are the caller's.
pub async fn exchange<S, C>(
    conn: &mut S,
    call: C,
) -> Result<Result<C::Reply, AgentError>, ExchangeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: Call,
{
    let limit = call.reply_limit();
    write_frame(conn, &call.into())
        .await
        .map_err(ExchangeError::HungUp)?;
    loop {
        match read_frame_limited::<_, Frame<C::Reply>>(conn, limit).await {
            Ok(Some(Frame::Output(_))) => continue,
            Ok(Some(Frame::Reply(reply))) => return Ok(Ok(reply)),
            Ok(Some(Frame::Error(e))) => return Ok(Err(e)),
            Ok(None) => return Err(ExchangeError::Closed),
            Err(e) => return Err(ExchangeError::Broken(e)),
        }
    }
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
        let err = read_frame_limited::<_, Frame<Pong>>(&mut input, Ping {}.reply_limit())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        // Requests that carry file contents allow what they can carry, and no more.
        let read = ReadFile {
            path: "x".into(),
            max_bytes: 1 << 20,
        };
        assert!(read.reply_limit() > (1 << 20) * 4 / 3 && read.reply_limit() < 2 << 20);
        assert!(ListJobs {}.reply_limit() <= MAX_FRAME);
    }

    #[tokio::test]
    async fn an_end_inside_a_header_is_no_clean_end() {
        let mut input: &[u8] = &[];
        let none = read_frame::<_, Frame<Pong>>(&mut input).await.unwrap();
        assert_eq!(none, None);
        let mut input: &[u8] = &[0, 0];
        let err = read_frame::<_, Frame<Pong>>(&mut input).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_reply_of_another_request_fails_to_decode() {
        let mut wire = Vec::new();
        let pong: Frame<Pong> = Frame::Reply(Pong {
            pid: 1,
            version: "x".into(),
        });
        write_frame(&mut wire, &pong).await.unwrap();
        let mut input: &[u8] = &wire;
        let decoded = read_frame::<_, Frame<Deleted>>(&mut input).await;
        assert!(decoded.is_err(), "a Pong decoded as a delete's reply");
        // And the right one round-trips, with requests tagged by `op`.
        let mut input: &[u8] = &wire;
        let decoded = read_frame::<_, Frame<Pong>>(&mut input).await.unwrap();
        assert_eq!(decoded, Some(pong));
        let request: Request = KillJob {
            job_id: "job_1".into(),
        }
        .into();
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            serde_json::json!({"op": "kill_job", "job_id": "job_1"})
        );
    }
}
