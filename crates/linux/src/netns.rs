//! The sandbox's network namespace, as the launcher (root, outside the sandbox's user namespace)
//! sets it up — or, unprivileged, as the agent sets it up from inside
//! ([`configure_unprivileged`]). Security-critical; keep it small.
//!
//! The namespace is created by the launcher *before* the sandbox's user namespace, so it is owned
//! by the host's: root inside the sandbox holds no capability over it and cannot change its
//! addresses, routes, sysctls or rules, open raw sockets, or add interfaces. It has one interface,
//! `lo`, and nothing leaves it. What it gets:
//!
//! - `lo` up, with [`SANDBOX_ADDR`] beside 127.0.0.1 and a default route through `lo`, so a
//!   `connect()` to any IPv4 address gets as far as the rules below instead of failing with
//!   "network unreachable";
//! - nf_tables rules (programmed over netlink: no `nft` binary needed) that steer every DNS query
//!   (UDP port 53, whatever the address) to [`DNS_PORT`] and every other TCP connection to
//!   [`EGRESS_PORT`] on 127.0.0.1, where the engine's listeners (sockets it creates in this
//!   namespace) accept them and read the real destination with `SO_ORIGINAL_DST`;
//! - a filter that drops every other packet leaving for a non-local address (other UDP, ICMP,
//!   SCTP…): the sending call fails at once with EPERM instead of hanging;
//! - `ip_unprivileged_port_start = 0`, so a server in the sandbox may listen on port 80 (binding
//!   a low port would otherwise need a capability the sandbox does not hold over this namespace).
//!
//! IPv6 has only `::1`: no route, so a connection to any other IPv6 address fails at once with
//! "network unreachable", and the engine's resolver answers AAAA queries with no addresses.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The sandbox's own address (on `lo`); what the engine's listeners see as the peer.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// Where TCP connections to non-local addresses are redirected (127.0.0.1 in the namespace).
pub const EGRESS_PORT: u16 = 15001;
/// Where DNS queries are redirected (127.0.0.1 in the namespace; UDP). The socket must be bound
/// to 127.0.0.1, not 0.0.0.0, or the replies do not get their original source back.
pub const DNS_PORT: u16 = 15053;

/// Configures the calling thread's (new, empty) network namespace as described above.
pub fn configure() -> io::Result<()> {
    sandbox_mcp_sys::syscalls::loopback_up()?;
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")?;
    steer()
}

/// The address, the default route through `lo`, and the rules.
fn steer() -> io::Result<()> {
    let lo = nix::net::if_::if_nametoindex("lo").map_err(io::Error::from)?;
    let route = Netlink::open(libc::NETLINK_ROUTE)?;
    route.transact(&[add_address(lo), add_default_route(lo)])?;
    let nft = Netlink::open(libc::NETLINK_NETFILTER)?;
    nft.transact(&ruleset())
}

/// Unprivileged, the agent does what the launcher and the engine do as root, from inside: the
/// same address, route and rules in its own namespace (the sandbox's user namespace owns it, so
/// this is allowed), and the engine's two sockets, which it hands to the engine over its unix
/// socket. Root in the sandbox can then flush the rules — and loses its network, nothing more:
/// the namespace still has no route out, and every connection that leaves is made by the engine,
/// from the host's namespace, under the sandbox's policy.
pub fn configure_unprivileged() -> io::Result<[OwnedFd; 2]> {
    steer()?;
    let tcp = listen(EGRESS_PORT)?;
    let dns = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, DNS_PORT))?;
    Ok([OwnedFd::from(tcp), OwnedFd::from(dns)])
}

/// Checks that descriptors handed over by an unprivileged sandbox's agent are what they claim:
/// a listening TCP socket and a UDP socket, both on 127.0.0.1 at the expected ports. (The agent
/// shares its id with sandbox code; whatever it hands over, the engine still decides every
/// connection, but it must not serve a file or a socket of another kind.)
pub fn check_handed_sockets(
    tcp: OwnedFd,
    dns: OwnedFd,
) -> io::Result<(std::net::TcpListener, std::net::UdpSocket)> {
    use nix::sys::socket::{SockType, SockaddrIn, getsockname, getsockopt, sockopt};
    let expect = |fd: &OwnedFd, kind: SockType, port: u16, listening: bool| -> io::Result<()> {
        let ok = getsockopt(fd, sockopt::SockType).map_err(io::Error::from)? == kind
            && getsockname::<SockaddrIn>(fd.as_raw_fd()).map_err(io::Error::from)?
                == SockaddrIn::new(127, 0, 0, 1, port)
            && (!listening || getsockopt(fd, sockopt::AcceptConn).map_err(io::Error::from)?);
        if ok {
            Ok(())
        } else {
            Err(io::Error::other(
                "the agent handed over sockets of the wrong kind",
            ))
        }
    };
    expect(&tcp, SockType::Stream, EGRESS_PORT, true)?;
    expect(&dns, SockType::Datagram, DNS_PORT, false)?;
    Ok((tcp.into(), dns.into()))
}

/// Creates the engine's two sockets inside the network namespace of process `pid` (a sandbox's
/// agent). Enters that namespace: call it on a thread that is thrown away afterwards.
pub fn sockets_in(pid: i32) -> io::Result<sandbox_mcp_model::driver::EgressSockets> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    Ok(sandbox_mcp_model::driver::EgressSockets {
        tcp: listen(EGRESS_PORT)?,
        dns: std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, DNS_PORT))?,
        netns: Some(ns),
    })
}

/// A TCP listener on 127.0.0.1:`port` with a deep backlog (a sandbox may open connections in
/// bursts) and SO_REUSEADDR (after an engine restart, the old one's connections may linger).
fn listen(port: u16) -> io::Result<std::net::TcpListener> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket,
        sockopt,
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, port))?;
    listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))?;
    Ok(std::net::TcpListener::from(fd))
}

// ---------------------------------------------------------------------------------------------
// Netlink messages: a header, a fixed family header, then attributes (type-length-value, each
// padded to 4 bytes; nested attributes carry a list of attributes as their value).

/// Appending attributes, to a message or to a nested attribute alike.
trait Attrs: Sized {
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
struct Msg {
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
    fn new(kind: u16, flags: u16, header: &[u8]) -> Self {
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
struct Nest(Vec<u8>);

impl Attrs for Nest {
    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

const NLA_F_NESTED: u16 = 1 << 15;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;

/// A netlink socket of one protocol, in the calling thread's network namespace.
struct Netlink(OwnedFd);

impl Netlink {
    fn open(protocol: i32) -> io::Result<Self> {
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
    fn transact(&self, msgs: &[Msg]) -> io::Result<()> {
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

// ---------------------------------------------------------------------------------------------
// rtnetlink: the address and the default route.

const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;
const NEW: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;

/// `ip addr add SANDBOX_ADDR/32 dev lo`
fn add_address(lo: u32) -> Msg {
    // struct ifaddrmsg { family, prefixlen, flags, scope: u8; index: u32 }
    let mut header = vec![libc::AF_INET as u8, 32, 0, libc::RT_SCOPE_UNIVERSE];
    header.extend_from_slice(&lo.to_ne_bytes());
    let addr = SANDBOX_ADDR.octets();
    Msg::new(RTM_NEWADDR, NEW, &header)
        .attr(IFA_LOCAL, &addr)
        .attr(IFA_ADDRESS, &addr)
}

/// `ip route add default dev lo src SANDBOX_ADDR`
fn add_default_route(lo: u32) -> Msg {
    // struct rtmsg { family, dst_len, src_len, tos, table, protocol, scope, type: u8; flags: u32 }
    let mut header = vec![
        libc::AF_INET as u8,
        0,
        0,
        0,
        libc::RT_TABLE_MAIN,
        libc::RTPROT_BOOT,
        libc::RT_SCOPE_LINK,
        libc::RTN_UNICAST,
    ];
    header.extend_from_slice(&0u32.to_ne_bytes());
    Msg::new(RTM_NEWROUTE, NEW, &header)
        .attr(RTA_OIF, &lo.to_ne_bytes())
        .attr(RTA_PREFSRC, &SANDBOX_ADDR.octets())
}

// ---------------------------------------------------------------------------------------------
// nf_tables: one table, two chains, in one atomic batch. As `nft` would print it:
//
//   table ip sandbox {
//     chain steer { type nat hook output priority -100; policy accept;
//       udp dport 53 redirect to :DNS_PORT          # every query, whatever resolver it names
//       ip daddr 127.0.0.0/8 return                 # the sandbox's own loopback
//       ip daddr SANDBOX_ADDR return                # and its own address
//       meta l4proto tcp redirect to :EGRESS_PORT   # everything else: to the engine
//     }
//     chain out { type filter hook output priority 0; policy drop;
//       ip daddr 127.0.0.0/8 accept
//       ip daddr SANDBOX_ADDR accept                # (replies of the redirected connections)
//     }
//   }

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_IPV4: u8 = 2;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_RETURN: u32 = -5i32 as u32;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;

const TABLE: &str = "sandbox";

fn nft_msg(kind: u16, flags: u16) -> Msg {
    // struct nfgenmsg { family: u8, version: u8, res_id: be16 }
    Msg::new(
        (NFNL_SUBSYS_NFTABLES << 8) | kind,
        flags,
        &[NFPROTO_IPV4, 0, 0, 0],
    )
}

fn batch(kind: u16) -> Msg {
    let id = NFNL_SUBSYS_NFTABLES.to_be_bytes();
    Msg::new(
        kind,
        NLM_F_REQUEST,
        &[libc::AF_UNSPEC as u8, 0, id[0], id[1]],
    )
}

fn chain(name: &str, kind: &str, priority: i32, policy: u32) -> Msg {
    // NFTA_CHAIN_TABLE = 1, NAME = 3, HOOK = 4 {HOOKNUM = 1, PRIORITY = 2}, POLICY = 5, TYPE = 7
    let hook = Nest::default()
        .u32(1, NF_INET_LOCAL_OUT)
        .u32(2, priority as u32);
    nft_msg(NFT_MSG_NEWCHAIN, NEW)
        .str(1, TABLE)
        .str(3, name)
        .nest(4, hook)
        .u32(5, policy)
        .str(7, kind)
}

fn rule(chain: &str, exprs: Vec<Nest>) -> Msg {
    // NFTA_RULE_TABLE = 1, CHAIN = 2, EXPRESSIONS = 4 (a list of NFTA_LIST_ELEM = 1)
    let list = exprs.into_iter().fold(Nest::default(), |l, e| l.nest(1, e));
    nft_msg(NFT_MSG_NEWRULE, NEW | 0x800 /* NLM_F_APPEND */)
        .str(1, TABLE)
        .str(2, chain)
        .nest(4, list)
}

/// An expression: NFTA_EXPR_NAME = 1, NFTA_EXPR_DATA = 2.
fn expr(name: &str, data: Nest) -> Nest {
    Nest::default().str(1, name).nest(2, data)
}

/// Loads `len` bytes at `offset` of a header (1 network, 2 transport) into register 1.
fn payload(base: u32, offset: u32, len: u32) -> Nest {
    // NFTA_PAYLOAD_DREG = 1, BASE = 2, OFFSET = 3, LEN = 4
    expr(
        "payload",
        Nest::default()
            .u32(1, NFT_REG_1)
            .u32(2, base)
            .u32(3, offset)
            .u32(4, len),
    )
}

/// Loads the layer 4 protocol number into register 1.
fn meta_l4proto() -> Nest {
    // NFTA_META_DREG = 1, KEY = 2 (NFT_META_L4PROTO = 16)
    expr("meta", Nest::default().u32(1, NFT_REG_1).u32(2, 16))
}

/// A data value: NFTA_DATA_VALUE = 1.
fn value(bytes: &[u8]) -> Nest {
    Nest::default().attr(1, bytes)
}

/// Register 1 equals `bytes`, or the rule stops here.
fn equals(bytes: &[u8]) -> Nest {
    // NFTA_CMP_SREG = 1, OP = 2 (NFT_CMP_EQ = 0), DATA = 3
    expr(
        "cmp",
        Nest::default()
            .u32(1, NFT_REG_1)
            .u32(2, 0)
            .nest(3, value(bytes)),
    )
}

/// Register 1 &= mask (4 bytes).
fn mask(bytes: [u8; 4]) -> Nest {
    // NFTA_BITWISE_SREG = 1, DREG = 2, LEN = 3, MASK = 4, XOR = 5
    expr(
        "bitwise",
        Nest::default()
            .u32(1, NFT_REG_1)
            .u32(2, NFT_REG_1)
            .u32(3, 4)
            .nest(4, value(&bytes))
            .nest(5, value(&[0; 4])),
    )
}

fn verdict(code: u32) -> Nest {
    // NFTA_IMMEDIATE_DREG = 1, DATA = 2 {NFTA_DATA_VERDICT = 2 {NFTA_VERDICT_CODE = 1}}
    expr(
        "immediate",
        Nest::default()
            .u32(1, NFT_REG_VERDICT)
            .nest(2, Nest::default().nest(2, Nest::default().u32(1, code))),
    )
}

/// Redirects to a port of 127.0.0.1 (locally generated packets are redirected to loopback).
fn redirect(port: u16) -> Vec<Nest> {
    vec![
        expr(
            "immediate",
            Nest::default()
                .u32(1, NFT_REG_1)
                .nest(2, value(&port.to_be_bytes())),
        ),
        // NFTA_REDIR_REG_PROTO_MIN = 1
        expr("redir", Nest::default().u32(1, NFT_REG_1)),
    ]
}

fn daddr_in_loopback() -> Vec<Nest> {
    vec![
        payload(1, 16, 4),
        mask([255, 0, 0, 0]),
        equals(&[127, 0, 0, 0]),
    ]
}

fn daddr_is_sandbox() -> Vec<Nest> {
    vec![payload(1, 16, 4), equals(&SANDBOX_ADDR.octets())]
}

fn ruleset() -> Vec<Msg> {
    let then = |mut m: Vec<Nest>, tail: Vec<Nest>| {
        m.extend(tail);
        m
    };
    let udp_53 = vec![
        meta_l4proto(),
        equals(&[libc::IPPROTO_UDP as u8]),
        payload(2, 2, 2),
        equals(&53u16.to_be_bytes()),
    ];
    let tcp = vec![meta_l4proto(), equals(&[libc::IPPROTO_TCP as u8])];
    vec![
        batch(NFNL_MSG_BATCH_BEGIN),
        // NFTA_TABLE_NAME = 1
        nft_msg(NFT_MSG_NEWTABLE, NEW).str(1, TABLE),
        chain("steer", "nat", -100, NF_ACCEPT),
        chain("out", "filter", 0, NF_DROP),
        rule("steer", then(udp_53, redirect(DNS_PORT))),
        rule(
            "steer",
            then(daddr_in_loopback(), vec![verdict(NFT_RETURN)]),
        ),
        rule("steer", then(daddr_is_sandbox(), vec![verdict(NFT_RETURN)])),
        rule("steer", then(tcp, redirect(EGRESS_PORT))),
        rule("out", then(daddr_in_loopback(), vec![verdict(NF_ACCEPT)])),
        rule("out", then(daddr_is_sandbox(), vec![verdict(NF_ACCEPT)])),
        batch(NFNL_MSG_BATCH_END),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};

    /// Runs `f` on a thread of its own in a new, configured network namespace (a namespace is
    /// per thread), or says why not.
    fn in_sandbox_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: configuring a network namespace needs root (CAP_NET_ADMIN)");
            return None;
        }
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET)");
            configure().expect("configure");
            f()
        })
        .join()
        .ok()
    }

    #[test]
    fn tcp_to_anywhere_reaches_the_listener_with_its_real_destination() {
        let got = in_sandbox_netns(|| {
            let listener = TcpListener::bind(("127.0.0.1", EGRESS_PORT)).unwrap();
            let mut client = TcpStream::connect("198.51.100.7:8080").unwrap();
            client.write_all(b"hi").unwrap();
            let (mut conn, peer) = listener.accept().unwrap();
            let dst = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::OriginalDst)
                .unwrap();
            let mut buf = [0u8; 2];
            conn.read_exact(&mut buf).unwrap();
            (
                peer,
                u32::from_be(dst.sin_addr.s_addr),
                u16::from_be(dst.sin_port),
                buf,
            )
        });
        let Some((peer, ip, port, buf)) = got else {
            return;
        };
        assert_eq!(peer.ip(), std::net::IpAddr::V4(SANDBOX_ADDR));
        assert_eq!(Ipv4Addr::from(ip), Ipv4Addr::new(198, 51, 100, 7));
        assert_eq!(port, 8080);
        assert_eq!(&buf, b"hi");
    }

    #[test]
    fn dns_to_any_resolver_reaches_the_listener_and_other_udp_fails_at_once() {
        let got = in_sandbox_netns(|| {
            let dns = UdpSocket::bind(("127.0.0.1", DNS_PORT)).unwrap();
            let client = UdpSocket::bind("0.0.0.0:0").unwrap();
            client.send_to(b"query", "203.0.113.53:53").unwrap();
            let mut buf = [0u8; 16];
            let (n, from) = dns.recv_from(&mut buf).unwrap();
            dns.send_to(b"answer", from).unwrap();
            let (m, replier) = client.recv_from(&mut buf[n..]).unwrap();
            let other = client
                .send_to(b"x", "203.0.113.9:9999")
                .map_err(|e| e.raw_os_error());
            (buf[..n].to_vec(), m, replier, other)
        });
        let Some((query, m, replier, other)) = got else {
            return;
        };
        assert_eq!(query, b"query");
        assert_eq!(m, 6);
        // The reply comes back from the address the client asked.
        assert_eq!(replier, "203.0.113.53:53".parse::<SocketAddr>().unwrap());
        assert_eq!(other, Err(Some(libc::EPERM)));
    }

    #[test]
    fn loopback_stays_local_and_ipv6_fails_fast() {
        let got = in_sandbox_netns(|| {
            let server = TcpListener::bind("127.0.0.1:8000").unwrap();
            let local = TcpStream::connect("127.0.0.1:8000").is_ok();
            drop(server);
            let v6 = TcpStream::connect("[2001:db8::1]:80").map_err(|e| e.raw_os_error());
            let low_port = TcpListener::bind("127.0.0.1:80").is_ok();
            (local, v6, low_port)
        });
        let Some((local, v6, low_port)) = got else {
            return;
        };
        assert!(local);
        assert_eq!(v6.err(), Some(Some(libc::ENETUNREACH)));
        assert!(low_port);
    }
}
