//! The bench's test internet: a network namespace joined to the host by a veth pair (from
//! [`netlinks`], shared with the tests), with servers of the bench's own on its end: `GET
//! /bytes/N`, a TCP echo, and HTTPS with keep-alive for the secrets swap.

use std::io::Write;
use std::time::Duration;

use sandbox_mcp_testkit::netlinks;

/// The namespace is `smcp-bench-<pid>-0`, the host's end of the veth pair `bn<pid>-0` (see
/// [`netlinks`], shared with the tests, which take the lowest free /28 where the bench takes the
/// highest).
const NET_NS_PREFIX: &str = "smcp-bench-";

const NET_LINK_PREFIX: &str = "bn";

/// The test internet's servers: `GET /bytes/N` over HTTP/1.1, and a one-message TCP echo.
pub(crate) const BYTES_PORT: u16 = 8000;

pub(crate) const ECHO_PORT: u16 = 7;

/// And HTTPS/1.1 with keep-alive, for the secrets swap: a certificate for `*.bench.test` (the
/// secret's hosts) and `*.other.test` (passthrough), from a CA of the bench's own.
pub(crate) const HTTPS_PORT: u16 = 443;

pub(crate) const GIB: u64 = 1 << 30;

/// A network namespace joined to the host by a veth pair addressed from a /28 of TEST-NET-2, with
/// the servers listening on its end: real traffic that never leaves this machine. The sandboxes
/// reach it through the engine's relay, the host directly. Dropping it (also when a figure
/// panics) stops the servers and removes the namespace and both interfaces.
pub(crate) struct BenchNet {
    /// The namespace's end of the pair: where the servers listen.
    pub(crate) net_ip: std::net::Ipv4Addr,
    /// Clones of the listeners, shut down on drop to end the accept loops.
    pub(crate) listeners: Vec<std::net::TcpListener>,
    pub(crate) threads: Vec<std::thread::JoinHandle<()>>,
    pub(crate) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The HTTPS server, or why there is none (the figures that need it say so).
    pub(crate) https: Result<Https, String>,
    /// The namespace and the veth pair into it (dropped after the servers stop).
    pub(crate) links: netlinks::Links,
}

/// The test internet's HTTPS server: its CA, and what it was sent.
pub(crate) struct Https {
    /// The CA's certificate (PEM), and the same in a file for the engine's `--egress-ca`.
    pub(crate) ca_pem: String,
    pub(crate) ca_file: tempfile::NamedTempFile,
    /// The last `Authorization` header received, by TLS server name.
    pub(crate) seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
}

impl BenchNet {
    /// Err names what this machine lacks: root, network namespaces, veth, the `ip` command.
    pub(crate) fn start() -> Result<BenchNet, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "needs root (network namespaces, a veth pair, and sandboxes with networking)"
                    .into(),
            );
        }
        let links = netlinks::claim(NET_NS_PREFIX, NET_LINK_PREFIX, 0, true)?;
        let mut net = BenchNet {
            net_ip: links.net_ip(),
            listeners: Vec::new(),
            threads: Vec::new(),
            stop: Default::default(),
            https: Err("not started".into()),
            links,
        };
        let bytes = net.bind(BYTES_PORT)?;
        net.serve(bytes, |conn| {
            // One thread per download: a slow client holds up no other.
            std::thread::spawn(move || serve_bytes(conn));
        })?;
        let echo = net.bind(ECHO_PORT)?;
        net.serve(echo, serve_echo)?;
        net.https = net.start_https();
        Ok(net)
    }

    /// The HTTPS server on [`HTTPS_PORT`], with a CA and a certificate made for this run.
    pub(crate) fn start_https(&mut self) -> Result<Https, String> {
        let (config, ca_pem) = https_config()?;
        let mut ca_file = tempfile::Builder::new()
            .prefix("smcp-bench-ca")
            .suffix(".pem")
            .tempfile()
            .map_err(|e| format!("a temporary file for the bench CA: {e}"))?;
        ca_file
            .write_all(ca_pem.as_bytes())
            .map_err(|e| format!("writing the bench CA: {e}"))?;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Default::default()));
        let listener = self.bind(HTTPS_PORT)?;
        let handler_seen = seen.clone();
        self.serve(listener, move |conn| {
            let (config, seen) = (config.clone(), handler_seen.clone());
            std::thread::spawn(move || serve_https(conn, config, seen));
        })?;
        Ok(Https {
            ca_pem,
            ca_file,
            seen,
        })
    }

    /// A listener on the namespace's end, port `port`: bound by a thread that enters the
    /// namespace and ends (the socket stays in the namespace it was made in).
    pub(crate) fn bind(&self, port: u16) -> Result<std::net::TcpListener, String> {
        let path = format!("/run/netns/{}", self.links.ns);
        let addr = (self.net_ip, port);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("setns({path}): {e}"))?;
                std::net::TcpListener::bind(addr).map_err(|e| format!("bind {addr:?}: {e}"))
            })
            .join()
            .unwrap()
        })
    }

    /// Accepts on `listener` until dropped, handing each connection to `handle`.
    pub(crate) fn serve(
        &mut self,
        listener: std::net::TcpListener,
        handle: impl Fn(std::net::TcpStream) + Send + 'static,
    ) -> Result<(), String> {
        self.listeners
            .push(listener.try_clone().map_err(|e| e.to_string())?);
        let stop = self.stop.clone();
        self.threads.push(std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => handle(conn),
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }));
        Ok(())
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // A listener shut down fails its pending and future accepts at once.
        for l in &self.listeners {
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(l),
                nix::sys::socket::Shutdown::Both,
            );
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Then `links` goes: the pair and the namespace.
    }
}

/// `GET /bytes/N`: N bytes after a minimal HTTP/1.1 head, then close; written from a 1 MiB
/// buffer, so the sender costs next to nothing beside the path measured.
fn serve_bytes(mut conn: std::net::TcpStream) {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(n) if n > 0 && head.len() < 8192 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let Some(mut left) = head
        .strip_prefix("GET /bytes/")
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
    else {
        let _ = conn
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let header = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {left}\r\n\
         Connection: close\r\n\r\n"
    );
    if conn.write_all(header.as_bytes()).is_err() {
        return;
    }
    let chunk = vec![b'x'; 1 << 20];
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if conn.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n as u64;
    }
    // Close once the client has everything and closed its side.
    let _ = conn.shutdown(std::net::Shutdown::Write);
    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
}

/// The HTTPS server's TLS setting: a throwaway CA and a leaf it signs for `*.bench.test`,
/// `bench.test` and `*.other.test`; and the CA's PEM.
fn https_config() -> Result<(std::sync::Arc<rustls::ServerConfig>, String), String> {
    let err = |e: rcgen::Error| format!("bench certificates: {e}");
    let ca_key = rcgen::KeyPair::generate().map_err(err)?;
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "sandbox-mcp bench CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key).map_err(err)?.pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf_key = rcgen::KeyPair::generate().map_err(err)?;
    let mut leaf = rcgen::CertificateParams::new(vec![
        "*.bench.test".to_string(),
        "bench.test".to_string(),
        "*.other.test".to_string(),
    ])
    .map_err(err)?;
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "bench.test");
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf = leaf.signed_by(&leaf_key, &issuer).map_err(err)?;
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der())
        .map_err(|e| format!("bench leaf key: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .map_err(|e| format!("bench TLS server: {e}"))?;
    Ok((std::sync::Arc::new(config), ca_pem))
}

/// HTTP/1.1 over TLS, keep-alive: each request's head and `Content-Length` body are read (the
/// body thrown away as it comes), its `Authorization` noted under the TLS server name, and a
/// short 200 sent back; until the client closes or sends `Connection: close`.
fn serve_https(
    conn: std::net::TcpStream,
    config: std::sync::Arc<rustls::ServerConfig>,
    seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
) {
    use std::io::Read;
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(server) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(server, conn);
    let mut buf = vec![0u8; 256 * 1024];
    // Read but not yet used: the start of a head, or what followed a body.
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if pending.len() > 64 * 1024 {
                return;
            }
            match tls.read(&mut buf) {
                Ok(n @ 1..) => pending.extend_from_slice(&buf[..n]),
                _ => return,
            }
        };
        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
        pending.drain(..end);
        let (mut length, mut close, mut auth) = (0u64, false, None);
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap_or(0),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                "authorization" => auth = Some(value.to_string()),
                _ => {}
            }
        }
        if let (Some(name), Some(auth)) = (tls.conn.server_name(), auth) {
            seen.lock().unwrap().insert(name.to_string(), auth);
        }
        let early = (pending.len() as u64).min(length) as usize;
        pending.drain(..early);
        let mut left = length - early as u64;
        while left > 0 {
            match tls.read(&mut buf) {
                Ok(n @ 1..) => {
                    if n as u64 > left {
                        pending.extend_from_slice(&buf[left as usize..n]);
                        left = 0;
                    } else {
                        left -= n as u64;
                    }
                }
                _ => return,
            }
        }
        let answer: &[u8] = if close {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        };
        if tls.write_all(answer).and_then(|()| tls.flush()).is_err() {
            return;
        }
        if close {
            tls.conn.send_close_notify();
            let _ = tls.flush();
            return;
        }
    }
}

/// One message back as it came, then close: the round trip a connection's first request makes.
fn serve_echo(mut conn: std::net::TcpStream) {
    use std::io::Read;
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    if let Ok(n @ 1..) = conn.read(&mut buf) {
        let _ = conn.write_all(&buf[..n]);
    }
}
