//! Line framing for the stdio transport, in front of rmcp.
//!
//! rmcp drops an over-long or malformed line silently, which leaves the client waiting forever
//! for an answer. This layer reads stdin itself: a line over [`MAX_LINE`] is discarded as it
//! streams in (memory stays bounded), its JSON-RPC `id` is picked out on the way, and the client
//! gets an error response for that id at once; every other line is checked by [`jsonrpc::check`]
//! and answered here when it is not a valid message. Everything written to stdout goes through
//! one writer task, so protocol lines never interleave; nothing else in the process writes to
//! stdout.
//!
//! rmcp's messages are written by [`Transport`]: each is serialized into one buffer and handed
//! to the writer, without rmcp's line codec (which writes a message piece by piece into its frame
//! buffer) or a second copy through a pipe. The answer to `tools/list`, the largest message a
//! session sends (about 130 KB with all tools) and the same each time, is serialized once and
//! reused while the list is unchanged.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{
    JsonRpcMessage, JsonRpcResponse, ListToolsResult, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::RxJsonRpcMessage;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

use super::jsonrpc::{self, Check, IdScanner};

/// Longest request line accepted: room for an 8 MiB file sent base64-encoded, with overhead.
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;

/// Runs `serve` with an rmcp transport while framing `input`/`output`. Returns when `serve` ends
/// (stdin EOF closes rmcp's input, which ends the session).
pub async fn frame<R, W, F, Fut>(input: R, mut output: W, serve: F) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    F: FnOnce(Transport) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let (mut to_rmcp, rmcp_in) = tokio::io::duplex(1 << 20);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(1 << 20);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);

    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });

    let transport = Transport {
        lines: AsyncRwTransport::new_server(rmcp_in, rmcp_out),
        out: tx.clone(),
        listed: None,
    };
    // What rmcp's own line transport still writes (its answer to a message it could not read)
    // comes through this pipe.
    let out_tx = tx.clone();
    let relay = tokio::spawn(async move {
        let mut reader = BufReader::new(from_rmcp);
        loop {
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = jsonrpc::add_null_id(&line).unwrap_or(line);
                    if out_tx.send(line).await.is_err() {
                        break;
                    }
                }
            }
        }
    });

    let pump = tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(256 * 1024, input);
        let mut line: Vec<u8> = Vec::new();
        let mut oversized: Option<(usize, IdScanner)> = None;
        loop {
            let chunk = match reader.fill_buf().await {
                Ok([]) | Err(_) => break,
                Ok(chunk) => chunk,
            };
            let (part, complete) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (&chunk[..=i], true),
                None => (chunk, false),
            };
            let used = part.len();
            match &mut oversized {
                Some((len, scanner)) => {
                    *len += used;
                    scanner.feed(part);
                }
                None if line.len() + used > MAX_LINE => {
                    let mut scanner = IdScanner::default();
                    scanner.feed(&line);
                    scanner.feed(part);
                    oversized = Some((line.len() + used, scanner));
                    line = Vec::new(); // release the memory now
                }
                None => line.extend_from_slice(part),
            }
            reader.consume(used);
            if complete {
                if let Some((len, scanner)) = oversized.take() {
                    tracing::warn!(bytes = len, "rejected a request line over the size limit");
                    // Without a readable id (garbage, `"id": null`, or an id-less message) the
                    // answer carries `"id": null`, as JSON-RPC wants when the id cannot be told.
                    // Notifications are small; one this size is not told apart from garbage.
                    let id = scanner.id().unwrap_or(serde_json::Value::Null);
                    let _ = tx.send(too_large_response(&id, len)).await;
                } else if line.iter().any(|b| !b.is_ascii_whitespace()) {
                    let body = line.strip_suffix(b"\n").unwrap_or(&line);
                    let body = body.strip_suffix(b"\r").unwrap_or(body);
                    match jsonrpc::check(body) {
                        Check::Forward => {
                            if to_rmcp.write_all(&line).await.is_err() {
                                break;
                            }
                        }
                        Check::Answer(answer) => {
                            let mut bytes = serde_json::to_vec(&answer).unwrap_or_default();
                            bytes.push(b'\n');
                            let _ = tx.send(bytes).await;
                        }
                    }
                }
                line.clear();
            }
        }
        // Dropping `to_rmcp` signals EOF to rmcp, which ends the session.
        drop(to_rmcp);
    });

    let result = serve(transport).await;
    // The writer ends once every sender is gone: the pump's (aborted here), the transport's
    // (dropped with rmcp's session) and the relay's (which ends when rmcp drops its output).
    pump.abort();
    let _ = relay.await;
    let _ = writer.await;
    result
}

/// rmcp's side of the stdio framing: reads the lines the framing forwarded, writes each message
/// as one line to the writer.
pub struct Transport {
    lines: AsyncRwTransport<RoleServer, DuplexStream, DuplexStream>,
    out: mpsc::Sender<Vec<u8>>,
    /// The last `tools/list` result sent, and its JSON.
    listed: Option<(ListToolsResult, Arc<[u8]>)>,
}

impl Transport {
    /// One message as one line of JSON.
    fn encode(&mut self, message: &ServerJsonRpcMessage) -> serde_json::Result<Vec<u8>> {
        if let JsonRpcMessage::Response(JsonRpcResponse {
            id,
            result: ServerResult::ListToolsResult(list),
            ..
        }) = message
        {
            // Equal lists share their schemas (`Arc`s compared by address first), so telling
            // them equal costs a comparison of names and descriptions.
            let json = match &self.listed {
                Some((last, json)) if last == list => json.clone(),
                _ => {
                    let json: Arc<[u8]> = serde_json::to_vec(list)?.into();
                    self.listed = Some((list.clone(), json.clone()));
                    json
                }
            };
            // What serde writes for a response: `jsonrpc`, `id`, `result`, in that order.
            let mut line = Vec::with_capacity(json.len() + 64);
            line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
            serde_json::to_writer(&mut line, id)?;
            line.extend_from_slice(br#","result":"#);
            line.extend_from_slice(&json);
            line.extend_from_slice(b"}\n");
            return Ok(line);
        }
        let mut line = serde_json::to_vec(message)?;
        // A mended line comes with its newline.
        if let Some(mended) = jsonrpc::add_null_id(&line) {
            return Ok(mended);
        }
        line.push(b'\n');
        Ok(line)
    }
}

impl rmcp::transport::Transport<RoleServer> for Transport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        message: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let line = self.encode(&message).map_err(std::io::Error::other);
        let out = self.out.clone();
        async move {
            out.send(line?).await.map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed")
            })
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.lines.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.lines.close().await
    }
}

fn too_large_response(id: &serde_json::Value, len: usize) -> Vec<u8> {
    let message = format!(
        "request too large: the line is {len} bytes and the limit is {} MiB. Send large files in \
         parts (several sandbox_files_write calls) or create them inside the sandbox with sandbox_exec.",
        MAX_LINE / (1024 * 1024)
    );
    let response = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32600, "message": message},
    });
    let mut bytes = serde_json::to_vec(&response).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rmcp::model::{NumberOrString, Tool};
    use serde_json::json;

    use super::*;

    fn transport() -> Transport {
        let (a, b) = tokio::io::duplex(64);
        let (tx, _rx) = mpsc::channel(1);
        Transport {
            lines: AsyncRwTransport::new_server(a, b),
            out: tx,
            listed: None,
        }
    }

    fn tool(name: &'static str, description: &'static str) -> Tool {
        let schema = json!({"type": "object", "properties": {"q": {"type": "string", "description": "a \"quoted\" word\n"}}});
        Tool::new(
            name,
            description,
            Arc::new(schema.as_object().unwrap().clone()),
        )
    }

    fn listed(tools: Vec<Tool>, id: NumberOrString) -> ServerJsonRpcMessage {
        ServerJsonRpcMessage::response(
            ServerResult::ListToolsResult(ListToolsResult::with_all_items(tools)),
            id,
        )
    }

    fn as_serde_writes(message: &ServerJsonRpcMessage) -> Vec<u8> {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        line
    }

    #[test]
    fn a_tools_list_is_written_as_serde_writes_it_whether_reused_or_not() {
        let mut t = transport();
        let tools = vec![tool("a", "first ü"), tool("b", "second")];
        for id in [
            NumberOrString::Number(7),
            NumberOrString::String("x\"y".into()),
        ] {
            for _ in 0..2 {
                let message = listed(tools.clone(), id.clone());
                assert_eq!(t.encode(&message).unwrap(), as_serde_writes(&message));
            }
        }
        // A changed list is not answered with the last one's JSON.
        let mut changed = tools.clone();
        changed[1].description = Some("changed".into());
        let message = listed(changed, NumberOrString::Number(8));
        let line = t.encode(&message).unwrap();
        assert_eq!(line, as_serde_writes(&message));
        assert!(String::from_utf8(line).unwrap().contains("changed"));
        // As is a list with a tool more, and one with a different schema of the same text.
        let mut more = tools.clone();
        more.push(tool("c", "third"));
        let message = listed(more, NumberOrString::Number(9));
        assert_eq!(t.encode(&message).unwrap(), as_serde_writes(&message));
        let message = listed(
            vec![tool("a", "first ü"), tool("b", "second")],
            NumberOrString::Number(10),
        );
        assert_eq!(t.encode(&message).unwrap(), as_serde_writes(&message));
    }

    #[test]
    fn other_messages_are_one_line_each_and_an_error_without_id_gets_a_null_one() {
        let mut t = transport();
        let message =
            ServerJsonRpcMessage::response(ServerResult::empty(()), NumberOrString::Number(1));
        assert_eq!(t.encode(&message).unwrap(), as_serde_writes(&message));
        let message =
            ServerJsonRpcMessage::error(rmcp::model::ErrorData::invalid_request("bad", None), None);
        let line = t.encode(&message).unwrap();
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(line.ends_with(b"\n"));
        let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(value["id"], serde_json::Value::Null);
        assert!(value.as_object().unwrap().contains_key("id"));
    }
}
