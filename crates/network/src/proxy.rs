//! HTTP plumbing both of the engine's proxies share — the preview listener (visitors to a
//! sandbox's port) and the egress interceptor (a sandbox's requests to hosts whose secrets it
//! binds): which headers belong to one hop only, and the short page either answers with when
//! it cannot forward a request. Below both, so neither imports the other.

use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Response, StatusCode};

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus those the
/// `Connection` header names. An upgrade keeps `Connection` and `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .filter(|n| !(upgrade && n == header::UPGRADE))
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in [
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(n);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    if !upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// A short plain-text page: what happened and what to do.
pub fn page(status: StatusCode, text: impl Into<String>) -> Response<Body> {
    let mut text = text.into();
    text.push('\n');
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
