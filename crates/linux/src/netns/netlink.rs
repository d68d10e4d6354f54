//! Netlink messages: a header, a fixed family header, then attributes (type-length-value, each
//! padded to 4 bytes; nested attributes carry a list of attributes as their value), sent in one
//! write on a socket of the calling thread's network namespace, every one acknowledged.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Appending attributes, to a message or to a nested attribute alike.
pub(crate) trait Attrs: Sized {
    fn buf(&mut self) -> &mut Vec<u8>;
    fn attr(mut self, kind: u16, value: &[u8]) -> Self {
        let buf = self.buf();
        buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(value);
        pad(buf);
        self
    }
    /// A NUL-terminated string.
    fn str(self, kind: u16, value: &str) -> Self {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }
    /// A big-endian u32 (nf_tables' byte order).
    fn u32(self, kind: u16, value: u32) -> Self {
        self.attr(kind, &value.to_be_bytes())
    }
    fn nest(self, kind: u16, inner: Nest) -> Self {
        self.attr(kind | NLA_F_NESTED, &inner.0)
    }
}

/// One netlink message under construction: its family header, then attributes.
pub(crate) struct Msg {
    kind: u16,
    flags: u16,
    body: Vec<u8>,
}

impl Attrs for Msg {
    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.body
    }
}

impl Msg {
    pub(crate) fn new(kind: u16, flags: u16, header: &[u8]) -> Self {
        let mut body = header.to_vec();
        pad(&mut body);
        Msg { kind, flags, body }
    }
    fn encode(&self, seq: u32) -> Vec<u8> {
        let len = 16 + self.body.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(len as u32).to_ne_bytes());
        out.extend_from_slice(&self.kind.to_ne_bytes());
        out.extend_from_slice(&self.flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// A nested attribute's value: a list of attributes.
#[derive(Default)]
pub(crate) struct Nest(Vec<u8>);

impl Attrs for Nest {
    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

const NLA_F_NESTED: u16 = 1 << 15;
pub(crate) const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
/// A request to create something that must not exist yet, acknowledged.
pub(crate) const NEW: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;

/// A netlink socket of one protocol, in the calling thread's network namespace.
pub(crate) struct Netlink(OwnedFd);

impl Netlink {
    pub(crate) fn open(protocol: i32) -> io::Result<Self> {
        // SAFETY: socket() with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: we own the new descriptor.
        Ok(Netlink(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends the messages in one write and waits for each one's acknowledgement; the first
    /// error the kernel reports fails the whole call.
    pub(crate) fn transact(&self, msgs: &[Msg]) -> io::Result<()> {
        let mut out = Vec::new();
        let mut expected = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            let seq = i as u32 + 1;
            out.extend_from_slice(&m.encode(seq));
            if m.flags & NLM_F_ACK != 0 {
                expected.push(seq);
            }
        }
        // SAFETY: writing a buffer we own to our socket (the kernel is the default destination).
        let n = unsafe { libc::send(self.0.as_raw_fd(), out.as_ptr().cast(), out.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 16 * 1024];
        while !expected.is_empty() {
            // SAFETY: reading into a buffer we own.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut at = 0usize;
            let n = n as usize;
            while at + 16 <= n {
                let len =
                    u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default()) as usize;
                let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                let seq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().unwrap_or_default());
                if len < 16 || at + len > n {
                    return Err(io::Error::other("malformed netlink reply"));
                }
                if kind == NLMSG_ERROR && len >= 20 {
                    let code =
                        i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap_or_default());
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    expected.retain(|s| *s != seq);
                }
                at += (len + 3) & !3;
            }
        }
        Ok(())
    }
}
