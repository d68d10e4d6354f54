//! A process attached to its caller: started with its stdin, stdout and stderr on the connection
//! that asked for it (an MCP server speaking JSON-RPC on stdio, say).
//!
//! The agent answers [`Attach`] with [`Attached`] (or an error) like any request; from then on the
//! connection carries [`Chunk`]s both ways — stdin from the engine, stdout, stderr and finally the
//! exit status from the agent. On the agent's connection a chunk is a kind byte, a 4-byte
//! big-endian length and its bytes; in a WebSocket message (the engine API's `attach_process`) it
//! is the kind byte and its bytes, the message being the length. The engine turns one into the
//! other and never looks inside.
//!
//! Closing stdin ([`Chunk::CloseStdin`], or the connection ending) is the process's EOF; a process
//! that has not exited a few seconds after the connection ended is killed, with its group.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest chunk either side sends: the agent reads output 64 KiB at a time, and a sender with
/// more splits it.
pub const MAX_CHUNK: usize = 1024 * 1024;

/// Start `argv` (looked up on the sandbox's `PATH`) attached to this connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Attach {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    /// An account of the sandbox's `/etc/passwd` to run as (with its home, shell and name in the
    /// environment); the sandbox's root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run on a terminal of this size: its output arrives as [`Chunk::Stdout`] (the terminal
    /// merges both streams), [`Chunk::Stdin`] is typed into it, and [`Chunk::Resize`] resizes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalSize>,
}

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

/// The attached process: listed with the sandbox's jobs (its log holds its stderr).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Attached {
    pub job_id: String,
    pub pid: i32,
}

call!(Attach(Attach) => Attached, limit: crate::call::small, env);

/// What travels after [`Attached`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Bytes for the process's stdin (caller → process).
    Stdin(Vec<u8>),
    /// The end of the process's stdin (caller → process).
    CloseStdin,
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// A new size for the process's terminal (caller → process; ignored without one).
    Resize(TerminalSize),
    /// How the process ended; the last chunk the agent sends.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

const STDIN: u8 = 0;
const CLOSE_STDIN: u8 = 1;
const STDOUT: u8 = 2;
const STDERR: u8 = 3;
const EXIT: u8 = 4;
const RESIZE: u8 = 5;

#[derive(Serialize, Deserialize)]
struct ExitStatus {
    exit_code: Option<i32>,
    signal: Option<i32>,
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

impl Chunk {
    fn kind(&self) -> u8 {
        match self {
            Chunk::Stdin(_) => STDIN,
            Chunk::CloseStdin => CLOSE_STDIN,
            Chunk::Stdout(_) => STDOUT,
            Chunk::Stderr(_) => STDERR,
            Chunk::Exit { .. } => EXIT,
            Chunk::Resize(_) => RESIZE,
        }
    }

    fn payload(&self) -> Vec<u8> {
        match self {
            Chunk::Stdin(d) | Chunk::Stdout(d) | Chunk::Stderr(d) => d.clone(),
            Chunk::CloseStdin => Vec::new(),
            Chunk::Resize(size) => [size.cols.to_be_bytes(), size.rows.to_be_bytes()].concat(),
            Chunk::Exit { exit_code, signal } => serde_json::to_vec(&ExitStatus {
                exit_code: *exit_code,
                signal: *signal,
            })
            .unwrap_or_default(),
        }
    }

    fn from_parts(kind: u8, payload: Vec<u8>) -> std::io::Result<Self> {
        Ok(match kind {
            STDIN => Chunk::Stdin(payload),
            CLOSE_STDIN if payload.is_empty() => Chunk::CloseStdin,
            CLOSE_STDIN => return Err(invalid("an end of stdin carrying bytes".into())),
            STDOUT => Chunk::Stdout(payload),
            STDERR => Chunk::Stderr(payload),
            EXIT => {
                let s: ExitStatus = serde_json::from_slice(&payload)
                    .map_err(|e| invalid(format!("a malformed exit status: {e}")))?;
                Chunk::Exit {
                    exit_code: s.exit_code,
                    signal: s.signal,
                }
            }
            RESIZE => match payload[..] {
                [c0, c1, r0, r1] => Chunk::Resize(TerminalSize {
                    cols: u16::from_be_bytes([c0, c1]),
                    rows: u16::from_be_bytes([r0, r1]),
                }),
                _ => return Err(invalid("a terminal size is 4 bytes".into())),
            },
            other => return Err(invalid(format!("unknown chunk kind {other}"))),
        })
    }

    /// The chunk as one WebSocket message: its kind byte, then its bytes.
    pub fn to_message(&self) -> Vec<u8> {
        let payload = self.payload();
        let mut m = Vec::with_capacity(1 + payload.len());
        m.push(self.kind());
        m.extend_from_slice(&payload);
        m
    }

    /// A chunk from one WebSocket message (at most [`MAX_CHUNK`] bytes of payload).
    pub fn from_message(message: &[u8]) -> std::io::Result<Self> {
        let Some((&kind, payload)) = message.split_first() else {
            return Err(invalid("an empty message".into()));
        };
        if payload.len() > MAX_CHUNK {
            return Err(invalid(format!(
                "a chunk of {} bytes exceeds the {MAX_CHUNK}-byte limit",
                payload.len()
            )));
        }
        Self::from_parts(kind, payload.to_vec())
    }
}

/// Reads one chunk; `Ok(None)` on a clean end before one starts.
pub async fn read_chunk<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Chunk>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut head[1..]).await?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_CHUNK {
        return Err(invalid(format!(
            "a chunk of {len} bytes exceeds the {MAX_CHUNK}-byte limit"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Chunk::from_parts(head[0], payload).map(Some)
}

/// Writes one chunk (data over [`MAX_CHUNK`] is split into several).
pub async fn write_chunk<W: AsyncWrite + Unpin>(w: &mut W, chunk: &Chunk) -> std::io::Result<()> {
    let kind = chunk.kind();
    let payload = chunk.payload();
    let mut parts = payload.chunks(MAX_CHUNK).peekable();
    if parts.peek().is_none() {
        w.write_all(&[kind, 0, 0, 0, 0]).await?;
    }
    for part in parts {
        let mut buf = Vec::with_capacity(5 + part.len());
        buf.push(kind);
        buf.extend_from_slice(&(part.len() as u32).to_be_bytes());
        buf.extend_from_slice(part);
        w.write_all(&buf).await?;
    }
    w.flush().await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_round_trip_on_the_wire_and_as_messages() {
        let chunks = [
            Chunk::Stdin(b"{\"jsonrpc\":\"2.0\"}\n".to_vec()),
            Chunk::CloseStdin,
            Chunk::Stdout(vec![0, 255, 10]),
            Chunk::Stderr(Vec::new()),
            Chunk::Resize(TerminalSize { cols: 300, rows: 2 }),
            Chunk::Exit {
                exit_code: Some(3),
                signal: None,
            },
        ];
        let mut wire = Vec::new();
        for c in &chunks {
            write_chunk(&mut wire, c).await.unwrap();
            assert_eq!(&Chunk::from_message(&c.to_message()).unwrap(), c);
        }
        let mut input: &[u8] = &wire;
        for c in &chunks {
            assert_eq!(read_chunk(&mut input).await.unwrap().as_ref(), Some(c));
        }
        assert_eq!(read_chunk(&mut input).await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_unknown_and_empty_chunks_are_refused() {
        let mut head: &[u8] = &[STDOUT, 0xff, 0, 0, 0];
        assert!(read_chunk(&mut head).await.is_err());
        assert!(Chunk::from_message(&[9, 1]).is_err());
        assert!(Chunk::from_message(&[]).is_err());
        assert!(Chunk::from_message(&[EXIT, b'x']).is_err());
        assert!(Chunk::from_message(&[CLOSE_STDIN, b'x']).is_err());
        assert!(Chunk::from_message(&[RESIZE, 0, 80, 0]).is_err());
        // Data over the limit is split, never sent as one chunk.
        let mut wire = Vec::new();
        write_chunk(&mut wire, &Chunk::Stdout(vec![7; MAX_CHUNK + 1]))
            .await
            .unwrap();
        let mut input: &[u8] = &wire;
        let first = read_chunk(&mut input).await.unwrap().unwrap();
        let second = read_chunk(&mut input).await.unwrap().unwrap();
        assert_eq!(first, Chunk::Stdout(vec![7; MAX_CHUNK]));
        assert_eq!(second, Chunk::Stdout(vec![7]));
    }
}
