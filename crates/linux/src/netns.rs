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
//!
//! The address and route go over rtnetlink (`route`), the rules over nf_tables (`nftables`),
//! both as messages built and sent by `netlink`.

mod netlink;
mod nftables;
mod route;

use netlink::Netlink;
use nftables::ruleset;
use route::{add_address, add_default_route};

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

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
