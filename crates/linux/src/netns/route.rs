//! rtnetlink: the sandbox's address on `lo` and the default route through it, so a `connect()` to
//! any IPv4 address reaches the nf_tables rules instead of failing with "network unreachable".

use super::SANDBOX_ADDR;
use super::netlink::{Attrs, Msg, NEW};

const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;

/// `ip addr add SANDBOX_ADDR/32 dev lo`
pub(crate) fn add_address(lo: u32) -> Msg {
    // struct ifaddrmsg { family, prefixlen, flags, scope: u8; index: u32 }
    let mut header = vec![libc::AF_INET as u8, 32, 0, libc::RT_SCOPE_UNIVERSE];
    header.extend_from_slice(&lo.to_ne_bytes());
    let addr = SANDBOX_ADDR.octets();
    Msg::new(RTM_NEWADDR, NEW, &header)
        .attr(IFA_LOCAL, &addr)
        .attr(IFA_ADDRESS, &addr)
}

/// `ip route add default dev lo src SANDBOX_ADDR`
pub(crate) fn add_default_route(lo: u32) -> Msg {
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
