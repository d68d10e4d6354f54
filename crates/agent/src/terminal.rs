//! Terminals for attached processes: a pseudo-terminal whose slave side is the process's stdin,
//! stdout, stderr and controlling terminal, and whose master side the agent keeps.
//!
//! The rest of the agent moves a process's bytes through pipes (exit, drain and kill logic all
//! speak pipes), so the master is relayed to a pair of pipes by two small tasks: what the process
//! writes to the terminal comes out of one, what is written into the other is typed into the
//! terminal. The output pipe ends when the terminal has no process left on it (the master reads
//! EIO), which is what "stdout closed" means for a terminal.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::spawn::error;
use sandbox_mcp_protocol::{AgentError, ErrorKind, TerminalSize};

/// Largest terminal accepted, in either dimension.
const MAX_SIDE: u16 = 4096;

/// The master side of a process's terminal.
pub struct Terminal {
    master: AsyncFd<OwnedFd>,
}

fn winsize(size: TerminalSize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Checks a size asked for.
pub(crate) fn check(size: TerminalSize) -> Result<(), AgentError> {
    if size.cols == 0 || size.rows == 0 || size.cols > MAX_SIDE || size.rows > MAX_SIDE {
        return Err(error(
            ErrorKind::InvalidArgument,
            format!(
                "a terminal of {}x{} characters: each side is 1 to {MAX_SIDE}",
                size.cols, size.rows
            ),
        ));
    }
    Ok(())
}

/// A new terminal of `size`: its master (kept by the agent) and its slave (for the process).
pub(crate) fn open(size: TerminalSize) -> Result<(Rc<Terminal>, OwnedFd), AgentError> {
    check(size)?;
    let fail = |e: nix::Error| error(ErrorKind::Io, format!("cannot open a terminal: {e}"));
    let pty = nix::pty::openpty(Some(&winsize(size)), None).map_err(fail)?;
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(fail)?;
    }
    let flags = nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_GETFL).map_err(fail)?;
    let mut flags = nix::fcntl::OFlag::from_bits_truncate(flags);
    flags.insert(nix::fcntl::OFlag::O_NONBLOCK);
    nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(fail)?;
    // SAFETY: the master is a valid descriptor the AsyncFd owns, and it is never replaced or
    // closed while registered.
    let master = unsafe { AsyncFd::register(pty.master) }
        .map_err(|e| error(ErrorKind::Io, format!("cannot watch a terminal: {e}")))?;
    Ok((Rc::new(Terminal { master }), pty.slave))
}

impl Terminal {
    /// Resizes the terminal (its process gets SIGWINCH from the kernel).
    pub(crate) fn resize(&self, size: TerminalSize) -> Result<(), AgentError> {
        check(size)?;
        let ws = winsize(size);
        // SAFETY: TIOCSWINSZ on a terminal descriptor we own, with a valid winsize.
        let ret = unsafe { libc::ioctl(self.master.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if ret < 0 {
            return Err(error(
                ErrorKind::Io,
                format!(
                    "cannot resize the terminal: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        Ok(())
    }

    async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            match ready.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(Into::into)) {
                Ok(Ok(n)) => return Ok(n),
                // No process left on the slave side: the terminal's end of file.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut ready = self.master.writable().await?;
            match ready.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(Into::into)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Pipes standing for the terminal: its output comes out of the first, and what is written
    /// into the second is typed into it. Relayed by tasks on the agent's local set.
    pub(crate) fn relay(self: &Rc<Self>) -> Result<(pipe::Receiver, pipe::Sender), AgentError> {
        let fail =
            |e: std::io::Error| error(ErrorKind::Io, format!("cannot relay a terminal: {e}"));
        let (mut out_tx, out_rx) = pipe::pipe().map_err(fail)?;
        let (in_tx, mut in_rx) = pipe::pipe().map_err(fail)?;
        let term = self.clone();
        tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = term.read(&mut buf).await {
                if n == 0 || out_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        let term = self.clone();
        tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = in_rx.read(&mut buf).await {
                if n == 0 || term.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        Ok((out_rx, in_tx))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_is_1_to_4096_characters_a_side() {
        let size = |cols, rows| TerminalSize { cols, rows };
        assert!(check(size(80, 24)).is_ok() && check(size(MAX_SIDE, MAX_SIDE)).is_ok());
        for bad in [
            size(0, 24),
            size(80, 0),
            size(MAX_SIDE + 1, 24),
            size(80, MAX_SIDE + 1),
        ] {
            let e = check(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains("1 to 4096"), "{}", e.message);
        }
    }
}
