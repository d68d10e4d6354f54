//! `sandbox-mcp run -- COMMAND…`: one stdio MCP server in a sandbox of its own, relayed on this
//! process's stdin and stdout byte for byte, so that prefixing a client's server command with
//! `sandbox-mcp run … --` sandboxes it. The server's stderr comes out on ours. Its EOF, its exit,
//! or SIGTERM ends it and its sandbox.

use std::future::Future;

use sandbox_mcp_protocol::Chunk;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ServerSpec;
use super::attach::{Input, attach};
use crate::backend::{Backend, Handle};

/// Runs server `name` until it exits, its client hangs up (EOF on stdin), or `stop` resolves;
/// the sandbox is killed in every case. Returns the server's exit status as a process's (128 +
/// the signal for a killed one; 0 when stopped).
pub async fn run(
    backend: &Backend,
    name: &str,
    spec: &ServerSpec,
    stop: impl Future<Output = ()>,
) -> Result<i32, String> {
    let handle = backend.client(None).await.map_err(|e| e.text())?;
    let client = handle.client.clone();
    let id = spec.create_sandbox(&client, name).await?;
    tracing::info!(sandbox = %id, server = name, "started the server's sandbox");
    let outcome = relay(&client, &id, spec, stop).await;
    let ended = end_sandbox(backend, &handle, &id).await;
    outcome.map_err(|e| match ended {
        Ended::Here => e,
        Ended::Elsewhere(killed) => format!(
            "{e}; the sandbox engine it ran on went away (another sandbox-mcp process on this data dir served it, and ended), {killed}. Start the server again; to keep it from ending with another process, give it a data dir of its own (SANDBOX_MCP_DATA_DIR)"
        ),
    })
}

/// Where the server's sandbox was killed.
enum Ended {
    /// By the engine the server ran on (or the kill failed there: logged).
    Here,
    /// By the engine this process took over or attached to after that one went away: says
    /// whether the sandbox was killed.
    Elsewhere(String),
}

/// Kills the server's sandbox. When the engine went away meanwhile (another process on the
/// data dir served it and ended, pausing the sandbox), this process takes the engine over, as
/// the stdio server does, and kills the sandbox with it: none is left behind paused, with no
/// one to end it.
async fn end_sandbox(backend: &Backend, handle: &Handle, id: &str) -> Ended {
    let (killed, moved) = backend
        .with_recovery(handle, None, |client| async move {
            crate::call::respond(client.kill_sandbox().sandbox_id(id).send().await)
        })
        .await;
    let failure = killed.err().map(|f| {
        let why = f.text();
        tracing::warn!(sandbox = %id, "could not kill the server's sandbox: {why}");
        why
    });
    match (moved, failure) {
        (false, _) => Ended::Here,
        (true, None) => Ended::Elsewhere("and its sandbox was killed".into()),
        (true, Some(why)) => Ended::Elsewhere(format!(
            "and its sandbox {id} could not be killed ({why}): it stays paused until the sandbox_kill tool of a sandbox-mcp on this data dir ends it"
        )),
    }
}

async fn relay(
    client: &sandbox_mcp_api::Client,
    id: &str,
    spec: &ServerSpec,
    stop: impl Future<Output = ()>,
) -> Result<i32, String> {
    let request: sandbox_mcp_api::types::AttachRequest =
        serde_json::from_value(spec.attach_request())
            .map_err(|e| format!("invalid server command: {e}"))?;
    let attached = attach(client, id, &request)
        .await
        .map_err(|e| format!("cannot start `{}`: {e}", spec.command.join(" ")))?;
    let (input, mut output) = (attached.input, attached.output);
    let pump_in = pump_stdin(input);
    tokio::pin!(pump_in);
    tokio::pin!(stop);
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut input_done = false;
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(Chunk::Stdout(data))) => {
                    if stdout.write_all(&data).await.is_err() || stdout.flush().await.is_err() {
                        // Our client is gone: so is the server's.
                        return Ok(0);
                    }
                }
                Some(Ok(Chunk::Stderr(data))) => {
                    let _ = stderr.write_all(&data).await;
                }
                Some(Ok(Chunk::Exit { exit_code, signal })) => {
                    return Ok(exit_code.unwrap_or(128 + signal.unwrap_or(9)));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("the connection to the server broke: {e}")),
                None => return Err("the engine ended the server's connection without its exit status".into()),
            },
            () = &mut pump_in, if !input_done => input_done = true,
            () = &mut stop => return Ok(0),
        }
    }
}

/// Copies our stdin to the server's until EOF, which it passes on.
async fn pump_stdin(mut input: Input) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if input.write(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = input.close().await;
    // Keep the socket open for the server's last words; dropping it would hang up.
    std::future::pending::<()>().await;
}
