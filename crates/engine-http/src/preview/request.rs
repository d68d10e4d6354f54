//! What a visitor's request names — the preview it is for (from its host or its path), its one
//! host — and the token it may carry in its query or cookies, taken out before it is forwarded.

use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Response, StatusCode, Uri};

use sandbox_mcp_model::ids;
use sandbox_mcp_network::proxy::page;

/// The cookie holding the token: host-only for the host form, scoped to the preview's path for
/// the path form. HttpOnly, so the app's scripts cannot read it.
pub(super) const COOKIE: &str = "sandbox_preview";

/// Where a request is going, read from its host or its path.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) id: String,
    pub(super) port: u16,
    /// Path and query to forward to the app.
    pub(super) forward: String,
    /// The path form's prefix (`/preview/{id}/{port}`), for `X-Forwarded-Prefix` and the cookie.
    pub(super) prefix: Option<String>,
}

/// Reads `{port}-{id}.{domain}` from a host name (without its port).
pub(super) fn from_host(host: &str, domain: &str) -> Option<(String, u16)> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    // `sbx-…` in a host name is the id `sbx_…`.
    let id = match id.strip_prefix("sbx-") {
        Some(rest) => format!("sbx_{rest}"),
        None => id.to_string(),
    };
    ids::is_sandbox_id(&id).then_some((id, port))
}

/// Reads `/preview/{id}/{port}/rest` from a path; `Err` with the path to redirect to when the
/// prefix lacks its final `/` (relative links of the app would resolve wrongly without it).
pub(super) fn from_path(path_and_query: &str) -> Option<Result<Target, String>> {
    let rest = path_and_query.strip_prefix("/preview/")?;
    let (id, rest) = rest.split_once('/')?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let port: u16 = rest[..end].parse().ok().filter(|p| *p > 0)?;
    if !ids::is_sandbox_id(id) {
        return None;
    }
    let prefix = format!("/preview/{id}/{port}");
    let after = &rest[end..];
    if !after.starts_with('/') {
        return Some(Err(format!("{prefix}/{after}")));
    }
    Some(Ok(Target {
        id: id.to_string(),
        port,
        forward: after.to_string(),
        prefix: Some(prefix),
    }))
}

/// The one host a request names, or why it is refused.
pub(super) fn request_host(uri: &Uri, headers: &HeaderMap) -> Result<String, &'static str> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err("the request has more than one Host header");
    }
    let header = header
        .map(|h| h.to_str().map_err(|_| "the Host header is not text"))
        .transpose()?;
    match (uri.authority(), header) {
        (Some(a), Some(h)) if !a.as_str().eq_ignore_ascii_case(h) => {
            Err("the request's URI and its Host header name different hosts")
        }
        (Some(a), _) => Ok(a.as_str().to_string()),
        (None, Some(h)) => Ok(h.to_string()),
        (None, None) => Err("the request has no Host header"),
    }
}

pub(super) fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// Removes `name=…` pairs from a query string; returns the rest and the removed values.
pub(super) fn take_param(query: &str, name: &str) -> (String, Vec<String>) {
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((k, v)) if k == name => taken.push(v.to_string()),
            None if pair == name => taken.push(String::new()),
            _ => kept.push(pair),
        }
    }
    (kept.join("&"), taken)
}

/// Removes the engine's cookie from the `Cookie` headers; returns its values.
pub(super) fn take_cookie(headers: &mut HeaderMap) -> Vec<String> {
    let mut taken = Vec::new();
    let mut kept = Vec::new();
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else {
            continue;
        };
        for pair in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((k, v)) if k.trim() == COOKIE => taken.push(v.trim().to_string()),
                _ => kept.push(pair.to_string()),
            }
        }
    }
    headers.remove(header::COOKIE);
    if !kept.is_empty()
        && let Ok(v) = HeaderValue::from_str(&kept.join("; "))
    {
        headers.insert(header::COOKIE, v);
    }
    taken
}

pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

pub(super) fn redirect(status: StatusCode, to: &str) -> Response<Body> {
    let mut r = page(status, format!("See {to}"));
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sandbox_mcp_engine::services::TOKEN_PARAM;

    const ID: &str = "sbx_0123456789abcdefghjkmnpqrs";

    #[test]
    fn host_form_names_port_and_sandbox() {
        let host = format!("3000-{}.localhost", ID.replace('_', "-"));
        assert_eq!(from_host(&host, "localhost"), Some((ID.to_string(), 3000)));
        assert_eq!(
            from_host(&host.to_uppercase(), "localhost"),
            Some((ID.to_string(), 3000))
        );
        assert_eq!(
            from_host(&format!("3000-{ID}.localhost"), "localhost"),
            Some((ID.to_string(), 3000))
        );
        for bad in [
            format!("0-{}.localhost", ID.replace('_', "-")),
            format!("70000-{}.localhost", ID.replace('_', "-")),
            format!("3000-{}.example.com", ID.replace('_', "-")),
            format!("3000-{}xlocalhost", ID.replace('_', "-")),
            "3000-sbx-short.localhost".into(),
            "localhost".into(),
        ] {
            assert_eq!(from_host(&bad, "localhost"), None, "{bad}");
        }
    }

    #[test]
    fn path_form_strips_its_prefix_and_wants_a_slash() {
        let t = from_path(&format!("/preview/{ID}/8080/app/x?y=1"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.id.as_str(), t.port, t.forward.as_str()),
            (ID, 8080, "/app/x?y=1")
        );
        assert_eq!(t.prefix.as_deref(), Some(&*format!("/preview/{ID}/8080")));
        assert_eq!(
            from_path(&format!("/preview/{ID}/8080?a=b"))
                .unwrap()
                .unwrap_err(),
            format!("/preview/{ID}/8080/?a=b")
        );
        assert!(from_path("/preview/sbx_x/8080/").is_none());
        assert!(from_path(&format!("/preview/{ID}/0/")).is_none());
        assert!(from_path("/other").is_none());
    }

    #[test]
    fn one_host_or_none() {
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("a.localhost"));
        assert_eq!(
            request_host(&"/".parse().unwrap(), &h).unwrap(),
            "a.localhost"
        );
        assert!(request_host(&"http://b.localhost/".parse().unwrap(), &h).is_err());
        assert_eq!(
            request_host(&"http://A.localhost/".parse().unwrap(), &h).unwrap(),
            "A.localhost"
        );
        h.append(header::HOST, HeaderValue::from_static("b.localhost"));
        assert!(request_host(&"/".parse().unwrap(), &h).is_err());
        assert!(request_host(&"/".parse().unwrap(), &HeaderMap::new()).is_err());
    }

    #[test]
    fn the_token_is_taken_out_of_query_and_cookies() {
        assert_eq!(
            take_param("a=1&preview_token=x&b=2&preview_token=y", TOKEN_PARAM),
            (
                "a=1&b=2".to_string(),
                vec!["x".to_string(), "y".to_string()]
            )
        );
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; sandbox_preview=t1"),
        );
        h.append(
            header::COOKIE,
            HeaderValue::from_static("sandbox_preview=t2"),
        );
        assert_eq!(take_cookie(&mut h), vec!["t1", "t2"]);
        assert_eq!(
            h.get_all(header::COOKIE).iter().collect::<Vec<_>>(),
            ["a=1"]
        );
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("sandbox_preview=t1"),
        );
        take_cookie(&mut h);
        assert!(!h.contains_key(header::COOKIE));
    }
}
