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
pub use sandbox_mcp_netparse::dns::{Question, answers, question, reply};
use sandbox_mcp_netparse::dns::{RCODE_REFUSED, RCODE_SERVFAIL, TYPE_A, TYPE_AAAA};

/// How long one upstream gets to answer before the next is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest DNS message handled over UDP (EDNS0 buffers beyond this are not needed here).
pub const MAX_MESSAGE: usize = 4096;

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
    let msg = sandbox_mcp_netparse::dns::query(random_id(), name, TYPE_A)?;
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

    const TYPE_TXT: u16 = 16;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        sandbox_mcp_netparse::dns::query([0x12, 0x34], name, qtype).unwrap()
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
}
