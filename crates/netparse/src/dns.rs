//! DNS messages (RFC 1035 4.1) as the sandbox's resolver reads and writes them: the one question
//! of a query, a bodiless answer to it, and the addresses in an upstream's answer.
//!
//! Only what the resolver needs is read: names in a question are never compressed (a pointer
//! there is no question), and an answer's records are walked without following pointers (each
//! name is only skipped), so no message can make a parser loop or read outside it.

use std::net::IpAddr;

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_REFUSED: u8 = 5;

/// The question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Lowercase, without the trailing dot.
    pub name: String,
    pub qtype: u16,
    /// Where the question section ends in the message.
    end: usize,
}

/// The question of a standard query with exactly one question, or `None`.
pub fn question(msg: &[u8]) -> Option<Question> {
    if msg.len() < 12 || msg[2] & 0x80 != 0 || u16::from_be_bytes([msg[4], msg[5]]) != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // No compression in a question, and labels of at most 63 bytes.
        if len > 63 {
            return None;
        }
        let label = msg.get(at..at + len)?;
        // A dot inside a label would make the name judged (the labels joined by dots) another
        // name than the one asked upstream: `pypi.org` as one label is not pypi.org.
        if label.contains(&b'.') {
            return None;
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
        // At most 255 bytes of name with its final zero (RFC 1035 3.1), as in `query`.
        if at - 12 > 254 {
            return None;
        }
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    msg.get(at + 2..at + 4)?;
    Some(Question {
        name: labels.join("."),
        qtype,
        end: at + 4,
    })
}

/// An answer with no records and the given code, for the query `msg` (whose question is `q`).
pub fn reply(msg: &[u8], q: &Question, rcode: u8) -> Vec<u8> {
    let mut out = msg[..q.end].to_vec();
    // QR, the query's opcode and RD; RA; the code. One question, no records.
    out[2] = 0x80 | (msg[2] & 0x79);
    out[3] = 0x80 | rcode;
    out[6..12].fill(0);
    out
}

/// A standard query (recursion desired, class IN) with id `id` for `name` of type `qtype`, or
/// `None` if `name` cannot be asked: an empty label, a label over 63 bytes, or over 253 bytes in
/// all.
pub fn query(id: [u8; 2], name: &str, qtype: u16) -> Option<Vec<u8>> {
    if name.len() > 253 {
        return None;
    }
    let mut msg = id.to_vec();
    msg.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|l| (1..=63).contains(l))?;
        msg.push(len);
        msg.extend_from_slice(label.as_bytes());
    }
    msg.push(0);
    msg.extend_from_slice(&qtype.to_be_bytes());
    msg.extend_from_slice(&1u16.to_be_bytes());
    Some(msg)
}

/// The addresses (A and AAAA) in the answer section of a response, or `None` if it is malformed.
pub fn answers(msg: &[u8]) -> Option<Vec<IpAddr>> {
    if msg.len() < 12 {
        return None;
    }
    let qd = u16::from_be_bytes([msg[4], msg[5]]);
    let an = u16::from_be_bytes([msg[6], msg[7]]);
    let mut at = 12;
    for _ in 0..qd {
        at = skip_name(msg, at)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        at = skip_name(msg, at)?;
        let head = msg.get(at..at + 10)?;
        let rtype = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[8], head[9]]));
        let data = msg.get(at + 10..at + 10 + len)?;
        match (rtype, len) {
            (TYPE_A, 4) => out.push(IpAddr::from([data[0], data[1], data[2], data[3]])),
            (TYPE_AAAA, 16) => {
                let mut b = [0u8; 16];
                b.copy_from_slice(data);
                out.push(IpAddr::from(b));
            }
            _ => {}
        }
        at += 10 + len;
    }
    Some(out)
}

/// The offset just past a (possibly compressed) name.
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => {
                msg.get(at + 1)?;
                return Some(at + 2);
            }
            l if l <= 63 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn questions_and_refusals() {
        let q = query([0x12, 0x34], "PyPI.test", TYPE_A).unwrap();
        let parsed = question(&q).unwrap();
        assert_eq!(parsed.name, "pypi.test");
        assert_eq!(parsed.qtype, TYPE_A);
        let r = reply(&q, &parsed, RCODE_REFUSED);
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[2] & 0x80, 0x80);
        assert_eq!(r[3] & 0x0f, RCODE_REFUSED);
        assert!(answers(&r).unwrap().is_empty());
        // Truncations and compression pointers in a question are no question, never a panic.
        for n in 0..q.len() {
            assert_eq!(question(&q[..n]), None);
        }
        let mut pointer = q.clone();
        pointer[12] = 0xc0;
        assert_eq!(question(&pointer), None);
    }

    #[test]
    fn a_question_is_the_name_asked_or_none() {
        // `exfil.pypi.org` to a policy joining labels, a name in the `pypi.org` TLD upstream.
        let mut q = query([0, 1], "exfil.pypi-org", TYPE_A).unwrap();
        q[18 + 5] = b'.';
        assert_eq!(question(&q), None);
        // The longest name that can be asked is read; one label more is no question.
        let long = ["a".repeat(63).as_str(); 4].join(".");
        let q = query([0, 0], &long[..253], TYPE_A).unwrap();
        assert_eq!(question(&q).unwrap().name, long[..253]);
        let mut longer = q[..12].to_vec();
        longer.extend_from_slice(b"\x01a");
        longer.extend_from_slice(&q[12..]);
        assert_eq!(question(&longer), None);
    }

    #[test]
    fn queries_carry_only_names_that_can_be_asked() {
        assert_eq!(query([0, 0], "a..test", TYPE_A), None);
        assert_eq!(query([0, 0], "", TYPE_A), None);
        assert_eq!(query([0, 0], &"a".repeat(64), TYPE_A), None);
        let long = ["a".repeat(63).as_str(); 4].join(".");
        assert_eq!(
            query([0, 0], &long[..253], TYPE_A).map(|q| q.len()),
            Some(12 + 255 + 4)
        );
        assert_eq!(query([0, 0], &long[..254], TYPE_A), None);
    }

    #[test]
    fn answers_are_read_through_compressed_names() {
        let q = query([0x12, 0x34], "a.test", TYPE_A).unwrap();
        let mut r = q.clone();
        r[2] = 0x81;
        r[3] = 0x80;
        r[7] = 2; // two answers
        for ip in [[198, 51, 100, 7], [127, 0, 0, 1]] {
            r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            r.extend_from_slice(&ip);
        }
        assert_eq!(
            answers(&r).unwrap(),
            vec![
                IpAddr::from([198, 51, 100, 7]),
                IpAddr::from([127, 0, 0, 1])
            ]
        );
        assert_eq!(answers(&r[..r.len() - 1]), None);
    }
}
