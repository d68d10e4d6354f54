//! Addresses the engine and the MCP layer refuse to reach on anyone's behalf: loopback, private,
//! link-local and the other special-purpose ranges, and the host's own addresses, less what the
//! operator opens. The egress policy (`sandbox-mcp-network`) and the OAuth server's fetches of
//! client metadata share it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// An IPv4 or IPv6 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub const fn v4(a: [u8; 4], prefix: u8) -> Self {
        Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
            prefix,
        }
    }

    /// `10.0.0.0/8`, `2001:db8::/32`, or a single address (`/32` or `/128` implied).
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
            Some(_) => return None,
            None => max,
        };
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    /// Whether this is `0.0.0.0/0`.
    pub fn covers_all_ipv4(&self) -> bool {
        self.prefix == 0 && self.addr.is_ipv4()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Ranges no sandbox reaches unless the operator names them, with the reason given when one is
/// refused. Besides the ranges the issue of record names (loopback, link-local with the cloud
/// metadata address, private, shared), the other non-global special-purpose ranges of the IANA
/// registries: they either stay inside a site or mean nothing on the internet.
const FORBIDDEN: &[(Cidr, &str)] = &[
    (Cidr::v4([0, 0, 0, 0], 8), "\"this network\" (0.0.0.0/8)"),
    (Cidr::v4([10, 0, 0, 0], 8), "a private range (10.0.0.0/8)"),
    (
        Cidr::v4([100, 64, 0, 0], 10),
        "the shared address space (100.64.0.0/10)",
    ),
    (Cidr::v4([127, 0, 0, 0], 8), "loopback (127.0.0.0/8)"),
    (
        Cidr::v4([169, 254, 0, 0], 16),
        "link-local, where cloud metadata lives (169.254.0.0/16)",
    ),
    (
        Cidr::v4([172, 16, 0, 0], 12),
        "a private range (172.16.0.0/12)",
    ),
    (
        Cidr::v4([192, 0, 0, 0], 24),
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    (Cidr::v4([192, 0, 2, 0], 24), "documentation (192.0.2.0/24)"),
    (
        Cidr::v4([192, 168, 0, 0], 16),
        "a private range (192.168.0.0/16)",
    ),
    (
        Cidr::v4([198, 18, 0, 0], 15),
        "benchmarking (198.18.0.0/15)",
    ),
    (
        Cidr::v4([198, 51, 100, 0], 24),
        "documentation (198.51.100.0/24)",
    ),
    (
        Cidr::v4([203, 0, 113, 0], 24),
        "documentation (203.0.113.0/24)",
    ),
    (Cidr::v4([224, 0, 0, 0], 4), "multicast (224.0.0.0/4)"),
    (Cidr::v4([240, 0, 0, 0], 4), "reserved (240.0.0.0/4)"),
];

/// Why an address is forbidden, if it is (IPv6 beyond the mapped range is never routed from a
/// sandbox, so only the well-known local ranges are named).
fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => FORBIDDEN
            .iter()
            .find(|(c, _)| c.contains(IpAddr::V4(v4)))
            .map(|(_, why)| *why),
        IpAddr::V6(v6) => {
            let s = v6.segments()[0];
            if v6.is_loopback() || v6.is_unspecified() {
                Some("loopback (::1)")
            } else if s & 0xfe00 == 0xfc00 {
                Some("a private range (fc00::/7)")
            } else if s & 0xffc0 == 0xfe80 {
                Some("link-local (fe80::/10)")
            } else if s & 0xff00 == 0xff00 {
                Some("multicast (ff00::/8)")
            } else {
                None
            }
        }
    }
}

/// What the engine forbids for every sandbox (and for its own fetches on a client's behalf): [`FORBIDDEN`], the host's own addresses, less what
/// the operator allowed with `--egress-allow`.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// `--egress-allow`: ranges the operator opened.
    pub operator_allowed: Vec<Cidr>,
    /// The host's own addresses (every interface), read at start.
    pub host_addrs: Vec<IpAddr>,
}

impl Guard {
    /// Why `ip` must not be reached, or `None` when sandboxes may (subject to their policy).
    pub fn refuses(&self, ip: IpAddr) -> Option<String> {
        let ip = canonical(ip);
        if self.operator_allowed.iter().any(|c| c.contains(ip)) {
            return None;
        }
        if self.host_addrs.contains(&ip) {
            return Some(format!("{ip} is this host's own address"));
        }
        forbidden_range(ip).map(|why| format!("{ip} is in {why}"))
    }
}

/// Every address of this host's interfaces (read once by whoever guards).
pub fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|a| {
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}
