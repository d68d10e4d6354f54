//! Preview URLs: a sandbox's port served on a listener of the engine's own.
//!
//! A request reaches `{port}-{id}.{domain}` (the sandbox id with `_` written `-`, since host
//! names have no `_`) or `/preview/{id}/{port}/…` on the preview listener. The proxy finds the
//! preview, checks its token unless it is public, resumes the sandbox if it is paused, connects to
//! `127.0.0.1:{port}` inside the sandbox's network namespace and relays the request, WebSocket
//! and other upgrades included. Visitors are untrusted and so is the app:
//! - the token is a credential of the engine, not of the app: its header, query parameter and
//!   cookie are removed before the request is forwarded;
//! - the app always sees `Host: localhost:{port}` (the original host in `X-Forwarded-Host`), so
//!   dev servers that check the host, or build hot-reload URLs from it, behave the same for every
//!   visitor; a request naming two hosts (two `Host` headers, or an absolute URI that disagrees
//!   with its `Host`) is refused rather than guessed at;
//! - each request makes its own connection into the sandbox (nothing is pooled across visitors).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use sandbox_mcp_engine::error::chain;
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_engine::services::{PreviewError, TOKEN_PARAM};
use sandbox_mcp_model::config::PreviewConfig;
use sandbox_mcp_model::ids;
use sandbox_mcp_network::proxy::{page, strip_hop_by_hop};

/// The header non-browser clients send the token in.
pub(crate) const TOKEN_HEADER: &str = "x-preview-token";
/// The cookie holding the token: host-only for the host form, scoped to the preview's path for
/// the path form. HttpOnly, so the app's scripts cannot read it.
const COOKIE: &str = "sandbox_preview";
/// How long a visitor may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Parses `--preview-listen`: an address, or `off`.
pub fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        format!("{s:?} is not an address to listen on (write 127.0.0.1:8989, 0.0.0.0:8989, or off)")
    })
}

/// Parses `--preview-domain`: a host name (its labels letters, digits and `-`).
pub fn parse_domain(s: &str) -> Result<String, String> {
    let d = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if d.len() <= 200 && d.split('.').all(label_ok) {
        Ok(d)
    } else {
        Err(format!(
            "{s:?} is not a domain (write localhost, or a wildcard DNS name such as preview.example.com)"
        ))
    }
}

/// Binds the preview listener, if previews are on.
pub(crate) fn bind(config: &PreviewConfig) -> std::io::Result<Option<std::net::TcpListener>> {
    let Some(addr) = config.listen else {
        return Ok(None);
    };
    let bound = match std::net::TcpListener::bind(addr) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && config.fallback => {
            let any = SocketAddr::new(addr.ip(), 0);
            let l = std::net::TcpListener::bind(any)?;
            tracing::warn!(
                "{addr} is taken (another engine?): previews are served on {} instead; set --preview-listen to choose",
                l.local_addr()?
            );
            Ok(l)
        }
        other => other,
    }
    .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen for previews on {addr}: {e}")))?;
    bound.set_nonblocking(true)?;
    Ok(Some(bound))
}

/// Where a request is going, read from its host or its path.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    id: String,
    port: u16,
    /// Path and query to forward to the app.
    forward: String,
    /// The path form's prefix (`/preview/{id}/{port}`), for `X-Forwarded-Prefix` and the cookie.
    prefix: Option<String>,
}

/// Reads `{port}-{id}.{domain}` from a host name (without its port).
fn from_host(host: &str, domain: &str) -> Option<(String, u16)> {
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
fn from_path(path_and_query: &str) -> Option<Result<Target, String>> {
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
fn request_host(uri: &Uri, headers: &HeaderMap) -> Result<String, &'static str> {
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

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// Removes `name=…` pairs from a query string; returns the rest and the removed values.
fn take_param(query: &str, name: &str) -> (String, Vec<String>) {
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
fn take_cookie(headers: &mut HeaderMap) -> Vec<String> {
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

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

fn redirect(status: StatusCode, to: &str) -> Response<Body> {
    let mut r = page(status, format!("See {to}"));
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Serves previews on `listener` until `stop`.
pub(crate) async fn serve(listener: TcpListener, manager: Arc<Manager>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Each visitor's connection, and the one into the sandbox it leads to, are descriptors
        // of the engine's budget for sandbox traffic: visitors cannot spend the engine's own.
        let Some(fds) = manager.networks.descriptors().take(2) else {
            tokio::spawn(async move {
                let mut stream = stream;
                let body = "the engine is at its limit of open connections; try again shortly\n";
                let page = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, page.as_bytes()).await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let manager = manager.clone();
        tokio::spawn(async move {
            let _fds = fds;
            let service = hyper::service::service_fn(move |req| {
                let manager = manager.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&manager, req, peer.ip()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

async fn handle(manager: &Manager, req: Request<Incoming>, peer: IpAddr) -> Response<Body> {
    let Some(urls) = manager.previews.urls() else {
        return page(StatusCode::NOT_FOUND, "Previews are off on this engine.");
    };
    let host = match request_host(req.uri(), req.headers()) {
        Ok(h) => h,
        Err(why) => return page(StatusCode::BAD_REQUEST, format!("Bad request: {why}.")),
    };
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let target = match from_host(strip_port(&host), &urls.domain) {
        Some((id, port)) => Target {
            id,
            port,
            forward: path_and_query,
            prefix: None,
        },
        None => match from_path(&path_and_query) {
            Some(Ok(t)) => t,
            Some(Err(to)) => return redirect(StatusCode::PERMANENT_REDIRECT, &to),
            None => {
                return page(
                    StatusCode::NOT_FOUND,
                    format!(
                        "This is a sandbox-mcp preview listener. Open a URL from sandbox_preview_create: \
                         http://{{port}}-{{sandbox id}}.{}:{}/ or /preview/{{sandbox id}}/{{port}}/.",
                        urls.domain, urls.port
                    ),
                );
            }
        },
    };
    proxy(manager, req, target, &host, peer).await
}

async fn proxy(
    manager: &Manager,
    req: Request<Incoming>,
    target: Target,
    host: &str,
    peer: IpAddr,
) -> Response<Body> {
    let (id, port) = (target.id.as_str(), target.port);
    let missing = || {
        page(
            StatusCode::NOT_FOUND,
            format!(
                "No preview of port {port} in sandbox {id}: it was deleted, its sandbox is gone, or it never existed. \
                 Create one with sandbox_preview_create."
            ),
        )
    };
    let Some((preview, closed)) = manager.previews.preview_find(id, port) else {
        return missing();
    };
    if preview.expires_at.is_some_and(|at| at <= ids::now_ms()) {
        return page(
            StatusCode::GONE,
            format!(
                "The preview of port {port} in sandbox {id} has expired. Create it again with sandbox_preview_create."
            ),
        );
    }
    let (mut parts, body) = req.into_parts();
    let (path, query) = match target.forward.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.forward.clone(), String::new()),
    };
    let (query, from_query) = take_param(&query, TOKEN_PARAM);
    let from_header: Vec<String> = parts
        .headers
        .get_all(TOKEN_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok().map(String::from))
        .collect();
    parts.headers.remove(TOKEN_HEADER);
    let from_cookie = take_cookie(&mut parts.headers);
    let forward = if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    };
    if !preview.public {
        let matches = |t: &String| bool::from(t.as_bytes().ct_eq(preview.token.as_bytes()));
        let offered = from_query.len() + from_header.len() + from_cookie.len();
        if !from_query
            .iter()
            .chain(&from_header)
            .chain(&from_cookie)
            .any(matches)
        {
            let (status, why) = if offered == 0 {
                (StatusCode::UNAUTHORIZED, "This preview is private")
            } else {
                (
                    StatusCode::FORBIDDEN,
                    "The token of this request is not this preview's",
                )
            };
            return page(
                status,
                format!(
                    "{why}: open the full URL sandbox_preview_create or sandbox_preview_list returned (it carries the token), \
                     or send the token in the X-Preview-Token header."
                ),
            );
        }
        // A browser following the URL: trade the token for a cookie and take it out of the
        // address bar (and of the app's logs and Referer headers).
        if from_query.iter().any(matches) && matches!(parts.method, Method::GET | Method::HEAD) {
            let location = match &target.prefix {
                Some(prefix) => format!("{prefix}{forward}"),
                None => forward.clone(),
            };
            let cookie_path = target
                .prefix
                .as_deref()
                .map_or("/".to_string(), |p| format!("{p}/"));
            let mut r = redirect(StatusCode::SEE_OTHER, &location);
            if let Ok(v) = HeaderValue::from_str(&format!(
                "{COOKIE}={}; Path={cookie_path}; HttpOnly; SameSite=Lax",
                preview.token
            )) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            return r;
        }
    }

    let (stream, activity) = match manager.previews.preview_connect(id, port).await {
        Ok(c) => c,
        Err(PreviewError::Gone) => return missing(),
        Err(PreviewError::NotListening) => {
            return page(
                StatusCode::BAD_GATEWAY,
                format!(
                    "Nothing is listening on port {port} in sandbox {id}. Start a server on port {port} \
                     (on 0.0.0.0 or 127.0.0.1), for example with sandbox_exec and background: true: \
                     python3 -m http.server {port}"
                ),
            );
        }
        Err(e) => {
            // The engine's own failure: its detail (paths, errors of the host) is for the log.
            tracing::warn!(sandbox = %id, port, "preview: {}", chain(&e));
            let why = match e {
                PreviewError::Resume(_) => "the sandbox could not be resumed",
                _ => "the connection inside the sandbox failed",
            };
            return page(
                StatusCode::BAD_GATEWAY,
                format!(
                    "Cannot reach port {port} in sandbox {id}: {why}. The engine's log has the details."
                ),
            );
        }
    };

    let upgrade = is_upgrade(&parts.headers);
    strip_hop_by_hop(&mut parts.headers, upgrade);
    let h = &mut parts.headers;
    if let Ok(v) = HeaderValue::from_str(&format!("localhost:{port}")) {
        h.insert(header::HOST, v);
    }
    if let Ok(v) = HeaderValue::from_str(host) {
        h.insert("x-forwarded-host", v);
    }
    h.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Ok(v) = HeaderValue::from_str(&peer.to_string()) {
        h.insert("x-forwarded-for", v);
    }
    if let Some(prefix) = &target.prefix
        && let Ok(v) = HeaderValue::from_str(prefix)
    {
        h.insert("x-forwarded-prefix", v);
    }
    parts.uri = match forward.parse() {
        Ok(u) => u,
        Err(_) => {
            return page(
                StatusCode::BAD_REQUEST,
                "Bad request: the path is not a URI path.",
            );
        }
    };
    parts.version = axum::http::Version::HTTP_11;
    let mut outbound = Request::from_parts(parts, body);
    let inbound_upgrade = upgrade.then(|| hyper::upgrade::on(&mut outbound));

    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => {
            return page(
                StatusCode::BAD_GATEWAY,
                format!("Cannot talk HTTP to port {port}: {e}"),
            );
        }
    };
    let activity = Arc::new(activity);
    {
        let closed = closed.clone();
        let activity = activity.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = conn.with_upgrades() => {}
                () = closed.cancelled() => {}
            }
            drop(activity);
        });
    }
    let mut response = match sender.send_request(outbound).await {
        Ok(r) => r,
        Err(e) => {
            return page(
                StatusCode::BAD_GATEWAY,
                format!(
                    "The server on port {port} in sandbox {id} closed the connection without an answer ({e})."
                ),
            );
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(inbound) = inbound_upgrade
    {
        let outbound = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let relay = async {
                let (Ok(a), Ok(b)) = tokio::join!(inbound, outbound) else {
                    return;
                };
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            };
            tokio::select! {
                () = relay => {}
                () = closed.cancelled() => {}
            }
            drop(activity);
        });
    } else {
        strip_hop_by_hop(response.headers_mut(), false);
    }
    response.map(Body::new)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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

    /// The default address, taken (another engine), moves to a free port; an address the
    /// operator named, taken, is an error that names it; `off` binds nothing.
    #[test]
    fn a_taken_listen_address_moves_only_when_it_is_the_default() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let config = |fallback| PreviewConfig {
            listen: Some(addr),
            fallback,
            domain: "localhost".into(),
        };
        let moved = bind(&config(true)).unwrap().unwrap();
        assert_ne!(moved.local_addr().unwrap().port(), addr.port());
        let e = bind(&config(false)).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("cannot listen for previews on {addr}")),
            "{e}"
        );
        let off = PreviewConfig {
            listen: None,
            ..config(false)
        };
        assert!(bind(&off).unwrap().is_none());
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(parse_listen("off").unwrap(), None);
        assert!(parse_listen("localhost").is_err());
        assert_eq!(
            parse_domain("Preview.Example.com.").unwrap(),
            "preview.example.com"
        );
        for bad in ["", "a..b", "-a.b", "a_b.c", "a b"] {
            assert!(parse_domain(bad).is_err(), "{bad}");
        }
    }
}
