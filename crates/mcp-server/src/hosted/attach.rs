//! The client's side of `attach_process`: a process in a sandbox whose stdio travels over a
//! WebSocket, as [`Input`] (its stdin) and [`Output`] (its stdout, stderr and exit).

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use sandbox_mcp_api::{Client, types};
use sandbox_mcp_protocol::{Chunk, MAX_CHUNK};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

type Socket = WebSocketStream<reqwest::Upgraded>;

/// A started process.
pub struct Attached {
    pub job_id: String,
    pub pid: i32,
    pub input: Input,
    pub output: Output,
}

/// The process's stdin.
pub struct Input(SplitSink<Socket, Message>);

/// What the process writes, and how it ends.
pub struct Output(SplitStream<Socket>);

/// Why a process could not be attached: the engine's words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AttachError(pub String);

/// Starts `request` in sandbox `sandbox_id`, attached.
pub async fn attach(
    client: &Client,
    sandbox_id: &str,
    request: &types::AttachRequest,
) -> Result<Attached, AttachError> {
    let upgraded = client
        .attach_process()
        .sandbox_id(sandbox_id)
        .send()
        .await
        .map_err(|e| AttachError(crate::call::error_text(e)))?
        .into_inner();
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_CHUNK + 64 * 1024))
        .max_frame_size(Some(MAX_CHUNK + 64 * 1024));
    let mut socket = WebSocketStream::from_raw_socket(upgraded, Role::Client, Some(config)).await;
    let text = serde_json::to_string(request).map_err(|e| AttachError(e.to_string()))?;
    socket
        .send(Message::text(text))
        .await
        .map_err(|e| AttachError(format!("the engine hung up: {e}")))?;
    let answer = match socket.next().await {
        Some(Ok(Message::Text(t))) => t,
        Some(Ok(other)) => return Err(AttachError(format!("the engine answered {other:?}"))),
        Some(Err(e)) => return Err(AttachError(format!("the engine hung up: {e}"))),
        None => return Err(AttachError("the engine hung up".into())),
    };
    let value: serde_json::Value =
        serde_json::from_str(answer.as_str()).map_err(|e| AttachError(e.to_string()))?;
    if let Some(message) = value.get("message").and_then(serde_json::Value::as_str) {
        return Err(AttachError(message.to_string()));
    }
    let attachment: types::Attachment =
        serde_json::from_value(value).map_err(|e| AttachError(e.to_string()))?;
    let (sink, stream) = socket.split();
    Ok(Attached {
        job_id: attachment.job_id.to_string(),
        pid: attachment.pid,
        input: Input(sink),
        output: Output(stream),
    })
}

impl Input {
    /// Writes `data` to the process's stdin (in chunks of at most 1 MiB).
    pub async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        for part in data.chunks(MAX_CHUNK) {
            let m = Chunk::Stdin(part.to_vec()).to_message();
            self.0
                .send(Message::binary(m))
                .await
                .map_err(std::io::Error::other)?;
        }
        Ok(())
    }

    /// Ends the process's stdin (it reads EOF).
    pub async fn close(&mut self) -> std::io::Result<()> {
        self.0
            .send(Message::binary(Chunk::CloseStdin.to_message()))
            .await
            .map_err(std::io::Error::other)
    }

    /// Hangs up: the engine ends the process's stdin, and kills it if it stays.
    pub async fn hang_up(mut self) {
        let _ = self.0.close().await;
    }
}

impl Output {
    /// The next chunk: stdout, stderr, or the exit (the last); `None` when the connection ended
    /// without one.
    pub async fn next(&mut self) -> Option<std::io::Result<Chunk>> {
        loop {
            match self.0.next().await? {
                Ok(Message::Binary(data)) => return Some(Chunk::from_message(&data)),
                Ok(Message::Close(_)) => return None,
                Ok(_) => continue,
                Err(e) => return Some(Err(std::io::Error::other(e))),
            }
        }
    }
}
