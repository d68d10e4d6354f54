//! Copying an allowed connection both ways, once the relay has decided: buffers that start small
//! and grow for a sandbox's long transfers within its fast lanes, byte counts for the log, and —
//! for a sandbox with secrets bound — a scan of what it sends for their stand-ins.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::intercept;

/// Copy buffer per direction to begin with: what an idle or slow connection costs the engine
/// (a sandbox holding all its connections with full buffers both ways costs it
/// `--max-connections` × 32 KiB, plus its fast lanes).
const SMALL_BUFFER: usize = 16 * 1024;
/// The buffer one of a sandbox's fast lanes ([`crate::FAST_LANES`]) stands for. A direction that
/// keeps its buffer full takes lanes while they are free, doubling its buffer each time, up to
/// all of them (4 MiB): fewer, larger reads and writes, where each write into the sandbox's
/// loopback runs its TCP receive and wakes the reader, on the two cores the relay shares with
/// both ends (docs/architecture.md has the profile). In a same-run A/B against 256 KiB buffers, a
/// 1 GiB download through the relay went from 53.8 to 64.2 % of the direct rate
/// (docs/benchmarks-ab-network.md).
const LANE: usize = 256 * 1024;
/// Reads that fill a direction's buffer before it asks for more lanes.
const FULL_READS: u32 = 4;

/// A copy buffer that starts small and grows while the connection keeps it full and its
/// sandbox's fast lanes are free (see [`LANE`]); the lanes are given back with the buffer.
struct Copier {
    buf: Vec<u8>,
    full: u32,
    lanes: Arc<Semaphore>,
    lane: Option<OwnedSemaphorePermit>,
}

impl Copier {
    fn new(lanes: &Arc<Semaphore>) -> Copier {
        Copier {
            buf: vec![0; SMALL_BUFFER],
            full: 0,
            lanes: lanes.clone(),
            lane: None,
        }
    }

    /// The next bytes from `from` (empty at its end or on an error).
    async fn read(&mut self, from: &mut (impl AsyncRead + Unpin)) -> &[u8] {
        let n = from.read(&mut self.buf).await.unwrap_or(0);
        if n == self.buf.len() {
            self.full += 1;
            if self.full >= FULL_READS {
                self.grow(n);
            }
        }
        &self.buf[..n]
    }

    /// Doubles the buffer (the first `kept` bytes kept) with as many more lanes as it holds, or
    /// as are free; with none free it stays as it is.
    fn grow(&mut self, kept: usize) {
        let held = self.lane.as_ref().map_or(0, |l| l.num_permits());
        let more = held.max(1).min(self.lanes.available_permits());
        if more == 0 {
            return;
        }
        let Ok(taken) = self.lanes.clone().try_acquire_many_owned(more as u32) else {
            return;
        };
        match &mut self.lane {
            Some(lane) => lane.merge(taken),
            None => self.lane = Some(taken),
        }
        let mut larger = vec![0; (held + more) * LANE];
        larger[..kept].copy_from_slice(&self.buf[..kept]);
        self.buf = larger;
        self.full = 0;
    }
}

/// Copies both ways until both sides are done: what the client sent first, then the rest.
/// Returns the bytes sent and received, the client's first bytes (those read before deciding,
/// or else its first chunk, kept for the log: they name the host on TLS and HTTP), and — when
/// `scan` is set (the sandbox binds secrets) — a stand-in found in what the client sent, at
/// which point the connection was cut before those bytes went out. Each direction starts with a
/// small buffer and takes a large one from `lanes` only while it keeps the small one full.
pub(super) async fn pipe(
    client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
    scan: bool,
    lanes: &Arc<Semaphore>,
) -> (u64, u64, Vec<u8>, Option<String>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    // A leak cuts the connection both ways, not only the side it was seen on.
    let cut = Arc::new(tokio::sync::Notify::new());
    let cut_down = cut.clone();
    let (mut up_copier, mut down_copier) = (Copier::new(lanes), Copier::new(lanes));
    let up = async move {
        let mut first = first;
        let mut sent = 0u64;
        let mut leaked = None;
        // Clear text of a sandbox that binds secrets: each chunk is checked (with the end of
        // the one before, so a stand-in split across reads is seen) before it goes out.
        let mut scanner = scan.then(intercept::Scanner::default);
        let mut open = true;
        if !first.is_empty() {
            if let Some(s) = scanner.as_mut().and_then(|sc| sc.scan(&first)) {
                leaked = Some(s);
                cut_down.notify_one();
                open = false;
            } else if uw.write_all(&first).await.is_ok() {
                sent += first.len() as u64;
            } else {
                open = false;
            }
        }
        if open {
            loop {
                let data = up_copier.read(&mut cr).await;
                if data.is_empty() {
                    break;
                }
                if first.is_empty() {
                    first = data[..data.len().min(4096)].to_vec();
                }
                if let Some(s) = scanner.as_mut().and_then(|sc| sc.scan(data)) {
                    leaked = Some(s);
                    cut_down.notify_one();
                    break;
                }
                if uw.write_all(data).await.is_err() {
                    break;
                }
                sent += data.len() as u64;
            }
        }
        let _ = uw.shutdown().await;
        (sent, first, leaked)
    };
    let down = async move {
        let copy = async {
            let mut n = 0u64;
            loop {
                let data = down_copier.read(&mut ur).await;
                if data.is_empty() || cw.write_all(data).await.is_err() {
                    break;
                }
                n += data.len() as u64;
            }
            n
        };
        let n = tokio::select! {
            n = copy => n,
            () = cut.notified() => 0,
        };
        let _ = cw.shutdown().await;
        n
    };
    let ((sent, first, leaked), received) = tokio::join!(up, down);
    (sent, received, first, leaked)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Reads until the buffer's size stops changing, and returns the sizes it went through.
    async fn sizes(copier: &mut Copier, from: &mut (impl AsyncRead + Unpin)) -> Vec<usize> {
        let mut seen = vec![copier.buf.len()];
        for _ in 0..64 {
            copier.read(from).await;
            if copier.buf.len() != *seen.last().unwrap() {
                seen.push(copier.buf.len());
            }
        }
        seen
    }

    #[tokio::test]
    async fn a_direction_that_keeps_its_buffer_full_doubles_it_with_free_lanes_only() {
        let lanes = Arc::new(Semaphore::new(crate::FAST_LANES));
        // Every read fills the buffer: 256 KiB, then doubling to all the sandbox's lanes.
        let mut bulk = Copier::new(&lanes);
        let mut zeros = tokio::io::repeat(0);
        let k = 1024;
        assert_eq!(
            sizes(&mut bulk, &mut zeros).await,
            [16 * k, 256 * k, 512 * k, 1024 * k, 2048 * k, 4096 * k]
        );
        assert_eq!(lanes.available_permits(), 0);
        // Another one finds no lane free, and keeps its small buffer.
        let mut second = Copier::new(&lanes);
        assert_eq!(sizes(&mut second, &mut zeros).await, [16 * k]);
        // Lanes come back with the buffer, and a later direction takes only what is free.
        drop(bulk);
        assert_eq!(lanes.available_permits(), crate::FAST_LANES);
        let _held = lanes.clone().try_acquire_many_owned(13).unwrap();
        assert_eq!(
            sizes(&mut second, &mut zeros).await,
            [16 * k, 256 * k, 512 * k, 768 * k]
        );
        assert_eq!(lanes.available_permits(), 0);
    }

    #[tokio::test]
    async fn a_direction_whose_reads_do_not_fill_its_buffer_never_grows() {
        let lanes = Arc::new(Semaphore::new(crate::FAST_LANES));
        let mut copier = Copier::new(&lanes);
        // A hundred reads of 10 KiB each: every one short of the 16 KiB buffer.
        for _ in 0..100 {
            let mut short = tokio::io::repeat(1).take(10 * 1024);
            assert_eq!(copier.read(&mut short).await.len(), 10 * 1024);
        }
        assert_eq!(copier.buf.len(), SMALL_BUFFER);
        assert_eq!(lanes.available_permits(), crate::FAST_LANES);
    }
}
