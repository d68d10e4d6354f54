//! The swap: TLS to a host that one of the sandbox's bound secrets may go to is terminated here,
//! with a certificate the engine's own CA mints for that name, and each request's headers get
//! the secret's value in place of its stand-in before they go on, over TLS verified against the
//! system's roots (plus `--egress-ca`), to the real host. Security-critical; keep it small.
//!
//! - Only hosts of a bound secret are decrypted; every other TLS connection passes untouched.
//! - The stand-in is swapped in request headers only. Found anywhere else — the URL, the body,
//!   a header for a host the secret may not go to, a header other than the secret's own — the
//!   request is refused (403, with the reason) and logged as a leak attempt. Plain-HTTP requests
//!   carrying one are refused by the relay with advice to use https.
//! - The value is read from the store for each request (a rotation applies at once) and never
//!   logged: the network log names the secret and the variable, not the value.
//! - Client and upstream each speak HTTP/1.1 or HTTP/2, whichever their ALPN chose; requests are
//!   carried across (so gRPC over h2 works). Upgrades (WebSocket) are not carried through here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::log::row;
use super::{Bindings, Hub, SandboxNet};
use crate::engine::ids;
use crate::engine::secrets::STANDIN_PREFIX;

/// Leaf certificates are valid from this long ago (a sandbox clock a little behind still
/// accepts them) …
const BACKDATE_SECS: i64 = 3600;
/// … for this long, and minted again when less than a day is left.
const LEAF_SECS: i64 = 7 * 24 * 3600;
/// Leaf certificates kept (one per host name).
const MAX_CACHED: usize = 1024;
/// Length of a stand-in's random part.
const STANDIN_TOKEN: usize = 32;

/// The engine's interception CA and what it mints.
pub(crate) struct Interceptor {
    /// The CA certificate, PEM: what sandboxes trust.
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// One key for every leaf (minting is then one signature).
    leaf_key: rcgen::KeyPair,
    leaf_signer: Arc<dyn rustls::sign::SigningKey>,
    certs: Mutex<HashMap<String, (Arc<CertifiedKey>, i64)>>,
    upstream: Arc<rustls::ClientConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn ca_params() -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "sandbox-mcp egress CA");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn at(unix_secs: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix_secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// Where sandboxes find the CA: the system bundle (the host's, plus this CA) and the CA alone.
pub(crate) const BUNDLE_IN_SANDBOX: &str = "/etc/ssl/certs/ca-certificates.crt";
pub(crate) const CA_IN_SANDBOX: &str = "/etc/ssl/certs/sandbox-mcp-egress-ca.pem";

/// The variables every sandbox gets so that common clients trust the CA (curl and git use the
/// system bundle anyway; Python's requests and pip carry their own unless told; Node adds
/// extra CAs from a file).
pub(crate) fn trust_env() -> Vec<(String, String)> {
    [
        ("SSL_CERT_FILE", BUNDLE_IN_SANDBOX),
        ("REQUESTS_CA_BUNDLE", BUNDLE_IN_SANDBOX),
        ("CURL_CA_BUNDLE", BUNDLE_IN_SANDBOX),
        ("PIP_CERT", BUNDLE_IN_SANDBOX),
        ("GIT_SSL_CAINFO", BUNDLE_IN_SANDBOX),
        ("NODE_EXTRA_CA_CERTS", CA_IN_SANDBOX),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl Interceptor {
    /// Loads the CA from `dir` (`egress-ca.pem`, `egress-ca.key` 0600), creating it on first
    /// use, and trusts the system's roots plus `extra_ca` upstream.
    pub(crate) fn open(dir: &Path, extra_ca: &[std::path::PathBuf]) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let (cert_path, key_path) = (dir.join("egress-ca.pem"), dir.join("egress-ca.key"));
        let err = |e: rcgen::Error| std::io::Error::other(format!("egress CA: {e}"));
        let (ca_pem, key) = match std::fs::read_to_string(&key_path) {
            Ok(key_pem) => (
                std::fs::read_to_string(&cert_path)?,
                rcgen::KeyPair::from_pem(&key_pem).map_err(err)?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = rcgen::KeyPair::generate().map_err(err)?;
                let mut params = ca_params();
                let now = ids::now_ms() / 1000;
                params.not_before = at(now - 24 * 3600);
                params.not_after = at(now + 10 * 365 * 24 * 3600);
                let cert = params.self_signed(&key).map_err(err)?;
                std::io::Write::write_all(
                    &mut std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&key_path)?,
                    key.serialize_pem().as_bytes(),
                )?;
                crate::durable::write_atomically(&cert_path, cert.pem().as_bytes(), 0o644)?;
                (cert.pem(), key)
            }
            Err(e) => return Err(e),
        };
        let issuer = rcgen::Issuer::new(ca_params(), key);
        let leaf_key = rcgen::KeyPair::generate().map_err(err)?;
        let der = PrivateKeyDer::try_from(leaf_key.serialize_der())
            .map_err(|e| std::io::Error::other(format!("leaf key: {e}")))?;
        let leaf_signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| std::io::Error::other(format!("leaf key: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for bundle in [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
        ] {
            if let Ok(certs) = CertificateDer::pem_file_iter(bundle) {
                roots.add_parsable_certificates(certs.flatten());
            }
        }
        for file in extra_ca {
            let certs: Vec<_> = CertificateDer::pem_file_iter(file)
                .map_err(|e| std::io::Error::other(format!("--egress-ca {}: {e}", file.display())))?
                .flatten()
                .collect();
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(std::io::Error::other(format!(
                    "--egress-ca {}: no PEM certificate in it",
                    file.display()
                )));
            }
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem,
            issuer,
            leaf_key,
            leaf_signer,
            certs: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A certificate for `host`, minted on first use and cached.
    fn cert_for(&self, host: &str) -> Result<Arc<CertifiedKey>, String> {
        let now = ids::now_ms() / 1000;
        let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cert, until)) = certs.get(host)
            && *until - now > 24 * 3600
        {
            return Ok(cert.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("certificate for {host}: {e}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host);
        params.not_before = at(now - BACKDATE_SECS);
        params.not_after = at(now + LEAF_SECS);
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| format!("certificate for {host}: {e}"))?;
        let key = Arc::new(CertifiedKey::new(
            vec![cert.der().clone()],
            self.leaf_signer.clone(),
        ));
        if certs.len() >= MAX_CACHED {
            certs.clear();
        }
        certs.insert(host.to_string(), (key.clone(), now + LEAF_SECS));
        Ok(key)
    }
}

/// Serves one certificate, whatever the client asks for (the relay already knows the name).
#[derive(Debug)]
struct One(Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for One {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

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

/// Every stand-in in `text`: the prefix and the token after it.
pub(crate) fn standins_in(text: &[u8]) -> Vec<String> {
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
pub(crate) struct Scanner {
    /// The last `prefix - 1` bytes seen.
    tail: Vec<u8>,
}

impl Scanner {
    /// The first stand-in (or its beginning) in `chunk` or across its joint with the previous
    /// chunk.
    pub(crate) fn scan(&mut self, chunk: &[u8]) -> Option<String> {
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
pub(crate) type OpenSecret<'a> = dyn Fn(
        &str,
    ) -> Result<
        Option<(
            crate::engine::secrets::SecretMeta,
            crate::engine::secrets::Value,
        )>,
        String,
    > + 'a;

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
                if let Some(only) = &meta.header
                    && !only.eq_ignore_ascii_case(name.as_str())
                {
                    return Swap::Refused(format!(
                        "{env} (secret {secret}) may only be sent in the {only} header, not {name}"
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
    crate::engine::proxy::page(status, text)
}

/// Carries one decrypted connection: the client's TLS ends here, the upstream's starts here.
/// Returns when both are done; every request is logged on its own.
pub(crate) async fn serve(
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
    let tls = tokio_rustls::TlsConnector::from(interceptor.upstream.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS to {host} failed (its certificate was not trusted?): {e}"))?;
    let h2_up = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let upstream = if h2_up {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("HTTP/2 to {host}: {e}"))?;
        tokio::spawn(conn);
        Upstream::H2(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("HTTP/1.1 to {host}: {e}"))?;
        tokio::spawn(conn);
        Upstream::H1(tokio::sync::Mutex::new(send))
    };

    let cert = interceptor.cert_for(&host)?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(One(cert)));
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
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await
    };
    served.map_err(|e| format!("serving {served_host}: {e}"))
}

async fn forward(
    hub: &Hub,
    net: &SandboxNet,
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
    // The host the request names (HTTP/2 :authority, else Host) must be the name the TLS
    // connection was made and verified for: otherwise a fronted request could carry the value
    // to another site behind the same address.
    let authority = parts
        .uri
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            parts
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_else(|| host.to_string());
    let named = authority
        .rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(authority.as_str(), |(h, _)| h);
    if !named.trim_end_matches('.').eq_ignore_ascii_case(host) {
        let why = format!(
            "the request names {named} but its TLS connection is to {host}: refused (domain fronting)"
        );
        hub.log().record(
            &net.id,
            row(
                Some(host.to_string()),
                Some(target),
                "https",
                "blocked",
                why.clone(),
            ),
        );
        return refused(
            StatusCode::MISDIRECTED_REQUEST,
            &format!("sandbox-mcp: {why}"),
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
    let mut row = row(
        Some(host.to_string()),
        Some(target),
        "https",
        "allowed",
        String::new(),
    );
    match swap(&mut parts.headers, &path, host, &bindings, &open) {
        Swap::Refused(why) => {
            row.verdict = "blocked";
            row.rule = why.clone();
            hub.log().record(&net.id, row);
            return refused(StatusCode::FORBIDDEN, &format!("sandbox-mcp: {why}"));
        }
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
    crate::engine::proxy::strip_hop_by_hop(&mut parts.headers, false);
    if upstream.is_h2() {
        parts.headers.remove(header::HOST);
        parts.uri = match format!("https://{authority}{path}").parse() {
            Ok(u) => u,
            Err(_) => {
                return refused(
                    StatusCode::BAD_REQUEST,
                    "a request URI that cannot be forwarded",
                );
            }
        };
        parts.version = axum::http::Version::HTTP_2;
    } else {
        if !parts.headers.contains_key(header::HOST)
            && let Ok(v) = HeaderValue::from_str(&authority)
        {
            parts.headers.insert(header::HOST, v);
        }
        parts.uri = match path.parse() {
            Ok(u) => u,
            Err(_) => {
                return refused(
                    StatusCode::BAD_REQUEST,
                    "a request URI that cannot be forwarded",
                );
            }
        };
        parts.version = axum::http::Version::HTTP_11;
    }
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
        row.verdict = "blocked";
        row.rule = format!("leak attempt: {who} in a request body to {host}");
        let why = row.rule.clone();
        hub.log().record(&net.id, row);
        return refused(StatusCode::FORBIDDEN, &format!("sandbox-mcp: {why}"));
    }
    match sent {
        Ok(mut response) => {
            crate::engine::proxy::strip_hop_by_hop(response.headers_mut(), false);
            hub.log().record(&net.id, row);
            response.map(Body::new)
        }
        Err(e) => {
            row.verdict = "failed";
            row.rule = format!("{}; upstream: {e}", row.rule);
            hub.log().record(&net.id, row);
            refused(
                StatusCode::BAD_GATEWAY,
                &format!("sandbox-mcp: {host} did not answer: {e}"),
            )
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::secrets::{SecretMeta, Value};

    const S1: &str = "sbxsecret_0123456789abcdefghjkmnpqrstvwxyz";

    fn meta(hosts: &[&str], header: Option<&str>, format: Option<&str>) -> SecretMeta {
        SecretMeta {
            tenant: None,
            name: "api".into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            header: header.map(String::from),
            format: format.map(String::from),
            created_at: 0,
            updated_at: 0,
        }
    }

    fn bindings() -> Bindings {
        Bindings {
            tenant: None,
            by_standin: [(S1.to_string(), ("API_KEY".to_string(), "api".to_string()))].into(),
            hosts_when_bound: HashMap::new(),
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
        let m = meta(&["api.example.test"], None, None);
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
            Some("Authorization"),
            Some("Bearer {value}"),
        );
        let (r, h) = run(&m, &[("authorization", S1)], "/", "api.example.test");
        assert!(matches!(r, Swap::Applied(_)));
        assert_eq!(h["authorization"], "Bearer REAL");
        let (r, _) = run(&m, &[("x-api-key", S1)], "/", "api.example.test");
        assert!(matches!(r, Swap::Refused(w) if w.contains("only be sent in the Authorization")));
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
