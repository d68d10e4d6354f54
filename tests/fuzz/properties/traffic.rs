//! What a sandbox sends: DNS messages, ClientHellos, HTTP request heads (crates/netparse).

use std::net::IpAddr;

use sandbox_mcp_netparse::sniff::{self, Hello};
use sandbox_mcp_netparse::{dns, valid_name};

/// DNS messages: queries from a sandbox, answers from upstream. Input: one message.
///
/// Properties: a question's name is lowercase and, encoded again by the engine's own query
/// encoder, gives back the labels the message carries (the policy judges the very name the
/// upstream is asked); a reply to it keeps the id, the opcode and the question, holds no records,
/// is no longer than the query, and is asked again as the same question; the addresses of an
/// answer fit in its bytes. Then the encoders' round trip: a response built around the input's
/// bytes (A, AAAA, CNAME and TXT records, owners compressed or not) reads back to exactly its A
/// and AAAA addresses, and any truncation of it to none.
pub fn dns(data: &[u8]) {
    if let Some(q) = dns::question(data) {
        dns_question(data, &q);
    }
    if let Some(found) = dns::answers(data) {
        // An address record is at least a 1-byte name, 10 bytes of fields and 4 of address.
        assert!(
            found.len() * 15 <= data.len().saturating_sub(12),
            "{} addresses in {} bytes",
            found.len(),
            data.len()
        );
    }
    dns_round_trip(data);
}

fn dns_question(msg: &[u8], q: &dns::Question) {
    assert!(
        !q.name.bytes().any(|b| b.is_ascii_uppercase()),
        "{:?} is not lowercase",
        q.name
    );
    for rcode in [0, dns::RCODE_SERVFAIL, dns::RCODE_REFUSED] {
        let r = dns::reply(msg, q, rcode);
        let end = r.len();
        assert!(
            (12 + 5..=msg.len()).contains(&end),
            "a reply of {end} bytes"
        );
        assert_eq!(r[..2], msg[..2], "the id");
        assert_eq!(r[2], 0x80 | (msg[2] & 0x79), "QR, opcode, RD");
        assert_eq!(r[3], 0x80 | rcode, "RA and the code");
        assert_eq!(
            r[4..12],
            [0, 1, 0, 0, 0, 0, 0, 0],
            "one question, no records"
        );
        assert_eq!(r[12..], msg[12..end], "the question");
        assert_eq!(dns::answers(&r), Some(Vec::new()));
        let mut again = r;
        again[2] &= 0x7f;
        assert_eq!(dns::question(&again).as_ref(), Some(q), "asked again");
    }
    let end = dns::reply(msg, q, 0).len();
    assert_eq!(u16::from_be_bytes([msg[end - 4], msg[end - 3]]), q.qtype);
    let wire = &msg[12..end - 4];
    // Label lengths are at most 63, ASCII: when the labels are UTF-8, the name is their bytes.
    if std::str::from_utf8(wire).is_err() {
        return;
    }
    if q.name.is_empty() {
        assert_eq!(wire, [0], "an empty name is the root");
        return;
    }
    let asked = dns::query([msg[0], msg[1]], &q.name, q.qtype)
        .unwrap_or_else(|| panic!("{:?} was read as a question, but cannot be asked", q.name));
    assert_eq!(
        asked[12..asked.len() - 4],
        wire.to_ascii_lowercase(),
        "the name {:?} stands for other labels than the query's",
        q.name
    );
}

fn dns_round_trip(data: &[u8]) {
    let mut msg =
        dns::query([0x12, 0x34], "a.test", dns::TYPE_A).expect("a name that can be asked");
    msg[2] |= 0x80;
    let mut expected = Vec::new();
    let (mut at, mut count) = (0, 0u16);
    while at < data.len() && count < 64 {
        let kind = data[at];
        at += 1;
        let (rtype, len) = match (kind >> 1) & 3 {
            0 => (dns::TYPE_A, 4),
            1 => (dns::TYPE_AAAA, 16),
            2 => (5, usize::from(kind >> 3)),
            _ => (16, usize::from(kind >> 3)),
        };
        let rdata = &data[at..(at + len).min(data.len())];
        at += rdata.len();
        match (rtype, rdata.len()) {
            (dns::TYPE_A, 4) => {
                expected.push(IpAddr::from([rdata[0], rdata[1], rdata[2], rdata[3]]))
            }
            (dns::TYPE_AAAA, 16) => {
                let mut b = [0u8; 16];
                b.copy_from_slice(rdata);
                expected.push(IpAddr::from(b));
            }
            _ => {}
        }
        // The owner: a pointer to the question's name, or the name written out.
        if kind & 1 == 0 {
            msg.extend_from_slice(&[0xc0, 12]);
        } else {
            msg.extend_from_slice(b"\x01a\x04test\x00");
        }
        msg.extend_from_slice(&rtype.to_be_bytes());
        msg.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
        msg.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        msg.extend_from_slice(rdata);
        count += 1;
    }
    msg[6..8].copy_from_slice(&count.to_be_bytes());
    assert_eq!(dns::answers(&msg), Some(expected), "in {msg:?}");
    for cut in [msg.len() - 1, msg.len() / 2, 11] {
        if count > 0 || cut < msg.len() - 4 {
            assert_eq!(dns::answers(&msg[..cut]), None, "{msg:?} cut at {cut}");
        }
    }
}

/// Checks what `sniff` reads in the first bytes of a connection, whatever they are.
///
/// A name is a valid DNS name, lowercase, with no trailing dot, and the client sent it (its bytes
/// are in the input, up to case); once the input is complete (not `incomplete`), bytes after it
/// change nothing.
fn sniffed(data: &[u8]) -> Hello {
    let hello = sniff::parse(data);
    if let Some(name) = hello.name() {
        assert!(valid_name(name), "{name:?} is not a DNS name");
        assert!(
            !name.bytes().any(|b| b.is_ascii_uppercase()) && !name.ends_with('.'),
            "{name:?} is not clean"
        );
        let sent = data.to_ascii_lowercase();
        assert!(
            sent.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name:?} is not in the bytes the client sent"
        );
    }
    match &hello {
        Hello::Tls(_) => assert_eq!(data.first(), Some(&0x16)),
        Hello::Http(_) => assert!(data.first().is_some_and(u8::is_ascii_uppercase)),
        Hello::Other => {}
    }
    if !sniff::incomplete(data) {
        let mut more = data.to_vec();
        more.extend_from_slice(b"\r\nHost: other.test\r\n\r\n\x16\x03\x01\x00\x05\x01");
        assert_eq!(
            sniff::parse(&more),
            hello,
            "bytes after a complete hello changed it"
        );
    }
    hello
}

/// A host name made of the input's bytes: letters (some uppercase), digits, `-`, `_` and dots.
fn name_from(bytes: &[u8]) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-._AZ.";
    bytes
        .iter()
        .take(300)
        .map(|b| char::from(CHARS[usize::from(*b) % CHARS.len()]))
        .collect()
}

/// What `sniff` should make of `name`: lowercase, without a trailing dot, if a DNS name.
fn expected_name(name: &str) -> Option<String> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    valid_name(&name).then_some(name)
}

/// A ClientHello in one record carrying `name` as its server name (after a name of another type),
/// with other extensions before and after it.
fn tls_client_hello(name: &[u8], session_id: &[u8], extensions_before: usize) -> Vec<u8> {
    fn with_u16_len(out: &mut Vec<u8>, body: &[u8]) {
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
    }
    let mut names = vec![7];
    with_u16_len(&mut names, b"not-a-host-name");
    names.push(0);
    with_u16_len(&mut names, name);
    let mut sni = Vec::new();
    with_u16_len(&mut sni, &names);
    let mut exts = Vec::new();
    for i in 0..extensions_before {
        exts.extend_from_slice(&(10 + i as u16).to_be_bytes());
        with_u16_len(&mut exts, &[0, 2, 0, 0x1d]);
    }
    exts.extend_from_slice(&0u16.to_be_bytes());
    with_u16_len(&mut exts, &sni);
    exts.extend_from_slice(&43u16.to_be_bytes()); // supported_versions
    with_u16_len(&mut exts, &[2, 3, 4]);
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[7; 32]);
    hello.push(session_id.len() as u8);
    hello.extend_from_slice(session_id);
    hello.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02, 1, 0]);
    with_u16_len(&mut hello, &exts);
    let mut handshake = vec![1, 0];
    with_u16_len(&mut handshake, &hello);
    let mut record = vec![0x16, 3, 1];
    with_u16_len(&mut record, &handshake);
    record
}

/// The server name rustls' own `Acceptor` reads in `data`, when it accepts `data` as a ClientHello
/// with a name, sent in one record (rustls also reads a hello split over records; `sniff` does
/// not wait for more than the first).
fn rustls_server_name(data: &[u8]) -> Option<String> {
    let record = usize::from(u16::from_be_bytes([*data.get(3)?, *data.get(4)?]));
    let handshake = data.get(5..5 + record)?;
    let message = (usize::from(*handshake.get(1)?) << 16)
        | (usize::from(*handshake.get(2)?) << 8)
        | usize::from(*handshake.get(3)?);
    if handshake.len() < 4 + message {
        return None;
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut input = data;
    while !input.is_empty() {
        match acceptor.read_tls(&mut input) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let accepted = acceptor.accept().ok()??;
    accepted.client_hello().server_name().map(str::to_string)
}

/// The first bytes of a connection from a sandbox, read as a TLS ClientHello. Input: the bytes.
///
/// Properties: those of `sniffed`; a server name rustls' own ClientHello reader finds in one
/// record is the one `sniff` reads (cleaned the same way); then a ClientHello encoded around a name made of the input's
/// bytes (a session id, other extensions, a name of another type before it) reads back to that
/// name cleaned, and every truncation of it to no name (and is `incomplete`).
pub fn client_hello(data: &[u8]) {
    let hello = sniffed(data);
    if let Some(name) = rustls_server_name(data) {
        assert_eq!(
            hello,
            Hello::Tls(expected_name(&name)),
            "rustls reads {name:?}"
        );
    }
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    let name = name_from(rest);
    if name.len() > 1000 {
        return;
    }
    let sid = &rest[..rest.len().min(usize::from(shape & 31))];
    let hello = tls_client_hello(name.as_bytes(), sid, usize::from(shape >> 5));
    assert_eq!(
        sniffed(&hello),
        Hello::Tls(expected_name(&name)),
        "{name:?}"
    );
    assert!(!sniff::incomplete(&hello));
    for cut in [hello.len() - 1, hello.len() / 2, 5, 1] {
        assert!(sniff::incomplete(&hello[..cut]), "cut at {cut}");
        assert_eq!(
            sniff::parse(&hello[..cut]),
            Hello::Tls(None),
            "cut at {cut}"
        );
    }
}

/// The first bytes of a connection from a sandbox, read as an HTTP/1 request head. Input: the
/// bytes.
///
/// Properties: those of `sniffed`; a host it reads comes from the one Host header of the head;
/// then a request encoded around a host made of the input's bytes (with a port or not) reads back
/// to that host cleaned, and with a second Host header to none.
pub fn http_host(data: &[u8]) {
    if let Hello::Http(Some(name)) = sniffed(data) {
        let end = data
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a host only from a complete head");
        let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
        let hosts: Vec<&str> = (head.split("\r\n").skip(1))
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.trim() == "host")
            .map(|(_, v)| v.trim())
            .collect();
        assert!(
            hosts.len() == 1 && hosts[0].starts_with(&name),
            "{name:?} from the Host headers {hosts:?}"
        );
    }
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    let name = name_from(rest);
    let port = if shape & 1 == 0 { "" } else { ":8443" };
    let method = ["GET", "POST", "CONNECT", "OPTIONS"][usize::from(shape >> 1) % 4];
    let head = format!("{method} / HTTP/1.1\r\nAccept: */*\r\nhOsT:  {name}{port} \r\n");
    let once = format!("{head}User-Agent: x\r\n\r\nbody");
    assert_eq!(
        sniffed(once.as_bytes()),
        Hello::Http(expected_name(&name)),
        "{once:?}"
    );
    let twice = format!("{head}Host: {name}\r\n\r\n");
    assert_eq!(sniffed(twice.as_bytes()), Hello::Http(None), "{twice:?}");
}
