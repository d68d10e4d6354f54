//! Running one command: `/bin/sh -c` in its own session, output captured with caps as it
//! arrives (and spilled to a file when it overflows), killed on timeout or when the engine hangs up
//! (a cancelled call).

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::unix::pipe;

use super::capture::Capture;
use super::reaper::{Exit, Reaper};
use super::spawn::{self, Launch, default_cwd, error};
use sandbox_mcp_protocol::{AgentError, ErrorKind, ExecOutcome, ExecSpec, Stream, write_output};

/// After the shell exits, how long to keep reading output that background children may still
/// hold open, before answering anyway.
const LINGER: Duration = Duration::from_millis(100);

/// The two output streams of a running process, captured with caps and optionally streamed to
/// the engine as `Output` frames.
pub(crate) struct Pump {
    pub out: Option<pipe::Receiver>,
    pub err: Option<pipe::Receiver>,
    pub stdout: Capture,
    pub stderr: Capture,
    stream: bool,
    buf_out: Vec<u8>,
    buf_err: Vec<u8>,
    /// Output waiting to be streamed, per stream, with how much was skipped to bound it.
    pending: [(String, u64); 2],
    last_flush: tokio::time::Instant,
}

/// Streamed output is sent at most this often...
const STREAM_INTERVAL: Duration = Duration::from_millis(100);
/// ...and at most this much per stream each time (the newest; the rest is counted as skipped).
/// So a command printing a gigabyte streams a few hundred KiB per second, not a gigabyte.
const STREAM_BATCH: usize = 16 * 1024;

/// What one read of a pump produced.
pub(crate) enum Chunk {
    Data(Stream, usize),
    Closed(Stream),
}

impl Pump {
    pub(crate) fn new(
        out: Option<pipe::Receiver>,
        err: Option<pipe::Receiver>,
        max: usize,
        stream: bool,
    ) -> Self {
        Self {
            out,
            err,
            stdout: Capture::new(max).spilling_to(spawn::spill_path("stdout")),
            stderr: Capture::new(max).spilling_to(spawn::spill_path("stderr")),
            stream,
            buf_out: vec![0u8; 64 * 1024],
            buf_err: vec![0u8; 64 * 1024],
            pending: [(String::new(), 0), (String::new(), 0)],
            last_flush: tokio::time::Instant::now(),
        }
    }

    /// When buffered output should be streamed, if there is any.
    pub(crate) fn stream_due(&self) -> Option<tokio::time::Instant> {
        self.pending
            .iter()
            .any(|(p, skipped)| !p.is_empty() || *skipped > 0)
            .then(|| self.last_flush + STREAM_INTERVAL)
    }

    /// Sends buffered output as `Output` frames.
    pub(crate) async fn flush_stream<C: AsyncWrite + Unpin>(&mut self, conn: &mut C) {
        for (i, which) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let (text, skipped) = std::mem::take(&mut self.pending[i]);
            if text.is_empty() && skipped == 0 {
                continue;
            }
            let data = if skipped > 0 {
                format!("…[{skipped} bytes not streamed]…\n{text}")
            } else {
                text
            };
            let _ = write_output(conn, which, data).await;
        }
        self.last_flush = tokio::time::Instant::now();
    }

    pub(crate) fn open(&self) -> bool {
        self.out.is_some() || self.err.is_some()
    }

    /// Waits for output on either stream. Cancel-safe (it only reads), so it can sit in a
    /// `select!`; hand what it returns to [`Pump::handle`] in the branch body, never inside the
    /// select, because writing a frame must not be interrupted half-way.
    pub(crate) async fn read(&mut self) -> Chunk {
        let (which, n) = tokio::select! {
            n = read_some(&mut self.out, &mut self.buf_out) => (Stream::Stdout, n),
            n = read_some(&mut self.err, &mut self.buf_err) => (Stream::Stderr, n),
        };
        match n {
            Some(n) => Chunk::Data(which, n),
            None => Chunk::Closed(which),
        }
    }

    /// Records a chunk (and streams it to the engine when asked to).
    pub(crate) async fn handle<C: AsyncWrite + Unpin>(&mut self, chunk: Chunk, conn: &mut C) {
        match chunk {
            Chunk::Data(which, n) => self.record(which, n, conn).await,
            Chunk::Closed(Stream::Stdout) => self.out = None,
            Chunk::Closed(Stream::Stderr) => self.err = None,
        }
    }

    async fn record<C: AsyncWrite + Unpin>(&mut self, which: Stream, n: usize, conn: &mut C) {
        let data = match which {
            Stream::Stdout => &self.buf_out[..n],
            Stream::Stderr => &self.buf_err[..n],
        };
        match which {
            Stream::Stdout => self.stdout.push(data),
            Stream::Stderr => self.stderr.push(data),
        }
        if self.stream {
            let i = usize::from(which == Stream::Stderr);
            let (pending, skipped) = &mut self.pending[i];
            pending.push_str(&String::from_utf8_lossy(data));
            if pending.len() > STREAM_BATCH {
                let mut cut = pending.len() - STREAM_BATCH;
                while !pending.is_char_boundary(cut) {
                    cut += 1;
                }
                *skipped += cut as u64;
                pending.drain(..cut);
            }
            if self.last_flush.elapsed() >= STREAM_INTERVAL {
                self.flush_stream(conn).await;
            }
        }
    }

    /// Reads whatever is already buffered in the pipes, without waiting.
    pub(crate) async fn drain_ready<C: AsyncWrite + Unpin>(&mut self, conn: &mut C) {
        for which in [Stream::Stdout, Stream::Stderr] {
            loop {
                let pipe = match which {
                    Stream::Stdout => &mut self.out,
                    Stream::Stderr => &mut self.err,
                };
                let Some(p) = pipe else { break };
                let buf = match which {
                    Stream::Stdout => &mut self.buf_out,
                    Stream::Stderr => &mut self.buf_err,
                };
                match p.try_read(buf) {
                    Ok(0) => {
                        *pipe = None;
                        break;
                    }
                    Ok(n) => self.record(which, n, conn).await,
                    Err(_) => break,
                }
            }
        }
    }

    /// Hands the still-open pipes to background tasks that read and discard until EOF, so
    /// lingering writers never die of SIGPIPE.
    pub(crate) fn detach(&mut self) {
        for p in [self.out.take(), self.err.take()].into_iter().flatten() {
            tokio::task::spawn_local(drain(p));
        }
    }
}

async fn read_some(p: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> Option<usize> {
    match p {
        Some(p) => match p.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

async fn drain(mut p: pipe::Receiver) {
    let mut buf = vec![0u8; 16 * 1024];
    while matches!(p.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Sleeps until `due`, or forever when nothing is due.
pub(crate) async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) async fn wait_exit(rx: &mut Option<tokio::sync::oneshot::Receiver<Exit>>) -> Exit {
    match rx {
        Some(rx) => rx.await.unwrap_or(Exit::Signal(libc::SIGKILL)),
        None => std::future::pending().await,
    }
}

/// Resolves when the engine closes its end of the connection (the call was cancelled).
pub(crate) async fn hangup<C: AsyncRead + Unpin>(conn: &mut C) {
    let mut byte = [0u8; 1];
    loop {
        match conn.read(&mut byte).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {} // the engine sends nothing after the request; ignore stray bytes
        }
    }
}

/// Runs `spec`. `rd`/`wr` are the engine's connection: streamed output goes to `wr`, and `rd`
/// closing means the call was cancelled.
pub(crate) async fn run<R, W>(
    spec: ExecSpec,
    sandbox_env: &[(String, String)],
    reaper: &Reaper,
    rd: &mut R,
    wr: &mut W,
) -> Result<ExecOutcome, AgentError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let cwd = spec
        .cwd
        .clone()
        .unwrap_or_else(|| default_cwd().to_string());
    if spec.command.contains('\0') {
        return Err(error(
            ErrorKind::InvalidArgument,
            "command contains a NUL byte",
        ));
    }
    spawn::check(&cwd, &spec.env)?;
    let started = Instant::now();
    let launch = Launch {
        program: "/bin/sh",
        args: &["-c", &spec.command],
        cwd: &cwd,
        env: &[sandbox_env, &spec.env],
        ..Default::default()
    };
    let child = spawn::start(&launch, reaper)?;
    let pid = child.pid;
    let inodes = child.pipe_inodes.clone();
    let mut pump = Pump::new(
        Some(child.stdout),
        child.stderr,
        spec.max_output_bytes as usize,
        spec.stream,
    );
    let mut exit_rx = Some(child.exit);
    let mut exit: Option<Exit> = None;
    let mut timed_out = false;
    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms));
    tokio::pin!(deadline);
    let linger = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(linger);

    while pump.open() || exit.is_none() {
        let due = pump.stream_due();
        tokio::select! {
            chunk = pump.read() => pump.handle(chunk, wr).await,
            () = sleep_until_due(due) => pump.flush_stream(wr).await,
            status = wait_exit(&mut exit_rx), if exit_rx.is_some() => {
                exit_rx = None;
                exit = Some(status);
                linger.as_mut().reset(tokio::time::Instant::now() + LINGER);
            }
            () = &mut deadline, if !timed_out && exit.is_none() => {
                timed_out = true;
                spawn::kill_group(pid);
                spawn::kill_pipe_holders(&inodes);
            }
            () = &mut linger, if exit.is_some() => {
                if timed_out {
                    spawn::kill_pipe_holders(&inodes);
                }
                pump.detach();
            }
            () = hangup(rd) => {
                // The engine hung up: the call was cancelled. Kill what it started.
                spawn::kill_group(pid);
                spawn::kill_pipe_holders(&inodes);
                return Err(error(ErrorKind::Io, "cancelled"));
            }
        }
    }

    pump.flush_stream(wr).await;
    let (exit_code, signal) = match exit {
        Some(Exit::Code(c)) => (Some(c), None),
        Some(Exit::Signal(s)) => (None, Some(s)),
        Some(Exit::Unknown) => (None, None),
        None => (None, None),
    };
    Ok(ExecOutcome {
        exit_code,
        signal,
        truncated: pump.stdout.truncated() || pump.stderr.truncated(),
        stdout: pump.stdout.render(),
        stderr: pump.stderr.render(),
        stdout_bytes: pump.stdout.total(),
        stderr_bytes: pump.stderr.total(),
        stdout_file: pump.stdout.spill_path(),
        stderr_file: pump.stderr.spill_path(),
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}
