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

mod request;
mod settings;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{self, HeaderValue};
use axum::http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use sandbox_mcp_engine::error::chain;
use sandbox_mcp_engine::manager::Manager;
use sandbox_mcp_engine::services::{PreviewError, TOKEN_PARAM};
use sandbox_mcp_model::ids;
use sandbox_mcp_network::proxy::{page, strip_hop_by_hop};

use request::{
    COOKIE, Target, from_host, from_path, is_upgrade, redirect, request_host, strip_port,
    take_cookie, take_param,
};
pub(crate) use settings::bind;
pub use settings::{parse_domain, parse_listen};

/// The header non-browser clients send the token in.
pub(crate) const TOKEN_HEADER: &str = "x-preview-token";
/// How long a visitor may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

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
