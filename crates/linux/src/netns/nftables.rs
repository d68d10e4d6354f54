//! The nf_tables ruleset that steers a sandbox's traffic to the engine: one table, two chains, in
//! one atomic batch of netlink messages (no `nft` binary needed). As `nft` would print it:
//!
//! ```text
//! table ip sandbox {
//!   chain steer { type nat hook output priority -100; policy accept;
//!     udp dport 53 redirect to :DNS_PORT          # every query, whatever resolver it names
//!     ip daddr 127.0.0.0/8 return                 # the sandbox's own loopback
//!     ip daddr SANDBOX_ADDR return                # and its own address
//!     meta l4proto tcp redirect to :EGRESS_PORT   # everything else: to the engine
//!   }
//!   chain out { type filter hook output priority 0; policy drop;
//!     ip daddr 127.0.0.0/8 accept
//!     ip daddr SANDBOX_ADDR accept                # (replies of the redirected connections)
//!   }
//! }
//! ```

use super::netlink::{Attrs, Msg, NEW, NLM_F_REQUEST, Nest};
use super::{DNS_PORT, EGRESS_PORT, SANDBOX_ADDR};

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

pub(crate) fn ruleset() -> Vec<Msg> {
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
