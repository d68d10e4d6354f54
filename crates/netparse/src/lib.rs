//! What a sandbox's traffic says about itself, read from the bytes it sent: the question of a DNS
//! query and the addresses of an answer ([`dns`]), and the host a client-first connection names
//! ([`sniff`]: a TLS ClientHello's server name, an HTTP/1 request's Host). The engine's egress
//! path (the network crate) decides on what these return.
//!
//! Every input is hostile: each parser reads only the bytes it is given, never panics, allocates
//! no more than the input's size, and answers "nothing" rather than guess. Pure functions, no
//! I/O, no dependencies: the fuzz harness (tests/fuzz) builds this crate alone.

pub mod dns;
pub mod sniff;

/// A DNS name of letters, digits, `-` and `_`, in labels of 1-63 characters, at most 253 long,
/// with at least one letter in its last label (so that it is not an address).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        && name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().any(|b| b.is_ascii_alphabetic()))
}
