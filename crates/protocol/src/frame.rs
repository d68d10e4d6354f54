//! Frames on the wire: a 4-byte big-endian length and that many bytes of JSON, at most
//! [`MAX_FRAME`] (or a request's own smaller limit, checked before anything is buffered). The
//! agent answers a request with `Output` frames (exec and run_code only), then its reply or an
//! `Error`; [`exchange`] is the engine's side of one request.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Call, Done};

/// Largest frame either side accepts: an 8 MiB file base64-encoded, or a 10 MiB zip, plus JSON.
pub const MAX_FRAME: usize = 24 * 1024 * 1024;

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

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
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
    w.write_all(&encode_frame(value)?).await?;
    w.flush().await
}

/// One frame as the bytes [`write_frame`] sends: for a request that may be sent again
/// ([`ExchangeError::not_taken`]) without encoding it twice.
pub fn encode_frame<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
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
    Ok(frame)
}

/// Why an exchange with an agent ended without its reply or its error.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The request could not be written whole: the agent never had all of it.
    #[error("the sandbox's agent hung up: {0}")]
    HungUp(#[source] std::io::Error),
    /// The connection was reset before any answer: the agent's end closed with the request
    /// still unread (a unix socket that closes with data in its queue, or a listener that
    /// closes with connections it never accepted, resets them: the window while an agent
    /// dies). An agent that has read a request ends the connection cleanly instead.
    #[error("the sandbox's agent closed the connection before reading the request: {0}")]
    Unread(#[source] std::io::Error),
    #[error("the sandbox's agent closed the connection (it may have run out of memory)")]
    Closed,
    #[error("the sandbox's agent broke the protocol: {0}")]
    Broken(#[source] std::io::Error),
}

impl ExchangeError {
    /// A failed read, after `answered` frames of the agent's answer.
    pub fn reading(e: std::io::Error, answered: bool) -> Self {
        if !answered && e.kind() == std::io::ErrorKind::ConnectionReset {
            Self::Unread(e)
        } else {
            Self::Broken(e)
        }
    }

    /// Whether the agent cannot have acted on the request, which it never had whole: sending
    /// it again (to a restarted agent) does not run anything twice.
    pub fn not_taken(&self) -> bool {
        matches!(self, Self::HungUp(_) | Self::Unread(_))
    }
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
    let request = encode_frame(&call.into()).map_err(ExchangeError::HungUp)?;
    exchange_frame(conn, &request, limit).await
}

/// Sends a request already encoded ([`encode_frame`]); if this fails, the agent never had all
/// of it.
pub async fn send_frame<W: AsyncWrite + Unpin>(
    conn: &mut W,
    request: &[u8],
) -> Result<(), ExchangeError> {
    async {
        conn.write_all(request).await?;
        conn.flush().await
    }
    .await
    .map_err(ExchangeError::HungUp)
}

/// [`exchange`] of a request already encoded ([`encode_frame`]), whose reply frames may be
/// up to `limit` bytes.
pub async fn exchange_frame<S, R>(
    conn: &mut S,
    request: &[u8],
    limit: usize,
) -> Result<Result<R, AgentError>, ExchangeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: for<'de> Deserialize<'de>,
{
    send_frame(conn, request).await?;
    read_answer(conn, limit).await
}

/// The agent's answer to a request sent on `conn`: its reply or its error, after any output
/// frames (skipped), each frame up to `limit` bytes.
pub async fn read_answer<S, R>(
    conn: &mut S,
    limit: usize,
) -> Result<Result<R, AgentError>, ExchangeError>
where
    S: AsyncRead + Unpin,
    R: for<'de> Deserialize<'de>,
{
    let mut answered = false;
    loop {
        match read_frame_limited::<_, Frame<R>>(conn, limit).await {
            Ok(Some(Frame::Output(_))) => answered = true,
            Ok(Some(Frame::Reply(reply))) => return Ok(Ok(reply)),
            Ok(Some(Frame::Error(e))) => return Ok(Err(e)),
            Ok(None) => return Err(ExchangeError::Closed),
            Err(e) => return Err(ExchangeError::reading(e, answered)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{Call, Deleted, KillJob, ListJobs, Ping, Pong, ReadFile, Request};

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

    /// A listening socket at a fresh path, removed when dropped.
    struct Listening(std::path::PathBuf, std::os::unix::net::UnixListener);

    impl Listening {
        fn new(name: &str) -> Self {
            let path = std::env::temp_dir().join(format!("frame-{}-{name}", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            Self(path, listener)
        }

        async fn connect(&self) -> tokio::net::UnixStream {
            tokio::net::UnixStream::connect(&self.0).await.unwrap()
        }
    }

    impl Drop for Listening {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// What an exchange of a `ReadFile` (a request of some size) reports when the far end does
    /// `agent` with the connection, once the request is on its way.
    async fn exchange_against(
        name: &str,
        agent: impl FnOnce(std::os::unix::net::UnixListener) + Send + 'static,
    ) -> ExchangeError {
        let listening = Listening::new(name);
        let mut conn = listening.connect().await;
        let request = ReadFile {
            path: "x".repeat(1000),
            max_bytes: 1,
        };
        let limit = request.reply_limit();
        let frame = encode_frame(&Request::from(request)).unwrap();
        conn.write_all(&frame).await.unwrap();
        let listener = listening.1.try_clone().unwrap();
        drop(listening);
        std::thread::spawn(move || agent(listener)).join().unwrap();
        // What is left of the exchange once the request is written: its answer.
        let answer = read_answer::<_, Deleted>(&mut conn, limit).await;
        answer.expect_err("the far end never answers")
    }

    #[tokio::test]
    async fn a_request_the_agent_never_read_is_told_from_one_it_read() {
        // The agent's listener closes with the connection still in its queue (an agent that
        // dies before accepting it): reset, the request untaken.
        let e = exchange_against("never-accepted", drop).await;
        assert!(
            matches!(e, ExchangeError::Unread(_)) && e.not_taken(),
            "{e:?}"
        );
        // Accepted, and closed with half of the request read.
        let e = exchange_against("half-read", |l| {
            let (mut c, _) = l.accept().unwrap();
            std::io::Read::read_exact(&mut c, &mut [0u8; 500]).unwrap();
        })
        .await;
        assert!(e.not_taken(), "{e:?}");
        // Read whole, then closed without a word (an agent that dies running it): taken, and
        // never to be sent again.
        let e = exchange_against("read-whole", |l| {
            let (mut c, _) = l.accept().unwrap();
            let mut len = [0u8; 4];
            std::io::Read::read_exact(&mut c, &mut len).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            std::io::Read::read_exact(&mut c, &mut body).unwrap();
        })
        .await;
        assert!(
            matches!(e, ExchangeError::Closed) && !e.not_taken(),
            "{e:?}"
        );
        // Written after the agent's end is gone: the write fails, the request untaken.
        let listening = Listening::new("closed-before-write");
        let mut conn = listening.connect().await;
        drop(listening);
        let e = send_frame(&mut conn, &encode_frame(&Request::from(Ping {})).unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(e, ExchangeError::HungUp(_)) && e.not_taken(),
            "{e:?}"
        );
        // A reset after some output can only come from a broken agent: never untaken.
        let e = ExchangeError::reading(std::io::ErrorKind::ConnectionReset.into(), true);
        assert!(!e.not_taken(), "{e:?}");
    }
}
