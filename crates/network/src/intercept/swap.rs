//! The request side of the swap: stand-ins found (in headers, URLs, bodies, clear text), the
//! one authority a request names checked against the connection's, and each stand-in in a
//! header the secret is for replaced with the value.

use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::request::Parts;

use super::super::Bindings;
use crate::secrets::STANDIN_PREFIX;

/// Length of a stand-in's random part.
const STANDIN_TOKEN: usize = 32;

/// Every stand-in in `text`: the prefix and the token after it.
pub fn standins_in(text: &[u8]) -> Vec<String> {
    let prefix = STANDIN_PREFIX.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = find(&text[from..], prefix) {
        let start = from + i;
        let end = (start + prefix.len() + STANDIN_TOKEN).min(text.len());
        found.push(String::from_utf8_lossy(&text[start..end]).into_owned());
        from = start + prefix.len();
    }
    found
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// Finds stand-ins in a stream read chunk by chunk, without copying the chunks: each is scanned
/// where it is, and only the few bytes around the joint with the previous one are put together
/// (so a stand-in split across reads is still seen).
#[derive(Default)]
pub struct Scanner {
    /// The last `prefix - 1` bytes seen.
    tail: Vec<u8>,
}

impl Scanner {
    /// The first stand-in (or its beginning) in `chunk` or across its joint with the previous
    /// chunk.
    pub fn scan(&mut self, chunk: &[u8]) -> Option<String> {
        let keep = STANDIN_PREFIX.len() - 1;
        let mut joint = std::mem::take(&mut self.tail);
        joint.extend_from_slice(&chunk[..chunk.len().min(keep + STANDIN_TOKEN)]);
        let found = standins_in(&joint)
            .into_iter()
            .next()
            .or_else(|| standins_in(chunk).into_iter().next());
        self.tail = if chunk.len() >= keep {
            chunk[chunk.len() - keep..].to_vec()
        } else {
            let start = joint.len().saturating_sub(keep);
            joint[start..].to_vec()
        };
        found
    }
}

/// What became of one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Swap {
    /// Headers rewritten: these (variable, secret) pairs were applied.
    Applied(Vec<(String, String)>),
    /// Refused, with the reason (for the client and the log).
    Refused(String),
}

/// Gives a bound secret's description and value by name (none: it no longer exists).
pub(crate) type OpenSecret<'a> = dyn Fn(&str) -> Result<Option<(crate::secrets::SecretMeta, crate::secrets::Value)>, String>
    + 'a;

/// Replaces the stand-ins in `headers` for a request to `host`, or says why not. `open` gives a
/// bound secret's description and value.
pub(crate) fn swap(
    headers: &mut HeaderMap,
    uri: &str,
    host: &str,
    bindings: &Bindings,
    open: &OpenSecret<'_>,
) -> Swap {
    if let Some(s) = standins_in(uri.as_bytes()).first() {
        return Swap::Refused(format!(
            "leak attempt: {} in the URL to {host}; stand-ins are swapped in request headers only",
            bindings.describe(s)
        ));
    }
    let mut applied = Vec::new();
    let names: Vec<header::HeaderName> = headers.keys().cloned().collect();
    for name in names {
        let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
        let mut changed = false;
        let mut rewritten = Vec::with_capacity(values.len());
        for value in values {
            let found = standins_in(value.as_bytes());
            if found.is_empty() {
                rewritten.push(value);
                continue;
            }
            let mut text = value.as_bytes().to_vec();
            for standin in found {
                let Some((env, secret)) = bindings.by_standin.get(&standin) else {
                    return Swap::Refused(format!(
                        "leak attempt: {} sent to {host}",
                        bindings.describe(&standin)
                    ));
                };
                let (meta, secret_value) = match open(secret) {
                    Ok(Some(pair)) => pair,
                    Ok(None) => {
                        return Swap::Refused(format!(
                            "secret {secret} (bound to {env}) no longer exists: its operator removed it"
                        ));
                    }
                    Err(why) => return Swap::Refused(format!("secret {secret}: {why}")),
                };
                if !meta.allows(host) {
                    return Swap::Refused(format!(
                        "leak attempt: {env} (secret {secret}) sent to {host}; it may only go to {}",
                        meta.hosts.join(", ")
                    ));
                }
                if !meta.allows_header(name.as_str()) {
                    return Swap::Refused(format!(
                        "{env} (secret {secret}) may only be sent in the {} header, not {name}",
                        meta.headers.join(" or ")
                    ));
                }
                text = match &meta.format {
                    Some(format) => format
                        .replace("{value}", &String::from_utf8_lossy(secret_value.as_bytes()))
                        .into_bytes(),
                    None => replace(&text, standin.as_bytes(), secret_value.as_bytes()),
                };
                if !applied.contains(&(env.clone(), secret.clone())) {
                    applied.push((env.clone(), secret.clone()));
                }
            }
            let Ok(mut v) = HeaderValue::from_bytes(&text) else {
                return Swap::Refused(format!("the {name} header cannot carry the secret"));
            };
            v.set_sensitive(true);
            text.fill(0);
            rewritten.push(v);
            changed = true;
        }
        if changed {
            headers.remove(&name);
            for v in rewritten {
                headers.append(name.clone(), v);
            }
        }
    }
    Swap::Applied(applied)
}

fn replace(text: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + to.len());
    let mut rest = text;
    while let Some(i) = find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Headers some servers and CDNs route a request by instead of its `Host`: a request to a
/// secret's host naming another host in one of them is domain fronting like any other.
const ROUTING_HEADERS: &[&str] = &[
    "x-forwarded-host",
    "x-host",
    "x-original-host",
    "x-forwarded-server",
    "x-http-host-override",
    "x-original-url",
    "x-rewrite-url",
];

/// Checks that a request on a connection decrypted for `host` (port `port`) names one
/// authority, that one: its request line, `:authority`, `Host` and the routing headers all name
/// `host` (or none of them names anything), there is at most one `Host`, no user info, no scheme
/// but https. Otherwise the reason: the request would reach another site behind the same
/// address (a CDN routes by these names) with the value of a secret meant for `host`. The
/// caller then sends it with [`drop_authorities`] applied and [`outgoing`] as its only authority.
pub(crate) fn check_authority(parts: &Parts, host: &str, port: u16) -> Result<(), String> {
    let mut named: Vec<String> = Vec::new();
    if let Some(scheme) = parts.uri.scheme_str()
        && !scheme.eq_ignore_ascii_case("https")
    {
        return Err(format!(
            "the request line names the scheme {scheme}, not https"
        ));
    }
    if let Some(a) = parts.uri.authority() {
        if a.as_str().contains('@') {
            return Err("the request names user info in its authority".into());
        }
        named.push(a.as_str().to_string());
    }
    let hosts: Vec<&HeaderValue> = parts.headers.get_all(header::HOST).iter().collect();
    if hosts.len() > 1 {
        return Err(format!("the request has {} Host headers", hosts.len()));
    }
    for v in hosts {
        let text = v
            .to_str()
            .map_err(|_| "the Host header is not text".to_string())?;
        named.push(text.to_string());
    }
    for name in ROUTING_HEADERS {
        for v in parts.headers.get_all(*name) {
            let text = v
                .to_str()
                .map_err(|_| format!("the {name} header is not text"))?;
            for one in text.split(',') {
                named.push(one.trim().to_string());
            }
        }
    }
    for v in parts.headers.get_all(header::FORWARDED) {
        let text = v
            .to_str()
            .map_err(|_| "the Forwarded header is not text".to_string())?;
        for pair in text.split([';', ',']) {
            if let Some((k, v)) = pair.split_once('=')
                && k.trim().eq_ignore_ascii_case("host")
            {
                named.push(v.trim().trim_matches('"').to_string());
            }
        }
    }
    for authority in &named {
        let (name, named_port) = split_port(authority)
            .ok_or_else(|| format!("the request names {authority:?}, which is not a host"))?;
        let same_name = name.trim_end_matches('.').eq_ignore_ascii_case(host);
        if !same_name || named_port.is_some_and(|p| p != port) {
            return Err(format!(
                "the request names {authority} but its TLS connection is to {host}"
            ));
        }
    }
    Ok(())
}

/// `name[:port]` (a bracketed IPv6 literal is not a host name a secret can be for).
fn split_port(authority: &str) -> Option<(&str, Option<u16>)> {
    if authority.is_empty() || authority.starts_with('[') {
        return None;
    }
    match authority.rsplit_once(':') {
        Some((name, port)) => Some((name, Some(port.parse().ok()?))),
        None => Some((authority, None)),
    }
}

/// The authority a checked request is sent upstream with: the connection's host name, with
/// its port unless it is 443.
pub(crate) fn outgoing(host: &str, port: u16) -> String {
    if port == 443 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

/// Removes every header that could name another host (the checked request carries exactly
/// one authority afterwards, set by the caller).
pub(crate) fn drop_authorities(headers: &mut HeaderMap) {
    headers.remove(header::HOST);
    headers.remove(header::FORWARDED);
    for name in ROUTING_HEADERS {
        headers.remove(*name);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::secrets::{SecretMeta, Value};
    use axum::http::Request;

    const S1: &str = "sbxsecret_0123456789abcdefghjkmnpqrstvwxyz";

    fn meta(hosts: &[&str], headers: &[&str], format: Option<&str>) -> SecretMeta {
        SecretMeta {
            tenant: None,
            name: "api".into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            format: format.map(String::from),
            created_at: 0,
            updated_at: 0,
        }
    }

    fn bindings() -> Bindings {
        Bindings {
            tenant: None,
            by_standin: [(S1.to_string(), ("API_KEY".to_string(), "api".to_string()))].into(),
            hosts_when_bound: Default::default(),
        }
    }

    fn run(m: &SecretMeta, headers: &[(&str, &str)], uri: &str, host: &str) -> (Swap, HeaderMap) {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let m = m.clone();
        let open = move |_: &str| Ok(Some((m.clone(), Value::from("REAL".to_string()))));
        let r = swap(&mut h, uri, host, &bindings(), &open);
        (r, h)
    }

    #[test]
    fn the_standin_becomes_the_value_for_the_secrets_hosts_only() {
        let m = meta(&["api.example.test"], &["Authorization", "X-Key"], None);
        let (r, h) = run(
            &m,
            &[("authorization", &format!("Bearer {S1}"))],
            "/v1",
            "api.example.test",
        );
        assert_eq!(r, Swap::Applied(vec![("API_KEY".into(), "api".into())]));
        assert_eq!(h["authorization"], "Bearer REAL");
        assert!(h["authorization"].is_sensitive());
        let (r, _) = run(
            &m,
            &[("authorization", &format!("Bearer {S1}"))],
            "/",
            "other.test",
        );
        assert!(
            matches!(r, Swap::Refused(w) if w.contains("leak attempt") && w.contains("other.test"))
        );
        let (r, _) = run(&m, &[], &format!("/x?key={S1}"), "api.example.test");
        assert!(matches!(r, Swap::Refused(w) if w.contains("URL")));
        let unknown = "sbxsecret_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz";
        let (r, _) = run(&m, &[("x-key", unknown)], "/", "api.example.test");
        assert!(matches!(r, Swap::Refused(w) if w.contains("not bound")));
        let (r, h) = run(&m, &[("accept", "*/*")], "/", "api.example.test");
        assert_eq!(r, Swap::Applied(vec![]));
        assert_eq!(h["accept"], "*/*");
    }

    #[test]
    fn a_header_and_format_pin_where_the_value_goes() {
        let m = meta(
            &["*.example.test"],
            &["Authorization"],
            Some("Bearer {value}"),
        );
        let (r, h) = run(&m, &[("authorization", S1)], "/", "api.example.test");
        assert!(matches!(r, Swap::Applied(_)));
        assert_eq!(h["authorization"], "Bearer REAL");
        // Any header but the secret's own: refused, whichever header it is — including the ones
        // servers reflect.
        for other in [
            "x-api-key",
            "origin",
            "referer",
            "cookie",
            "x-forwarded-for",
            "accept",
        ] {
            let (r, h) = run(&m, &[(other, S1)], "/", "api.example.test");
            assert!(
                matches!(&r, Swap::Refused(w) if w.contains("only be sent in the Authorization")),
                "{other}: {r:?}"
            );
            assert!(!h.iter().any(|(_, v)| v.as_bytes().ends_with(b"REAL")));
        }
        let m = meta(&["*.example.test"], &["X-Api-Key", "Authorization"], None);
        let (r, h) = run(&m, &[("x-api-key", S1)], "/", "api.example.test");
        assert!(matches!(r, Swap::Applied(_)));
        assert_eq!(h["x-api-key"], "REAL");
        let (r, _) = run(&m, &[("x-key", S1)], "/", "api.example.test");
        assert!(matches!(r, Swap::Refused(w) if w.contains("X-Api-Key or Authorization")));
    }

    fn parts(request: Request<()>) -> Parts {
        request.into_parts().0
    }

    fn req(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        parts(b.body(()).unwrap())
    }

    #[test]
    fn a_request_names_one_authority_the_connections_own() {
        let host = "api.example.test";
        for ok in [
            req("/v1", &[("host", host)]),
            req("/v1", &[("host", "API.Example.Test.")]),
            req("/v1", &[("host", "api.example.test:443")]),
            req("/v1", &[]),
            req("https://api.example.test/v1", &[("host", host)]),
            req("https://api.example.test/v1", &[]),
            req("/v1", &[("host", host), ("x-forwarded-host", host)]),
        ] {
            assert_eq!(check_authority(&ok, host, 443), Ok(()), "{ok:?}");
        }
        for (bad, says) in [
            (req("/v1", &[("host", "other.test")]), "other.test"),
            (
                req("https://api.example.test/v1", &[("host", "other.test")]),
                "other.test",
            ),
            (
                req("https://other.test/v1", &[("host", host)]),
                "other.test",
            ),
            (req("https://other.test/v1", &[]), "other.test"),
            (
                req("/v1", &[("host", host), ("host", "other.test")]),
                "2 Host headers",
            ),
            (
                req("/v1", &[("host", host), ("host", host)]),
                "2 Host headers",
            ),
            (req("/v1", &[("host", "api.example.test:8443")]), "8443"),
            (req("http://api.example.test/v1", &[]), "scheme http"),
            (req("https://user@api.example.test/v1", &[]), "user info"),
            (
                req("/v1", &[("host", host), ("x-forwarded-host", "other.test")]),
                "other.test",
            ),
            (
                req("/v1", &[("host", host), ("x-host", "other.test")]),
                "other.test",
            ),
            (
                req("/v1", &[("x-original-host", "other.test")]),
                "other.test",
            ),
            (
                req(
                    "/v1",
                    &[("forwarded", "for=1.2.3.4;host=\"other.test\";proto=https")],
                ),
                "other.test",
            ),
            (req("/v1", &[("host", "[::1]")]), "not a host"),
            (
                req("/v1", &[("host", "api.example.test.evil.test")]),
                "evil",
            ),
        ] {
            let r = check_authority(&bad, host, 443);
            assert!(
                r.as_ref().is_err_and(|e| e.contains(says)),
                "{bad:?}: {r:?}"
            );
        }
        // Another port is fine when it is the connection's.
        assert_eq!(
            check_authority(&req("/", &[("host", "api.example.test:8443")]), host, 8443),
            Ok(())
        );
        assert_eq!(outgoing(host, 443), host);
        assert_eq!(outgoing(host, 8443), "api.example.test:8443");
    }

    #[test]
    fn the_scanner_sees_standins_split_across_chunks() {
        let text = format!("xxxxxxxxxxxxxxxxxxxxxxxx{S1}yyyy");
        for cut in 0..text.len() {
            let mut scanner = Scanner::default();
            let (a, b) = text.as_bytes().split_at(cut);
            let found = scanner.scan(a).or_else(|| scanner.scan(b));
            assert!(
                found.is_some_and(|s| s.starts_with(STANDIN_PREFIX)),
                "cut at {cut}"
            );
        }
        // In three pieces too, the middle one shorter than the prefix.
        let mut scanner = Scanner::default();
        let (a, rest) = text.as_bytes().split_at(26);
        let (b, c) = rest.split_at(3);
        assert!(scanner.scan(a).is_none() && scanner.scan(b).is_none());
        assert_eq!(scanner.scan(c).as_deref(), Some(S1));
        let mut clean = Scanner::default();
        assert!(clean.scan(b"sbxsecre").is_none() && clean.scan(b"tless").is_none());
    }

    #[test]
    fn standins_are_found_across_chunk_edges_and_anywhere() {
        assert_eq!(
            standins_in(format!("a{S1}b").as_bytes()),
            vec![S1.to_string()]
        );
        assert!(standins_in(b"sbxsecre").is_empty());
        assert_eq!(standins_in(b"xsbxsecret_abc").len(), 1);
    }
}
