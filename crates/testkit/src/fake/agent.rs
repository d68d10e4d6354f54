//! The fake sandbox's agent: one request per connection, read and answered in the real
//! protocol's frames, as the real agent serves them. It answers `Ping`, `Exec` (by the
//! [`super::shell`] interpreter, output streamed when asked), the file requests on the sandbox's
//! directory ([`super::files`]), `KillAll`, and the listings the engine makes of jobs and
//! contexts (none); anything else is refused in words.
//!
//! Every connection watches its agent's [`Condition`]: a dead agent closes it (the engine reads
//! EOF, as from a crashed process), a frozen or hung one reads the request and holds the reply.

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, DuplexStream, ReadHalf};
use tokio::sync::watch;

use sandbox_mcp_protocol::{
    AgentError, ContextList, Done, ErrorKind, Frame, JobList, Pong, Request, read_frame,
    write_frame,
};

use super::{AgentContext, Condition, files, shell};

/// What the agent sends back: a reply of the request's own type, or an error, as JSON.
pub(crate) type Answer = Frame<serde_json::Value>;

/// Serves one connection to an agent.
pub(crate) async fn serve(mut ctx: AgentContext, conn: DuplexStream) {
    let (mut rd, mut wr) = tokio::io::split(conn);
    let request = tokio::select! {
        read = read_frame::<_, Request>(&mut rd) => match read {
            Ok(Some(request)) => request,
            _ => return,
        },
        () = dead(&mut ctx.condition) => return,
    };
    if !wait_to_answer(&mut ctx.condition, &mut rd).await {
        return;
    }
    let answer = match request {
        Request::Ping(_) => answer(Ok(Pong {
            pid: 1,
            version: format!("fake-{}", ctx.generation),
        })),
        Request::Exec(spec) => match shell::run(&ctx, spec, &mut rd, &mut wr).await {
            Some(outcome) => answer(outcome),
            // The agent died or the engine hung up while the command ran.
            None => return,
        },
        Request::ReadFile(r) => answer(files::read(&ctx, &r)),
        Request::WriteFile(w) => answer(files::write(&ctx, &w)),
        Request::ListDir(l) => answer(files::list(&ctx, &l)),
        Request::Delete(d) => answer(files::delete(&ctx, &d)),
        Request::Move(m) => answer(files::rename(&ctx, &m)),
        Request::KillAll(_) => answer(Ok(Done {})),
        Request::ListJobs(_) => answer(Ok(JobList { jobs: Vec::new() })),
        Request::ListContexts(_) => answer(Ok(ContextList {
            contexts: Vec::new(),
        })),
        other => answer::<Done>(Err(AgentError::new(
            ErrorKind::InvalidArgument,
            format!("the fake agent does not serve {}", op_name(&other)),
        ))),
    };
    // A command may have hung the agent, or it was frozen meanwhile: the reply waits as well.
    if !wait_to_answer(&mut ctx.condition, &mut rd).await {
        return;
    }
    // The engine may have hung up (a cancelled call): nothing to tell it then.
    let _ = write_frame(&mut wr, &answer).await;
}

/// `result` as the frame that carries it.
pub(crate) fn answer<R: Serialize>(result: Result<R, AgentError>) -> Answer {
    let reply = result.and_then(|r| {
        serde_json::to_value(r).map_err(|e| AgentError::new(ErrorKind::Io, e.to_string()))
    });
    match reply {
        Ok(value) => Frame::Reply(value),
        Err(e) => Frame::Error(e),
    }
}

/// The request's `op`, as it travels.
fn op_name(request: &Request) -> String {
    serde_json::to_value(request)
        .ok()
        .and_then(|v| v.get("op").and_then(|op| op.as_str()).map(str::to_string))
        .unwrap_or_else(|| "this request".into())
}

/// Resolves when the agent is dead (killed, crashed, gone, destroyed).
pub(crate) async fn dead(condition: &mut watch::Receiver<Condition>) {
    let _ = condition.wait_for(|c| c.dead).await;
}

/// Waits until the agent may answer: `false` when it died first, or the engine hung up
/// (gave up on a frozen or hung agent).
async fn wait_to_answer(
    condition: &mut watch::Receiver<Condition>,
    rd: &mut ReadHalf<DuplexStream>,
) -> bool {
    tokio::select! {
        c = condition.wait_for(|c| c.dead || c.answers()) => c.is_ok_and(|c| !c.dead),
        () = hangup(rd) => false,
    }
}

/// Resolves when the engine closes its end of the connection.
pub(crate) async fn hangup<R: AsyncRead + Unpin>(rd: &mut R) {
    let mut byte = [0u8; 1];
    while matches!(rd.read(&mut byte).await, Ok(n) if n > 0) {}
}
