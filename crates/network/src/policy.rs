//! Egress policy: what a sandbox may reach. Pure: parsed from the rules a caller gives, evaluated
//! per connection and per DNS name by the relay and the resolver.
//!
//! Order of evaluation, for a destination address and the name it is known by (TLS SNI, HTTP
//! Host, or the name the sandbox resolved through the engine):
//!
//! 1. an address the engine forbids (the host's own, loopback, link-local, private and shared
//!    ranges, and other special-purpose ranges) is blocked, whatever the sandbox's rules, unless
//!    the operator named it with `--egress-allow`;
//! 2. a name matching an `allow_out` domain pattern, or an address inside an `allow_out` CIDR,
//!    is allowed (allow wins over deny);
//! 3. an address inside a `deny_out` CIDR is blocked;
//! 4. otherwise the engine-wide default decides (`--egress open|closed`).

pub use sandbox_mcp_model::addrs::{Cidr, Guard};
pub use sandbox_mcp_model::config::EgressDefault;
use std::net::IpAddr;

/// Most rules in `allow_out` plus `deny_out`: enough for any real allowlist, and every
/// connection is checked against them.
pub const MAX_RULES: usize = 256;
/// Longest rule accepted (a domain name is at most 253 characters).
const MAX_RULE_LEN: usize = 256;

/// A domain pattern: `pypi.org` (that name only) or `*.github.com` (any name below it, not the
/// name itself; `*.test` covers a whole top-level domain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    suffix: String,
    wildcard: bool,
}

impl Domain {
    pub fn parse(s: &str) -> Option<Domain> {
        let s = s.trim_end_matches('.').to_ascii_lowercase();
        let (wildcard, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, s),
        };
        valid_name(&name).then_some(Domain {
            suffix: name,
            wildcard,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        if self.wildcard {
            name.len() > self.suffix.len() + 1
                && name.ends_with(&self.suffix)
                && name.as_bytes()[name.len() - self.suffix.len() - 1] == b'.'
        } else {
            name == self.suffix
        }
    }
}

pub use sandbox_mcp_netparse::valid_name;

/// A sandbox's rules, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    allow_domains: Vec<(Domain, String)>,
    allow_nets: Vec<(Cidr, String)>,
    deny_nets: Vec<(Cidr, String)>,
    default: EgressDefault,
}

/// The decision on one connection or name, and the rule that made it (in words a person can act
/// on: it is shown in the network log and in refusals).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow(String),
    Block(String),
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        matches!(self, Verdict::Allow(_))
    }
    pub fn rule(&self) -> &str {
        match self {
            Verdict::Allow(r) | Verdict::Block(r) => r,
        }
    }
}

impl Policy {
    /// Parses `allow_out` (domain patterns and CIDRs) and `deny_out` (CIDRs), or says which rule
    /// is wrong and how to write it.
    pub fn parse(
        allow_out: &[String],
        deny_out: &[String],
        default: EgressDefault,
    ) -> Result<Policy, String> {
        let total = allow_out.len() + deny_out.len();
        if total > MAX_RULES {
            return Err(format!(
                "{total} network rules given; at most {MAX_RULES} are allowed (use CIDRs and `*.domain` patterns to cover more with fewer)"
            ));
        }
        let mut policy = Policy::none(default);
        for rule in allow_out {
            let r = rule.trim();
            if r.len() > MAX_RULE_LEN {
                return Err(format!(
                    "allow_out rule of {} characters is too long (at most {MAX_RULE_LEN})",
                    r.len()
                ));
            }
            if let Some(c) = Cidr::parse(r) {
                policy.allow_nets.push((c, format!("allow_out {r}")));
            } else if let Some(d) = Domain::parse(r) {
                policy.allow_domains.push((d, format!("allow_out {r}")));
            } else {
                return Err(format!(
                    "allow_out rule {r:?} is neither a domain pattern (`pypi.org`, `*.github.com`) nor a CIDR (`203.0.113.0/24`, `2001:db8::/32`)"
                ));
            }
        }
        for rule in deny_out {
            let r = rule.trim();
            match Cidr::parse(r) {
                Some(c) => policy.deny_nets.push((c, format!("deny_out {r}"))),
                None => {
                    return Err(format!(
                        "deny_out rule {:?} is not a CIDR: deny_out takes address ranges (`0.0.0.0/0` denies every IPv4 address); to allow only some domains, list them in allow_out and deny 0.0.0.0/0",
                        r.chars().take(MAX_RULE_LEN).collect::<String>()
                    ));
                }
            }
        }
        Ok(policy)
    }

    /// No rules: what the engine's default alone allows.
    pub fn none(default: EgressDefault) -> Policy {
        Policy {
            allow_domains: Vec::new(),
            allow_nets: Vec::new(),
            deny_nets: Vec::new(),
            default,
        }
    }

    /// Whether names outside `allow_out` should not even resolve: the policy blocks by default
    /// (a closed default, or a deny covering every IPv4 address). Then DNS cannot carry data out.
    pub fn is_allowlist(&self) -> bool {
        self.default == EgressDefault::Closed
            || self.deny_nets.iter().any(|(c, _)| c.covers_all_ipv4())
    }

    /// Whether any rule names a domain (then a connection's name can change its verdict).
    pub fn has_domain_rules(&self) -> bool {
        !self.allow_domains.is_empty()
    }

    /// The rule allowing `name`, if a domain rule does.
    pub fn allows_name(&self, name: &str) -> Option<&str> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.allow_domains
            .iter()
            .find(|(d, _)| d.matches(&name))
            .map(|(_, r)| r.as_str())
    }

    /// Decides a connection to `ip`, known by `name` if the sandbox named it. The guard is
    /// checked first: no rule opens a forbidden address.
    pub fn decide(&self, guard: &Guard, ip: IpAddr, name: Option<&str>) -> Verdict {
        if let Some(why) = guard.refuses(ip) {
            return Verdict::Block(format!(
                "forbidden: {why} (only the operator can open it, with --egress-allow)"
            ));
        }
        if let Some(rule) = name.and_then(|n| self.allows_name(n)) {
            return Verdict::Allow(rule.to_string());
        }
        if let Some((_, r)) = self.allow_nets.iter().find(|(c, _)| c.contains(ip)) {
            return Verdict::Allow(r.clone());
        }
        if let Some((_, r)) = self.deny_nets.iter().find(|(c, _)| c.contains(ip)) {
            return Verdict::Block(r.clone());
        }
        match self.default {
            EgressDefault::Open => Verdict::Allow("default open".into()),
            EgressDefault::Closed => Verdict::Block("default closed (--egress closed)".into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Policy::parse(&s(allow), &s(deny), EgressDefault::Open).unwrap()
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains(ip("10.1.200.3")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(
            !Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains(ip("2001:db8::1"))
        );
        assert!(
            Cidr::parse("2001:db8::/32")
                .unwrap()
                .contains(ip("2001:db8:1::5"))
        );
        // A mapped IPv6 address is its IPv4 address.
        assert!(c.contains(ip("::ffff:10.1.0.9")));
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0/8",
            "::/129",
            "1.2.3.4/+8",
            "x",
        ] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn domain_patterns() {
        let d = Domain::parse("*.GitHub.com.").unwrap();
        assert!(d.matches("api.github.com"));
        assert!(d.matches("a.b.github.com"));
        assert!(!d.matches("github.com"));
        assert!(!d.matches("evilgithub.com"));
        let exact = Domain::parse("pypi.org").unwrap();
        assert!(exact.matches("pypi.org"));
        assert!(!exact.matches("x.pypi.org"));
        assert!(Domain::parse("*.test").unwrap().matches("pypi.test"));
        for bad in [
            "*",
            "a..b",
            "-a.com",
            "a b.com",
            "1.2.3",
            "*.*.x.com",
            "",
            "é.com",
        ] {
            assert_eq!(Domain::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_rules_are_named_with_the_fix() {
        let e = Policy::parse(&["not a domain".into()], &[], EgressDefault::Open).unwrap_err();
        assert!(
            e.contains("not a domain") && e.contains("*.github.com"),
            "{e}"
        );
        let e = Policy::parse(&[], &["example.com".into()], EgressDefault::Open).unwrap_err();
        assert!(e.contains("not a CIDR") && e.contains("allow_out"), "{e}");
        let many: Vec<String> = (0..10_000).map(|i| format!("h{i}.example.com")).collect();
        let e = Policy::parse(&many, &[], EgressDefault::Open).unwrap_err();
        assert!(e.contains("10000") && e.contains("256"), "{e}");
    }

    #[test]
    fn allow_wins_over_deny_and_forbidden_wins_over_everything() {
        let guard = Guard::default();
        let p = policy(&["pypi.org", "203.0.113.7"], &["0.0.0.0/0"]);
        assert!(p.is_allowlist());
        assert_eq!(
            p.decide(&guard, ip("93.184.215.14"), Some("pypi.org")),
            Verdict::Allow("allow_out pypi.org".into())
        );
        assert_eq!(
            p.decide(&guard, ip("93.184.215.14"), Some("evil.org")),
            Verdict::Block("deny_out 0.0.0.0/0".into())
        );
        // 203.0.113.0/24 is documentation space: forbidden unless the operator opens it.
        assert!(!p.decide(&guard, ip("203.0.113.7"), None).allowed());
        let opened = Guard {
            operator_allowed: vec![Cidr::parse("203.0.113.0/24").unwrap()],
            host_addrs: vec![],
        };
        assert!(p.decide(&opened, ip("203.0.113.7"), None).allowed());
        // A name rule cannot open a forbidden address (DNS rebinding).
        for bad in [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "192.168.1.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            let v = p.decide(&guard, ip(bad), Some("pypi.org"));
            assert!(
                !v.allowed() && v.rule().starts_with("forbidden"),
                "{bad}: {v:?}"
            );
        }
        let host = Guard {
            operator_allowed: vec![],
            host_addrs: vec![ip("93.184.215.99")],
        };
        assert!(
            policy(&[], &[])
                .decide(&host, ip("93.184.215.99"), None)
                .rule()
                .contains("host's own")
        );
    }

    #[test]
    fn the_default_decides_what_no_rule_does() {
        let guard = Guard::default();
        let open = policy(&[], &["93.184.0.0/16"]);
        assert!(!open.is_allowlist());
        assert_eq!(
            open.decide(&guard, ip("8.8.4.4"), None),
            Verdict::Allow("default open".into())
        );
        assert!(!open.decide(&guard, ip("93.184.1.1"), None).allowed());
        let closed = Policy::parse(&[], &[], EgressDefault::Closed).unwrap();
        assert!(closed.is_allowlist());
        assert!(!closed.decide(&guard, ip("8.8.4.4"), None).allowed());
    }
}
