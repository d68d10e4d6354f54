//! Many agent connections over one exec stream into a pod.
//!
//! Frames (both directions): stream id (u32), kind (u8: open, data, close), payload length (u32),
//! payload (data only, at most 64 KiB). The engine opens streams; the bridge in the pod
//! (`__agent-mux`, the agent crate's `pod` module) connects each to the agent's socket. Closing is
//! whole-stream: either side's close ends it.
//!
//! The pod is untrusted: a frame over the size limit, an unknown kind or a broken exec ends the
//! multiplexer (every stream sees end of file), and the driver opens a new one on the next
//! connection. Memory per stream is bounded (a duplex buffer and a short queue): a caller that
//! stops reading slows the exec down (backpressure), it never grows a buffer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

use sandbox_mcp_protocol::mux::{CLOSE, DATA, OPEN, frame, read_frame, send_data, write_frames};
use sandbox_mcp_sys::lock;

/// Bytes buffered between a caller and its stream's pump.
const STREAM_BUFFER: usize = 256 * 1024;

type Streams = Arc<Mutex<HashMap<u32, mpsc::Sender<Vec<u8>>>>>;

pub struct Mux {
    out: mpsc::Sender<Vec<u8>>,
    streams: Streams,
    next: AtomicU32,
    dead: Arc<AtomicBool>,
}

impl Mux {
    /// Runs the multiplexer over `input` (the pod's stdout) and `output` (its stdin). `keep` is
    /// held until the exec ends (the exec's handle, which owns the connection).
    pub fn start<R, W, K>(input: R, output: W, keep: K) -> Arc<Mux>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
        K: Send + 'static,
    {
        let (out, mut rx) = mpsc::channel::<Vec<u8>>(64);
        let streams: Streams = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let mux = Arc::new(Mux {
            out,
            streams: streams.clone(),
            next: AtomicU32::new(1),
            dead: dead.clone(),
        });
        let writer_dead = dead.clone();
        let writer = tokio::spawn(async move {
            let mut output = output;
            write_frames(&mut rx, &mut output).await;
            writer_dead.store(true, Ordering::Release);
        });
        tokio::spawn(async move {
            let mut input = input;
            loop {
                match read_frame(&mut input).await {
                    Ok(Some((id, DATA, payload))) => {
                        let sender = lock(&streams).get(&id).cloned();
                        // A stream the caller already closed: its late data is dropped.
                        if let Some(sender) = sender
                            && sender.send(payload).await.is_err()
                        {
                            lock(&streams).remove(&id);
                        }
                    }
                    Ok(Some((id, CLOSE, _))) => {
                        lock(&streams).remove(&id);
                    }
                    Ok(Some((id, kind, _))) => {
                        tracing::warn!(
                            stream = id,
                            kind,
                            "the pod's bridge sent an unexpected frame"
                        );
                        break;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!("the pod's bridge broke the protocol: {e}");
                        break;
                    }
                }
            }
            dead.store(true, Ordering::Release);
            // Every open stream ends: their callers read end of file.
            lock(&streams).clear();
            writer.abort();
            drop(keep);
        });
        mux
    }

    /// Whether the exec under it has ended: a new multiplexer is needed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.out.is_closed()
    }

    /// Opens a stream to the agent.
    pub async fn open(&self) -> std::io::Result<DuplexStream> {
        if self.is_dead() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (caller, pump) = tokio::io::duplex(STREAM_BUFFER);
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
        lock(&self.streams).insert(id, tx);
        self.out
            .send(frame(id, OPEN, &[]))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        let out = self.out.clone();
        let streams = self.streams.clone();
        tokio::spawn(async move {
            let (mut from_caller, mut to_caller) = tokio::io::split(pump);
            let inbound = async {
                while let Some(bytes) = rx.recv().await {
                    if to_caller.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                // The pod closed the stream (or the multiplexer died): end of file for the caller.
                let _ = to_caller.shutdown().await;
            };
            let outbound = send_data(&mut from_caller, id, &out);
            // Whichever side ends first ends the stream: the caller dropping its end, or the pod
            // closing it.
            tokio::select! {
                () = inbound => {}
                () = outbound => {}
            }
            lock(&streams).remove(&id);
            let _ = out.send(frame(id, CLOSE, &[])).await;
        });
        Ok(caller)
    }
}
