//! `attach_process`: a process whose stdio travels over a WebSocket. The engine starts it through
//! the sandbox's agent and turns the agent's chunks into messages and back, without looking inside
//! them (see [`sandbox_mcp_protocol::Chunk`]).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::request::{AppState, check_env};
use sandbox_mcp_api::server::{Caller, WebSocket, WebSocketUpgrade};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_protocol::{Attach, Chunk, MAX_CHUNK, read_chunk, write_chunk};

/// How long the client has to answer our close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long the client has to send its request once the socket is open.
const REQUEST_WAIT: Duration = Duration::from_secs(30);

pub(super) async fn attach(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    upgrade: WebSocketUpgrade,
) -> Result<axum::response::Response, EngineError> {
    // An unknown sandbox is refused as such, before anything is upgraded.
    state
        .manager
        .lifecycle
        .get(&id, caller.tenant(), false)
        .await?;
    let state = state.clone();
    let request_id = sandbox_mcp_model::ids::current_request_id();
    // One byte of kind over the largest chunk, and room for the request's JSON.
    upgrade
        .accept(MAX_CHUNK + 64 * 1024, move |socket| async move {
            serve(state, caller, id, socket, request_id).await;
        })
        .map_err(<AppState as sandbox_mcp_api::server::EngineApi>::rejected)
}

async fn refuse(mut socket: WebSocket, e: EngineError, request_id: &str) {
    e.log(request_id);
    let body = e.body(request_id);
    let _ = socket.send(Message::text(body.to_string())).await;
    let _ = socket.close(None).await;
}

/// The client's request: the first message, JSON text.
async fn request(socket: &mut WebSocket) -> Result<Attach, EngineError> {
    let text = match tokio::time::timeout(REQUEST_WAIT, socket.next()).await {
        Ok(Some(Ok(Message::Text(text)))) => text,
        Ok(Some(Ok(_))) => {
            return Err(EngineError::InvalidArgument(
                "the first message must be the AttachRequest, as JSON text".into(),
            ));
        }
        Ok(_) => {
            return Err(EngineError::InvalidArgument(
                "the socket closed before the AttachRequest".into(),
            ));
        }
        Err(_) => {
            return Err(EngineError::InvalidArgument(format!(
                "no AttachRequest within {} s of opening the socket",
                REQUEST_WAIT.as_secs()
            )));
        }
    };
    let body: types::AttachRequest = serde_json::from_str(text.as_str())
        .map_err(|e| EngineError::InvalidArgument(format!("invalid AttachRequest: {e}")))?;
    use sandbox_mcp_api::limits::attach_request as limit;
    if body.command.is_empty()
        || body.command.len() > limit::COMMAND_MAX_ITEMS
        || body
            .command
            .iter()
            .any(|a| a.len() > limit::COMMAND_ITEMS_MAX_LENGTH)
    {
        return Err(EngineError::InvalidArgument(format!(
            "command must have 1 to {} parts of at most {} bytes each",
            limit::COMMAND_MAX_ITEMS,
            limit::COMMAND_ITEMS_MAX_LENGTH
        )));
    }
    let env = match &body.env {
        Some(env) => check_env(env)?,
        None => Vec::new(),
    };
    Ok(Attach {
        argv: body.command.iter().map(|a| a.to_string()).collect(),
        cwd: body.cwd.as_ref().map(|c| c.to_string()),
        env,
        user: None,
        terminal: None,
    })
}

async fn serve(
    state: AppState,
    caller: Caller,
    id: types::SandboxId,
    mut socket: WebSocket,
    request_id: String,
) {
    let spec = match request(&mut socket).await {
        Ok(spec) => spec,
        Err(e) => return refuse(socket, e, &request_id).await,
    };
    let attachment = match state.manager.agent.attach(&id, caller.tenant(), spec).await {
        Ok(a) => a,
        Err(e) => return refuse(socket, e, &request_id).await,
    };
    let answer = serde_json::json!({
        "job_id": attachment.attached.job_id,
        "pid": attachment.attached.pid,
    });
    if socket
        .send(Message::text(answer.to_string()))
        .await
        .is_err()
    {
        return;
    }
    let (mut agent_rd, mut agent_wr) = tokio::io::split(attachment.conn);
    let (mut sink, mut messages) = socket.split();
    // The client's stdin to the agent; anything but stdin from the client ends the attachment.
    // Whether the client went (true), or the agent stopped taking stdin (false: the process
    // ended, and its last output and exit status are still to be passed on).
    let inbound = async {
        while let Some(Ok(message)) = messages.next().await {
            let chunk = match message {
                Message::Binary(data) => match Chunk::from_message(&data) {
                    Ok(c @ (Chunk::Stdin(_) | Chunk::CloseStdin)) => c,
                    _ => return true,
                },
                Message::Close(_) => return true,
                _ => continue,
            };
            if write_chunk(&mut agent_wr, &chunk).await.is_err() {
                return false;
            }
        }
        true
    };
    // The process's output and exit to the client, until the agent closes.
    let outbound = async {
        while let Ok(Some(chunk)) = read_chunk(&mut agent_rd).await {
            if matches!(chunk, Chunk::Stdin(_) | Chunk::CloseStdin) {
                break;
            }
            let last = matches!(chunk, Chunk::Exit { .. });
            if sink
                .send(Message::binary(chunk.to_message()))
                .await
                .is_err()
            {
                return;
            }
            if last {
                break;
            }
        }
        let _ = sink.close().await;
    };
    tokio::pin!(outbound);
    // The client going ends the attachment at once: the agent's connection is dropped, which
    // the agent takes as the caller hanging up (the process's stdin ends; it is killed if it
    // stays). The process ending lets its last words through first.
    let client_gone = tokio::select! {
        client_gone = inbound => {
            if !client_gone {
                outbound.await;
            }
            client_gone
        }
        () = &mut outbound => false,
    };
    // Our close is sent: take what the client still sends until its close comes (briefly), so
    // that closing the connection with its messages unread does not reset it before it read the
    // exit status.
    if !client_gone {
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            while let Some(Ok(m)) = messages.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
    drop(attachment.attached);
}
