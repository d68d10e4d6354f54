//! Zero-copy relaying: bytes go from one socket to the other through a pipe with `splice(2)`,
//! page references moved by the kernel, never copied through the engine's memory. Only for a
//! direction nothing needs to read: never the sandbox's side of a connection whose clear text is
//! scanned for secrets' stand-ins.
//!
//! Each byte counted is one written to the destination, so the network log's counts stay exact.
//! A pipe costs two descriptors (taken from the engine's budget for sandbox traffic, like the
//! sockets) and its buffer (the size of the copy buffer it replaces).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

use sandbox_mcp_sys::budget::{Descriptors, Held};

/// A pipe between two sockets, with the descriptors it holds.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    size: usize,
    _fds: Held,
}

impl Pipe {
    /// A pipe of (about) `size` bytes, or None when the engine's descriptors are spent or the
    /// kernel refuses.
    pub(crate) fn new(fds: &Arc<Descriptors>, size: usize) -> Option<Pipe> {
        let held = fds.take(2)?;
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).ok()?;
        // The default is 64 KiB; an unprivileged engine may be held to less than asked
        // (`/proc/sys/fs/pipe-max-size`): the size it got is what it uses.
        let size = fcntl(&write, FcntlArg::F_SETPIPE_SZ(size as i32))
            .ok()
            .and_then(|s| usize::try_from(s).ok())
            .or_else(|| {
                fcntl(&write, FcntlArg::F_GETPIPE_SZ)
                    .ok()
                    .and_then(|s| usize::try_from(s).ok())
            })?;
        Some(Pipe {
            read,
            write,
            size,
            _fds: held,
        })
    }
}

const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

/// Moves what `from` sends to `to` until `from` ends or either fails; the bytes written to `to`.
pub(crate) async fn splice_all(from: &TcpStream, to: &TcpStream, pipe: &Pipe) -> u64 {
    let mut total = 0u64;
    loop {
        // The pipe is empty here: fill it from the socket (at most its size).
        let mut held = match fill(from, pipe).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => n,
        };
        while held > 0 {
            match drain(to, pipe, held).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => {
                    held -= n;
                    total += n as u64;
                }
            }
        }
    }
}

async fn fill(from: &TcpStream, pipe: &Pipe) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_io(Interest::READABLE, || {
            splice(from, None, &pipe.write, None, pipe.size, FLAGS).map_err(io::Error::from)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

async fn drain(to: &TcpStream, pipe: &Pipe, len: usize) -> io::Result<usize> {
    loop {
        to.writable().await?;
        match to.try_io(Interest::WRITABLE, || {
            splice(&pipe.read, None, to, None, len, FLAGS).map_err(io::Error::from)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_exactly_and_the_budget_is_kept() {
        let fds = Descriptors::new(258); // 256 kept in reserve: 2 to share
        let pipe = Pipe::new(&fds, 256 * 1024).unwrap();
        assert!(Pipe::new(&fds, 1024).is_none(), "the budget is spent");
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let mut source = TcpStream::connect(aa).await.unwrap();
        let (from, _) = a.accept().await.unwrap();
        let to = TcpStream::connect(ba).await.unwrap();
        let (mut sink, _) = b.accept().await.unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            source.write_all(&sent).await.unwrap();
            source.shutdown().await.unwrap();
        });
        let relay = tokio::spawn(async move {
            let n = splice_all(&from, &to, &pipe).await;
            drop(to);
            n
        });
        let mut got = Vec::new();
        sink.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(relay.await.unwrap(), data.len() as u64);
        assert!(got == data, "the bytes arrived in order, unchanged");
        assert!(
            Pipe::new(&fds, 1024).is_some(),
            "the pipe gave its descriptors back"
        );
    }
}
