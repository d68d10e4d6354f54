//! Line framing for the stdio transport, in front of rmcp.
//!
//! rmcp drops an over-long or malformed line silently, which leaves the client waiting forever
//! for an answer. This layer reads stdin itself: a line over [`MAX_LINE`] is discarded as it
//! streams in (memory stays bounded), its JSON-RPC `id` is picked out on the way, and the client
//! gets an error response for that id at once; every other line is checked by [`jsonrpc::check`]
//! and answered here when it is not a valid message. Everything written to stdout goes through
//! one writer task, so protocol lines never interleave; nothing else in the process writes to
//! stdout.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::jsonrpc::{self, Check, IdScanner};

/// Longest request line accepted: room for an 8 MiB file sent base64-encoded, with overhead.
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;

/// Runs `serve` with rmcp-facing pipes while framing `input`/`output`. Returns when `serve` ends
/// (stdin EOF closes rmcp's input, which ends the session).
pub async fn frame<R, W, F, Fut>(input: R, mut output: W, serve: F) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    F: FnOnce(tokio::io::DuplexStream, tokio::io::DuplexStream) -> Fut,
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

    let result = serve(rmcp_in, rmcp_out).await;
    // The writer ends once both senders are gone: the pump's (aborted here) and the relay's
    // (which ends when rmcp drops its output).
    pump.abort();
    let _ = relay.await;
    let _ = writer.await;
    result
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
