//! The swap: TLS to a host that one of the sandbox's bound secrets may go to is terminated here,
//! with a certificate the engine's own CA mints for that name ([`ca`]), and each request's
//! headers get the secret's value in place of its stand-in ([`swap`]) before they go on, over
//! TLS verified against the system's roots (plus `--egress-ca`), to the real host; each response
//! is searched for the value on its way back ([`reflect`]). Security-critical; keep it small.
//!
//! - Only hosts of a bound secret are decrypted; every other TLS connection passes untouched.
//! - One authority per request: the request line, `:authority`, `Host` and the headers CDNs
//!   route by must all name the connection's host (at most one `Host`), and exactly that host is
//!   sent on — so a fronted request never carries a value to another site behind the address.
//! - The stand-in is swapped only in the headers its secret names (`Authorization` unless its
//!   operator named others). Found anywhere else — the URL, the body, another header, a request
//!   to a host the secret may not go to — the request is refused (403, with the reason) and
//!   logged as a leak attempt. Plain-HTTP requests carrying one are refused by the relay with
//!   advice to use https. `TRACE` (which echoes the request) is refused outright.
//! - The value never comes back: responses are asked for unencoded, and a response whose
//!   headers carry any form of a bound secret's value is withheld, one whose body does is cut
//!   before it (see [`reflect`] for what that covers).
//! - The value is read from the store for each request (a rotation applies at once) and never
//!   logged: the network log names the secret and the variable, not the value.
//! - Client and upstream each speak HTTP/1.1 or HTTP/2, whichever their ALPN chose; requests are
//!   carried across (so gRPC over h2 works). Upgrades (WebSocket) are not carried through here.

mod ca;
mod reflect;
mod swap;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::{self, HeaderValue};
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub use ca::{Interceptor, trust_env};
use reflect::{Guarded, Reflections};
pub use swap::{Scanner, standins_in};
use swap::{Swap, swap};

use super::log::{Row, row};

/// HTTP/2 flow-control windows and send buffer of a decrypted connection, on both sides.
const H2_STREAM_WINDOW: u32 = 256 * 1024;
const H2_CONNECTION_WINDOW: u32 = 512 * 1024;
const H2_SEND_BUFFER: usize = 256 * 1024;
/// Requests of one decrypted HTTP/2 connection at once.
const H2_STREAMS: u32 = 32;
/// HTTP/1.1 read buffer of a decrypted connection (the longest head it accepts).
const H1_BUFFER: usize = 64 * 1024;
use super::{Bindings, Hub, SandboxNet};

/// A stream whose first bytes were already read (by the relay's sniffing).
struct Prefixed {
    first: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body on its way out: a stand-in in it aborts the request.
struct Scanned {
    inner: Incoming,
    scanner: Scanner,
    found: Arc<Mutex<Option<String>>>,
}

impl HttpBody for Scanned {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => f,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref()
            && let Some(s) = self.scanner.scan(data)
        {
            *self.found.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
            return Poll::Ready(Some(Err("a stand-in in the request body".into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The upstream connection, whichever protocol it speaks.
enum Upstream {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Body>>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Upstream {
    async fn send(&self, req: Request<Body>) -> hyper::Result<Response<Incoming>> {
        match self {
            Upstream::H1(s) => {
                let mut s = s.lock().await;
                s.ready().await?;
                s.send_request(req).await
            }
            Upstream::H2(s) => {
                let mut s = s.clone();
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }
    fn is_h2(&self) -> bool {
        matches!(self, Upstream::H2(_))
    }
}

/// A refusal the client reads: the preview proxy's plain-text page.
fn refused(status: StatusCode, text: &str) -> Response<Body> {
    crate::proxy::page(status, text)
}

/// Carries one decrypted connection: the client's TLS ends here, the upstream's starts here.
/// Returns when both are done; every request is logged on its own.
pub async fn serve(
    hub: Arc<Hub>,
    net: Arc<SandboxNet>,
    client: TcpStream,
    first: Vec<u8>,
    host: String,
    target: SocketAddr,
) -> Result<(), String> {
    let Some(interceptor) = hub.interceptor() else {
        return Err("the engine has no interception CA".into());
    };
    // Upstream first: if the real host cannot be reached or its certificate does not verify,
    // the client's handshake fails rather than its requests.
    let tcp = tokio::time::timeout(super::CONNECT_TIMEOUT, TcpStream::connect(target))
        .await
        .map_err(|_| format!("connect to {target} timed out"))?
        .map_err(|e| format!("connect to {target}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(interceptor.upstream())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS to {host} failed (its certificate was not trusted?): {e}"))?;
    let h2_up = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    // What either side can make the engine buffer is bounded (a sandbox may hold
    // `MAX_DECRYPTED` of these): small flow-control windows and send buffers for HTTP/2, a small
    // read buffer for HTTP/1.1.
    let upstream = if h2_up {
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .max_send_buf_size(H2_SEND_BUFFER)
            .handshake(io)
            .await
            .map_err(|e| format!("HTTP/2 to {host}: {e}"))?;
        tokio::spawn(conn);
        Upstream::H2(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(H1_BUFFER)
            .handshake(io)
            .await
            .map_err(|e| format!("HTTP/1.1 to {host}: {e}"))?;
        tokio::spawn(conn);
        Upstream::H1(tokio::sync::Mutex::new(send))
    };

    let cert = interceptor.cert_for(&host)?;
    let mut server = rustls::ServerConfig::builder_with_provider(ca::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ca::One(cert)));
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let _ = client.set_nodelay(true);
    let accepted = tokio_rustls::TlsAcceptor::from(Arc::new(server))
        .accept(Prefixed {
            first,
            at: 0,
            inner: client,
        })
        .await
        .map_err(|e| format!("TLS from the sandbox for {host}: {e}"))?;
    let h2_down = accepted.get_ref().1.alpn_protocol() == Some(b"h2");
    let upstream = Arc::new(upstream);
    let served_host = host.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (hub, net, upstream, host) = (hub.clone(), net.clone(), upstream.clone(), host.clone());
        async move {
            Ok::<_, std::convert::Infallible>(
                forward(&hub, &net, &upstream, &host, target, req).await,
            )
        }
    });
    let io = TokioIo::new(accepted);
    let served = if h2_down {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .max_send_buf_size(H2_SEND_BUFFER)
            .max_concurrent_streams(H2_STREAMS)
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .max_buf_size(H1_BUFFER)
            .serve_connection(io, service)
            .await
    };
    served.map_err(|e| format!("serving {served_host}: {e}"))
}

async fn forward(
    hub: &Arc<Hub>,
    net: &Arc<SandboxNet>,
    upstream: &Upstream,
    host: &str,
    target: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let started = std::time::Instant::now();
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut row = row(
        Some(host.to_string()),
        Some(target),
        "tls",
        "allowed",
        String::new(),
    );
    let refuse = |mut row: Row, status: StatusCode, why: String| {
        row.verdict = "blocked";
        row.rule = why.clone();
        hub.log().record(&net.id, row);
        refused(status, &format!("sandbox-mcp: {why}"))
    };
    // The host the request names must be the name the TLS connection was made and verified
    // for: otherwise a fronted request could carry the value to another site behind the same
    // address.
    if let Err(why) = swap::check_authority(&parts, host, target.port()) {
        return refuse(
            row,
            StatusCode::MISDIRECTED_REQUEST,
            format!("{why}: refused (domain fronting)"),
        );
    }
    if matches!(parts.method.as_str(), "TRACE" | "TRACK" | "CONNECT") {
        return refuse(
            row,
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} echoes the request back, a secret's value included: refused to a secret's host",
                parts.method
            ),
        );
    }
    let bindings = net.bindings();
    let tenant = bindings.tenant.clone();
    let store = hub.secrets();
    let open = |secret: &str| {
        store
            .open_value(tenant.as_deref(), secret)
            .map_err(|e| e.to_string())
    };
    match swap(&mut parts.headers, &path, host, &bindings, &open) {
        Swap::Refused(why) => return refuse(row, StatusCode::FORBIDDEN, why),
        Swap::Applied(applied) => {
            row.rule = if applied.is_empty() {
                "decrypted for a bound secret's host; no stand-in in this request".into()
            } else {
                let names: Vec<String> = applied
                    .iter()
                    .map(|(env, secret)| format!("secret {secret} applied ({env})"))
                    .collect();
                names.join(", ")
            };
        }
    }
    // What the response must not carry: the value of every secret bound here that may go to
    // this host (a server may hand back what an earlier request sent, not only this one).
    let guard = Arc::new(reflections(&bindings, &open, host));
    crate::proxy::strip_hop_by_hop(&mut parts.headers, false);
    swap::drop_authorities(&mut parts.headers);
    let authority = swap::outgoing(host, target.port());
    if !guard.is_empty() {
        // Encoded responses could not be searched.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    let uri = if upstream.is_h2() {
        parts.version = axum::http::Version::HTTP_2;
        format!("https://{authority}{path}")
    } else {
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(header::HOST, v);
        }
        parts.version = axum::http::Version::HTTP_11;
        path
    };
    parts.uri = match uri.parse() {
        Ok(u) => u,
        Err(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "a request URI that cannot be forwarded",
            );
        }
    };
    let found = Arc::new(Mutex::new(None));
    let body = Body::new(Scanned {
        inner: body,
        scanner: Scanner::default(),
        found: found.clone(),
    });
    let sent = upstream.send(Request::from_parts(parts, body)).await;
    row.duration_ms = started.elapsed().as_millis() as u64;
    let leaked = found.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(standin) = leaked {
        let who = bindings.describe(&standin);
        let why = format!("leak attempt: {who} in a request body to {host}");
        return refuse(row, StatusCode::FORBIDDEN, why);
    }
    let response = match sent {
        Ok(response) => response,
        Err(e) => {
            row.verdict = "failed";
            row.rule = format!("{}; upstream: {e}", row.rule);
            hub.log().record(&net.id, row);
            return refused(
                StatusCode::BAD_GATEWAY,
                &format!("sandbox-mcp: {host} did not answer: {e}"),
            );
        }
    };
    // A new response of the parts that are searched: status, headers, body. (Extensions such
    // as a non-standard reason phrase are not carried.)
    let (head, body) = response.into_parts();
    let mut headers = head.headers;
    // Read before the hop-by-hop headers go: a transfer coding is one of them.
    let coded = coding(&headers);
    crate::proxy::strip_hop_by_hop(&mut headers, false);
    if !guard.is_empty() {
        if let Some(secret) = guard.in_headers(&headers) {
            let why = format!(
                "leak attempt: the response from {host} carried the value of secret {secret} in its headers (the server reflected it); it was withheld"
            );
            return refuse(row, StatusCode::BAD_GATEWAY, why);
        }
        if let Some(encoding) = coded {
            let why = format!(
                "the response from {host} came {encoding}-encoded although identity was asked; the engine must read a response to a secret's host to keep the value from coming back, so it was withheld"
            );
            row.verdict = "failed";
            row.rule = why.clone();
            hub.log().record(&net.id, row);
            return refused(StatusCode::BAD_GATEWAY, &format!("sandbox-mcp: {why}"));
        }
    }
    hub.log().record(&net.id, row);
    let (log_hub, id, host, response_row) = (hub.clone(), net.id.clone(), host.to_string(), target);
    let tripped = Box::new(move |secret: &str| {
        let mut cut = super::log::row(
            Some(host.clone()),
            Some(response_row),
            "tls",
            "blocked",
            format!(
                "leak attempt: the response from {host} carried the value of secret {secret} in its body (the server reflected it); it was cut before it"
            ),
        );
        cut.count = 1;
        log_hub.log().record(&id, cut);
    });
    let mut out = Response::new(Body::new(Guarded::new(body, guard, tripped)));
    *out.status_mut() = head.status;
    *out.headers_mut() = headers;
    out
}

/// A coding of a response's body other than none: a `Content-Encoding` but `identity`, or a
/// `Transfer-Encoding` but `chunked` (which the client has undone; `gzip, chunked` leaves gzip),
/// named as the response named it. A value that is not text counts as one.
fn coding(headers: &http::HeaderMap) -> Option<String> {
    let named = |name: header::HeaderName, none: &'static str| {
        headers.get_all(name).iter().find_map(move |v| {
            let Ok(text) = v.to_str() else {
                return Some("an unreadable".to_string());
            };
            text.split(',')
                .map(str::trim)
                .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(none))
                .map(str::to_string)
        })
    };
    named(header::CONTENT_ENCODING, "identity")
        .or_else(|| named(header::TRANSFER_ENCODING, "chunked"))
}

/// The values a response from `host` must not carry: those of the secrets bound in the sandbox
/// that may go there.
fn reflections(bindings: &Bindings, open: &swap::OpenSecret<'_>, host: &str) -> Reflections {
    let mut names: Vec<&String> = bindings.by_standin.values().map(|(_, s)| s).collect();
    names.sort();
    names.dedup();
    let opened: Vec<(String, crate::secrets::Value)> = names
        .into_iter()
        .filter_map(|name| match open(name) {
            Ok(Some((meta, value))) if meta.allows(host) => Some((name.clone(), value)),
            _ => None,
        })
        .collect();
    let values: Vec<(String, &[u8])> = opened
        .iter()
        .map(|(name, value)| (name.clone(), value.as_bytes()))
        .collect();
    Reflections::new(&values)
}
