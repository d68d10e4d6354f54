//! The pod multiplexer's frame format: the engine's many short connections to a pod's agent
//! travel over one exec's stdin and stdout, each frame a stream id, a kind (open, data, close)
//! and a payload. The engine's end is the kubernetes driver's; the pod's end is the agent's
//! `__agent-mux`.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Where the agent binary, its socket and nothing else live in the pod (an `emptyDir`).
pub const AGENT_DIR: &str = "/.sandbox-mcp";
/// The agent's socket inside [`AGENT_DIR`].
pub const AGENT_SOCKET: &str = "/.sandbox-mcp/agent.sock";

/// Frame kinds of the multiplexer.
pub const OPEN: u8 = 1;
pub const DATA: u8 = 2;
pub const CLOSE: u8 = 3;
/// Largest payload of one frame: a peer that sends more is broken or hostile.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Header: stream id (u32), kind (u8), payload length (u32), all big-endian.
pub const HEADER: usize = 9;

/// Writes one frame's header into a buffer followed by `payload`.
pub fn frame(id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: `Ok(None)` on a clean end of stream. A payload over [`MAX_PAYLOAD`] or an
/// unknown kind is an error (the stream cannot be trusted past it).
pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<(u32, u8, Vec<u8>)>> {
    let mut header = [0u8; HEADER];
    match r.read_exact(&mut header[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut header[1..]).await?;
    let id = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let kind = header[4];
    let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
    if !(OPEN..=CLOSE).contains(&kind) || len > MAX_PAYLOAD || (kind != DATA && len != 0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad multiplexer frame (kind {kind}, {len} bytes)"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((id, kind, payload)))
}

/// Sends what `read` yields as data frames of stream `id` until it ends (or fails), or until
/// nobody takes frames any more.
pub async fn send_data<R: tokio::io::AsyncRead + Unpin>(
    read: &mut R,
    id: u32,
    tx: &mpsc::Sender<Vec<u8>>,
) {
    let mut buf = vec![0u8; MAX_PAYLOAD];
    while let Ok(n @ 1..) = read.read(&mut buf).await {
        if tx.send(frame(id, DATA, &buf[..n])).await.is_err() {
            return;
        }
    }
}

/// Writes the frames queued on `rx` to `out`, one whole frame at a time, until the queue closes
/// or `out` fails.
pub async fn write_frames<W: tokio::io::AsyncWrite + Unpin>(
    rx: &mut mpsc::Receiver<Vec<u8>>,
    out: &mut W,
) {
    while let Some(bytes) = rx.recv().await {
        if out.write_all(&bytes).await.is_err() || out.flush().await.is_err() {
            return;
        }
    }
}
