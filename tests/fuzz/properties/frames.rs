//! The agent's frames and the pod multiplexer's (crates/protocol).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use sandbox_mcp_protocol::{self as protocol, Call, ExchangeError, Frame, Request, mux};

/// Runs a future over in-memory I/O, which never waits.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("in-memory I/O waited"),
    }
}

/// A connection to an agent that answers with `input` and keeps what it is sent.
struct Agent<'a> {
    input: &'a [u8],
    sent: Vec<u8>,
}

impl AsyncRead for Agent<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.input.len().min(buf.remaining());
        buf.put_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Agent<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.sent.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A value through the frame encoder and decoder: the same value, in one frame that is all read.
fn frame_round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T) {
    let mut wire = Vec::new();
    ready(protocol::write_frame(&mut wire, value)).expect("encodes");
    let len = u32::from_be_bytes([wire[0], wire[1], wire[2], wire[3]]) as usize;
    assert_eq!(len + 4, wire.len());
    let mut input = wire.as_slice();
    let decoded: Option<T> = ready(protocol::read_frame(&mut input)).expect("decodes");
    assert_eq!(decoded.as_ref(), Some(value));
    assert!(input.is_empty());
}

/// One exchange of `call` with an agent that answers `input`.
fn exchange_with<C>(input: &[u8], call: C)
where
    C: Call + Clone,
    C::Reply: PartialEq + Debug,
{
    let request: Request = call.clone().into();
    let limit = call.reply_limit();
    let mut agent = Agent {
        input,
        sent: Vec::new(),
    };
    let outcome = ready(protocol::exchange(&mut agent, call));
    // The request went out as one frame, which decodes to itself.
    let mut sent = agent.sent.as_slice();
    let decoded = ready(protocol::read_frame::<_, Request>(&mut sent)).expect("the request");
    assert_eq!(decoded.as_ref(), Some(&request));
    assert!(sent.is_empty());
    // The frames read tile the bytes read, each within the request's limit; reading stops at the
    // first header over it.
    let read = input.len() - agent.input.len();
    let mut at = 0;
    let mut over = false;
    while at < read {
        let Some(header) = input.get(at..at + 4) else {
            at = input.len() + 1; // the input ended inside a header
            break;
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        at += 4;
        if len > limit {
            over = true;
            break;
        }
        at += len;
    }
    if over {
        assert_eq!(at, read, "read past the header of a frame over the limit");
    }
    match outcome {
        Ok(Ok(reply)) => {
            assert_eq!(at, read, "the reply ends where its frame does");
            assert!(!over);
            frame_round_trip(&Frame::<C::Reply>::Reply(reply));
        }
        Ok(Err(error)) => {
            assert_eq!(at, read, "the error ends where its frame does");
            assert!(!over);
            frame_round_trip(&Frame::<C::Reply>::Error(error));
        }
        Err(ExchangeError::Closed) => {
            assert!(
                agent.input.is_empty() && at == read && !over,
                "closed inside a frame"
            );
        }
        Err(ExchangeError::Broken(_)) => {}
        Err(ExchangeError::HungUp(e)) => panic!("a write to memory failed: {e}"),
        Err(ExchangeError::Unread(e)) => panic!("memory reset the connection: {e}"),
    }
}

/// Frames from a sandbox's agent, as the engine reads them (the reply to a request, after any
/// output frames), and requests as the agent reads them. Input: a byte choosing the request, then
/// what the agent answers (length-prefixed JSON frames).
///
/// Properties: the request goes out as one frame that decodes to itself; the frames read tile the
/// bytes read, each within the request's reply limit, and none is read past a header over it; a
/// reply or an error ends exactly at the end of its frame, and goes through the encoder and back
/// unchanged; a closed connection ends between frames. The agent's side: every request it decodes
/// round-trips through the encoder.
pub fn agent_frame(data: &[u8]) {
    use protocol::{
        ExecSpec, JobStatus, Language, ListDir, ListJobs, Ping, ReadFile, RunCodeSpec, read_frame,
    };
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    let path = || "/root/project".to_string();
    match which % 8 {
        0 => exchange_with(input, Ping {}),
        // A small limit: frames over it are common.
        1 => exchange_with(
            input,
            ReadFile {
                path: path(),
                max_bytes: 64,
            },
        ),
        2 => exchange_with(
            input,
            ListDir {
                path: path(),
                max_entries: 1000,
            },
        ),
        3 => exchange_with(
            input,
            ExecSpec {
                command: "ls -la".into(),
                cwd: Some(path()),
                env: vec![("K".into(), "v".into())],
                timeout_ms: 1000,
                max_output_bytes: 4096,
                stream: true,
            },
        ),
        4 => exchange_with(
            input,
            RunCodeSpec {
                code: "print(1)".into(),
                context_id: None,
                language: Language::Python,
                timeout_ms: 1000,
                max_output_bytes: 4096,
                stream: true,
                env: Vec::new(),
            },
        ),
        5 => exchange_with(input, ListJobs {}),
        6 => exchange_with(
            input,
            JobStatus {
                job_id: "job_1".into(),
                since_offset: 0,
                max_bytes: 4096,
            },
        ),
        _ => {
            let mut input = input;
            while let Ok(Some(request)) = ready(read_frame::<_, Request>(&mut input)) {
                frame_round_trip(&request);
            }
        }
    }
}

/// The pod multiplexer's frames, as either end reads them. Input: the stream of bytes.
///
/// Properties: every frame read has a known kind, a payload within the maximum and none unless it
/// carries data, and encodes back to exactly the bytes it was read from; a clean end is at a frame
/// boundary; an error is a bad header or an input that ends inside a frame. Then frames encoded
/// from the input's bytes (ids, kinds, payloads) read back the same.
pub fn mux_frame(data: &[u8]) {
    let mut input = data;
    loop {
        let before = input;
        match ready(mux::read_frame(&mut input)) {
            Ok(Some((id, kind, payload))) => {
                assert!((mux::OPEN..=mux::CLOSE).contains(&kind), "kind {kind}");
                assert!(payload.len() <= mux::MAX_PAYLOAD);
                assert!(
                    kind == mux::DATA || payload.is_empty(),
                    "kind {kind} with a payload"
                );
                let read = before.len() - input.len();
                assert_eq!(mux::frame(id, kind, &payload), before[..read]);
            }
            Ok(None) => {
                assert!(before.is_empty(), "a clean end inside a frame");
                break;
            }
            Err(_) => {
                let bad = match before.get(..mux::HEADER) {
                    None => true,
                    Some(h) => {
                        let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
                        !(mux::OPEN..=mux::CLOSE).contains(&h[4])
                            || len > mux::MAX_PAYLOAD
                            || (h[4] != mux::DATA && len != 0)
                            || before.len() < mux::HEADER + len
                    }
                };
                assert!(
                    bad,
                    "a good frame refused: {:?}",
                    &before[..before.len().min(32)]
                );
                break;
            }
        }
    }
    // The encoder's round trip: one frame per chunk of the input.
    let mut wire = Vec::new();
    let mut frames = Vec::new();
    for (i, chunk) in data.chunks(7).enumerate() {
        let kind = mux::OPEN + chunk[0] % 3;
        let payload = if kind == mux::DATA {
            &chunk[1..]
        } else {
            &[][..]
        };
        let id = u32::from(chunk[0]) << 16 | i as u32;
        wire.extend_from_slice(&mux::frame(id, kind, payload));
        frames.push((id, kind, payload.to_vec()));
    }
    let mut input = wire.as_slice();
    for frame in frames {
        assert_eq!(
            ready(mux::read_frame(&mut input)).expect("a frame"),
            Some(frame)
        );
    }
    assert_eq!(ready(mux::read_frame(&mut input)).expect("the end"), None);
}

/// An attached process's chunks (`protocol::read_chunk`): a chunk read is of a known kind with
/// at most `MAX_CHUNK` bytes and writes back as the bytes it was read from (an exit status as the
/// same status); a clean end is at a chunk boundary; anything else is refused, never a panic or
/// an allocation the header alone asked for. WebSocket messages (`Chunk::from_message`) round-trip
/// the same way.
pub fn attach_chunk(data: &[u8]) {
    use protocol::{Chunk, MAX_CHUNK, read_chunk, write_chunk};
    let mut input = data;
    loop {
        let before = input;
        match ready(read_chunk(&mut input)) {
            Ok(Some(chunk)) => {
                let read = before.len() - input.len();
                let mut wire = Vec::new();
                ready(write_chunk(&mut wire, &chunk)).unwrap();
                match &chunk {
                    Chunk::Exit { .. } => {
                        let mut again: &[u8] = &wire;
                        assert_eq!(ready(read_chunk(&mut again)).unwrap(), Some(chunk.clone()));
                    }
                    Chunk::Stdin(d) | Chunk::Stdout(d) | Chunk::Stderr(d) => {
                        assert!(d.len() <= MAX_CHUNK);
                        assert_eq!(wire, before[..read]);
                    }
                    Chunk::CloseStdin | Chunk::Resize(_) => assert_eq!(wire, before[..read]),
                }
                assert_eq!(Chunk::from_message(&chunk.to_message()).unwrap(), chunk);
            }
            Ok(None) => {
                assert!(before.is_empty(), "a clean end inside a chunk");
                break;
            }
            Err(_) => break,
        }
    }
    if let Ok(chunk) = Chunk::from_message(data) {
        assert_eq!(Chunk::from_message(&chunk.to_message()).unwrap(), chunk);
    }
}
