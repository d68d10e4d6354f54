//! The sandbox's resolver. Every DNS query a sandbox sends (UDP port 53, to any address) arrives
//! here; the engine decides, asks its own upstream resolvers, and answers.
//!
//! - Under an allowlist (see [`Policy::is_allowlist`]), a name no `allow_out` pattern matches is
//!   answered REFUSED without asking anyone: a query name cannot carry data out.
//! - An answer holding an address the engine forbids (127.0.0.1, 10.0.0.1, 169.254.169.254…) is
//!   refused as a whole: a name the sandbox may reach must not lead it to the host or the
//!   private network (DNS rebinding).
//! - AAAA queries get an empty answer: the sandbox has no IPv6 route, and an empty answer makes
//!   clients use IPv4 at once instead of trying an address that cannot work.
//! - The IPv4 answers are remembered per sandbox, so a connection to one of them on a port that
//!   names no host (not TLS, not HTTP) is judged by the name the sandbox resolved.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::policy::{Guard, Policy};

/// How long one upstream gets to answer before the next is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest DNS message handled over UDP (EDNS0 buffers beyond this are not needed here).
pub const MAX_MESSAGE: usize = 4096;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const RCODE_REFUSED: u8 = 5;
const RCODE_SERVFAIL: u8 = 2;

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
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
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

/// What the resolver did with one query, for the network log.
#[derive(Debug)]
pub struct Outcome {
    pub response: Vec<u8>,
    /// `None`: answered; `Some(rule)`: refused by this rule.
    pub blocked: Option<String>,
    /// The rule that let the name through, when one did.
    pub rule: String,
    /// IPv4 answers, to remember as this name's.
    pub addrs: Vec<Ipv4Addr>,
    /// Whether the upstream failed.
    pub failed: bool,
}

/// Answers one query from a sandbox under `policy`.
pub async fn resolve(
    msg: &[u8],
    q: &Question,
    policy: &Policy,
    guard: &Guard,
    upstreams: &[SocketAddr],
) -> Outcome {
    // A stand-in carried in a name (a DNS tunnel for it) goes nowhere, whatever the policy.
    if q.name.contains(crate::secrets::STANDIN_PREFIX) {
        return Outcome {
            response: reply(msg, q, RCODE_REFUSED),
            blocked: Some("leak attempt: a secret's stand-in in a DNS name".into()),
            rule: String::new(),
            addrs: Vec::new(),
            failed: false,
        };
    }
    let name_rule = policy.allows_name(&q.name).map(str::to_string);
    if policy.is_allowlist() && name_rule.is_none() {
        return Outcome {
            response: reply(msg, q, RCODE_REFUSED),
            blocked: Some(
                "allowlist: the name matches no allow_out pattern, so it does not resolve".into(),
            ),
            rule: String::new(),
            addrs: Vec::new(),
            failed: false,
        };
    }
    let rule = name_rule.unwrap_or_else(|| "default open".to_string());
    if q.qtype == TYPE_AAAA {
        return Outcome {
            response: reply(msg, q, 0),
            blocked: None,
            rule,
            addrs: Vec::new(),
            failed: false,
        };
    }
    let Some(response) = forward(msg, upstreams).await else {
        return Outcome {
            response: reply(msg, q, RCODE_SERVFAIL),
            blocked: None,
            rule: "no upstream resolver answered".into(),
            addrs: Vec::new(),
            failed: true,
        };
    };
    let found = answers(&response).unwrap_or_default();
    if let Some(why) = found.iter().find_map(|ip| guard.refuses(*ip)) {
        return Outcome {
            response: reply(msg, q, RCODE_REFUSED),
            blocked: Some(format!(
                "forbidden answer: {why}; a name cannot lead a sandbox there (DNS rebinding)"
            )),
            rule: String::new(),
            addrs: Vec::new(),
            failed: false,
        };
    }
    let addrs = found
        .into_iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .collect();
    Outcome {
        response,
        blocked: None,
        rule,
        addrs,
        failed: false,
    }
}

/// The addresses `name` resolves to (A records), asked by the engine itself.
pub async fn lookup(name: &str, upstreams: &[SocketAddr]) -> Option<Vec<IpAddr>> {
    let mut msg = random_id().to_vec();
    msg.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        msg.push(u8::try_from(label.len()).ok().filter(|l| *l <= 63)?);
        msg.extend_from_slice(label.as_bytes());
    }
    msg.push(0);
    msg.extend_from_slice(&TYPE_A.to_be_bytes());
    msg.extend_from_slice(&1u16.to_be_bytes());
    let response = forward(&msg, upstreams).await?;
    if response[3] & 0x0f != 0 {
        return None;
    }
    answers(&response).filter(|a| !a.is_empty())
}

fn random_id() -> [u8; 2] {
    let mut id = [0u8; 2];
    let _ = getrandom::fill(&mut id);
    id
}

/// Sends the query to each upstream in turn until one answers it (same id, a response).
async fn forward(msg: &[u8], upstreams: &[SocketAddr]) -> Option<Vec<u8>> {
    for upstream in upstreams {
        let bind: SocketAddr = if upstream.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let Ok(sock) = tokio::net::UdpSocket::bind(bind).await else {
            continue;
        };
        if sock.connect(upstream).await.is_err() || sock.send(msg).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; MAX_MESSAGE];
        let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
            if n >= 12 && buf[..2] == msg[..2] && buf[2] & 0x80 != 0 {
                buf.truncate(n);
                return Some(buf);
            }
        }
    }
    None
}

/// The host's resolvers: the `nameserver` lines of /etc/resolv.conf (port 53).
pub fn host_resolvers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            m.push(label.len() as u8);
            m.extend_from_slice(label.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m
    }

    #[test]
    fn questions_and_refusals() {
        let q = query("PyPI.test", TYPE_A);
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
    fn answers_are_read_through_compressed_names() {
        let q = query("a.test", TYPE_A);
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

    #[tokio::test]
    async fn an_allowlist_refuses_other_names_without_asking_anyone() {
        let policy = Policy::parse(
            &["pypi.test".into()],
            &["0.0.0.0/0".into()],
            crate::policy::EgressDefault::Open,
        )
        .unwrap();
        let q = query("secret-data.tunnel.test", TYPE_TXT);
        let parsed = question(&q).unwrap();
        // No upstream at all: a refusal cannot have asked one.
        let out = resolve(&q, &parsed, &policy, &Guard::default(), &[]).await;
        assert!(out.blocked.is_some());
        assert_eq!(out.response[3] & 0x0f, RCODE_REFUSED);
        let aaaa = query("pypi.test", TYPE_AAAA);
        let out = resolve(
            &aaaa,
            &question(&aaaa).unwrap(),
            &policy,
            &Guard::default(),
            &[],
        )
        .await;
        assert!(out.blocked.is_none());
        assert_eq!(out.response[3] & 0x0f, 0);
    }

    const TYPE_TXT: u16 = 16;
}
