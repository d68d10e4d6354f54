//! The relay: accepts what a sandbox's namespace steers to the engine, decides, and carries
//! allowed connections out from the engine's own namespace. The peer is hostile: every read is
//! bounded in size and time, and a sandbox holds at most `max_connections` at once.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::log::{Row, row};
use super::sniff::{self, Hello};
use super::{CONNECT_TIMEOUT, Hub, SandboxNet, dns, intercept};
use crate::engine::policy::Verdict;

/// How long the relay waits for the first bytes of a connection when the decision depends on the
/// name they carry (a server-first protocol sends none: it is then judged by address and by the
/// name the sandbox resolved).
const SNIFF_WAIT: Duration = Duration::from_millis(300);
/// Most bytes read before deciding (a ClientHello with post-quantum key shares is ~2 KiB).
const SNIFF_MAX: usize = 16 * 1024;
/// Copy buffer per direction: large enough for ≥ 1 GB/s through the relay.
const COPY_BUFFER: usize = 256 * 1024;
/// DNS queries of one sandbox answered at once.
const DNS_CONCURRENCY: usize = 64;

pub(crate) fn listeners(
    tcp: std::net::TcpListener,
    dns: std::net::UdpSocket,
) -> std::io::Result<(TcpListener, UdpSocket)> {
    tcp.set_nonblocking(true)?;
    dns.set_nonblocking(true)?;
    Ok((TcpListener::from_std(tcp)?, UdpSocket::from_std(dns)?))
}

/// Holds one of the sandbox's connection slots.
struct Slot(Arc<SandboxNet>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) async fn serve_tcp(
    hub: Arc<Hub>,
    net: Arc<SandboxNet>,
    listener: TcpListener,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else {
            // EMFILE and friends: back off rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let held = net.connections.fetch_add(1, Ordering::Relaxed);
        let slot = Slot(net.clone());
        if held >= hub.config.max_connections {
            let dst = original_dst(&client).ok();
            refuse(client);
            hub.log.record(
                &net.id,
                row(
                    None,
                    dst.map(SocketAddr::V4),
                    "tcp",
                    "blocked",
                    format!(
                        "connection cap: at most {} connections at once per sandbox (--max-connections)",
                        hub.config.max_connections
                    ),
                ),
            );
            drop(slot);
            continue;
        }
        let (hub, net, stop) = (hub.clone(), net.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = handle(&hub, &net, client) => {}
            }
            drop(slot);
        });
    }
}

/// Resets the connection: the client's call fails at once (ECONNRESET), never hangs.
fn refuse(client: TcpStream) {
    // SO_LINGER 0 makes the close send a reset; on a non-blocking socket it never blocks.
    let reset = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = nix::sys::socket::setsockopt(&client, nix::sys::socket::sockopt::Linger, &reset);
    drop(client);
}

fn original_dst(s: &TcpStream) -> std::io::Result<SocketAddrV4> {
    let a = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::OriginalDst)?;
    Ok(SocketAddrV4::new(
        u32::from_be(a.sin_addr.s_addr).into(),
        u16::from_be(a.sin_port),
    ))
}

/// Reads the first bytes of a connection: until they name a host, [`SNIFF_MAX`], the client
/// closes, or `wait` passes.
async fn sniff_first(client: &mut TcpStream, wait: Duration) -> Vec<u8> {
    let mut buf = vec![0u8; SNIFF_MAX];
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + wait;
    while n < buf.len() {
        match tokio::time::timeout_at(deadline, client.read(&mut buf[n..])).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(k)) => {
                n += k;
                if !sniff::incomplete(&buf[..n]) {
                    break;
                }
            }
        }
    }
    buf.truncate(n);
    buf
}

async fn handle(hub: &Arc<Hub>, net: &Arc<SandboxNet>, mut client: TcpStream) {
    let started = Instant::now();
    let Ok(dst) = original_dst(&client) else {
        // Not steered here by the rules: a direct connection to the engine's own port.
        refuse(client);
        return;
    };
    let ip = IpAddr::V4(*dst.ip());
    let policy = net.policy();
    let resolved = net.name_of(ip);
    // By address alone first. When a domain rule might allow what the address does not, the
    // name decides: the TLS server name or HTTP Host the client sends (so a name shared by many
    // sites behind one address is told apart), else the name the sandbox resolved to this
    // address. Blocked clients are read too, to answer HTTP with the reason. Otherwise the relay
    // starts at once (server-first protocols must not wait) and the first bytes are only read
    // for the log.
    let by_address = policy.decide(&hub.guard, ip, None);
    let needs_name =
        !by_address.allowed() && policy.has_domain_rules() && hub.guard.refuses(ip).is_none();
    // A sandbox with secrets bound has its first bytes read too: TLS to a secret's host is
    // decrypted (to swap the stand-in), plain HTTP carrying a stand-in is refused.
    let bindings = net.bindings();
    let guarded = !bindings.by_standin.is_empty();
    let wait = if by_address.allowed() && !guarded {
        Duration::ZERO
    } else {
        SNIFF_WAIT
    };
    let first = if wait.is_zero() {
        Vec::new()
    } else {
        sniff_first(&mut client, wait).await
    };
    let hello = sniff::parse(&first);
    let named = hello.name().map(str::to_string);
    // The name the connection goes by: what the client says, else what the sandbox resolved.
    let host = named.clone().or_else(|| resolved.clone());
    let verdict = if needs_name {
        policy.decide(&hub.guard, ip, host.as_deref())
    } else {
        by_address
    };
    let mut log = row(
        host.clone(),
        Some(SocketAddr::V4(dst)),
        hello.protocol(),
        "allowed",
        verdict.rule().to_string(),
    );
    let Verdict::Allow(_) = verdict else {
        log.verdict = "blocked";
        if matches!(hello, Hello::Http(_)) {
            let _ = client
                .write_all(&forbidden_page(host.as_deref(), dst, verdict.rule()))
                .await;
            let _ = client.shutdown().await;
        } else {
            refuse(client);
        }
        hub.log.record(&net.id, log);
        return;
    };
    // Allowed by a domain rule for a name the sandbox did not resolve through the engine to this
    // address: connect where the engine's own resolution of that name leads, never to an address
    // the sandbox picked (a fronted name must not open an arbitrary address).
    let target = match &named {
        Some(name) if needs_name && resolved.as_deref() != Some(name.as_str()) => {
            match lookup(hub, name).await {
                Ok(ip) => SocketAddr::new(ip, dst.port()),
                Err(why) => return fail(hub, net, client, log, why),
            }
        }
        _ => SocketAddr::V4(dst),
    };
    if guarded {
        match &hello {
            Hello::Tls(Some(sni)) if secret_host(hub, &bindings, sni) => {
                log.rule = format!("{}; decrypted: a bound secret's host", log.rule);
                log.duration_ms = started.elapsed().as_millis() as u64;
                let outcome =
                    intercept::serve(hub.clone(), net.clone(), client, first, sni.clone(), target)
                        .await;
                if let Err(why) = outcome {
                    log.verdict = "failed";
                    log.rule = why;
                }
                hub.log.record(&net.id, log);
                return;
            }
            Hello::Http(_) => {
                if let Some(standin) = intercept::standins_in(&first).first() {
                    let who = bindings.describe(standin);
                    log.verdict = "blocked";
                    log.rule = format!("leak attempt: {who} over plain HTTP");
                    let body = format!(
                        "sandbox-mcp: {who} is only swapped for its value over https; use https://{}/\n",
                        host.as_deref().unwrap_or("the host")
                    );
                    let page = format!(
                        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = client.write_all(page.as_bytes()).await;
                    let _ = client.shutdown().await;
                    hub.log.record(&net.id, log);
                    return;
                }
            }
            _ => {}
        }
    }
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let why = format!("{}; connect: {e}", log.rule);
            return fail(hub, net, client, log, why);
        }
        Err(_) => {
            let why = format!("{}; connect timed out after {CONNECT_TIMEOUT:?}", log.rule);
            return fail(hub, net, client, log, why);
        }
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let (sent, received, first, leaked) = pipe(client, upstream, first, guarded).await;
    // When the relay started at once, the first bytes name the protocol and host only now.
    let hello = sniff::parse(&first);
    log.protocol = hello.protocol();
    if let Some(name) = hello.name() {
        log.host = Some(name.to_string());
    }
    if let Some(standin) = leaked {
        let who = bindings.describe(&standin);
        log.verdict = "blocked";
        log.rule = format!("leak attempt: {who} in a connection's clear text; it was cut");
    }
    log.sent = sent;
    log.received = received;
    log.duration_ms = started.elapsed().as_millis() as u64;
    hub.log.record(&net.id, log);
}

/// Whether `host` is one that a secret bound in the sandbox may be sent to.
fn secret_host(hub: &Hub, bindings: &super::Bindings, host: &str) -> bool {
    let mut names: Vec<&String> = bindings.by_standin.values().map(|(_, s)| s).collect();
    names.sort();
    names.dedup();
    names.into_iter().any(
        |name| match hub.secrets().meta(bindings.tenant.as_deref(), name) {
            Ok(Some(m)) => m.allows(host),
            // Deleted since it was bound: still decrypted, so the request fails with the reason.
            _ => bindings
                .hosts_when_bound
                .get(name)
                .is_some_and(|hosts| crate::engine::secrets::host_matches(hosts, host)),
        },
    )
}

/// An allowed connection that could not be carried out: reset, logged as failed with why.
fn fail(hub: &Hub, net: &SandboxNet, client: TcpStream, mut log: Row, why: String) {
    log.verdict = "failed";
    log.rule = why;
    refuse(client);
    hub.log.record(&net.id, log);
}

/// Resolves `name` through the engine's upstreams to one address a sandbox may reach.
async fn lookup(hub: &Hub, name: &str) -> Result<IpAddr, String> {
    let addrs = dns::lookup(name, &hub.upstreams)
        .await
        .ok_or_else(|| format!("{name} does not resolve"))?;
    if let Some(why) = addrs.iter().find_map(|a| hub.guard.refuses(*a)) {
        return Err(format!(
            "forbidden answer for {name}: {why} (DNS rebinding)"
        ));
    }
    addrs
        .into_iter()
        .find(IpAddr::is_ipv4)
        .ok_or_else(|| format!("{name} has no IPv4 address"))
}

/// Copies both ways until both sides are done: what the client sent first, then the rest.
/// Returns the bytes sent and received, the client's first bytes (those read before deciding,
/// or else its first chunk, kept for the log: they name the host on TLS and HTTP), and — when
/// `scan` is set (the sandbox binds secrets) — a stand-in found in what the client sent, at
/// which point the connection was cut before those bytes went out.
async fn pipe(
    client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
    scan: bool,
) -> (u64, u64, Vec<u8>, Option<String>) {
    let (cr, mut cw) = client.into_split();
    let (ur, mut uw) = upstream.into_split();
    // A leak cuts the connection both ways, not only the side it was seen on.
    let cut = Arc::new(tokio::sync::Notify::new());
    let cut_down = cut.clone();
    let up = async move {
        let mut cr = BufReader::with_capacity(COPY_BUFFER, cr);
        let first = if first.is_empty() {
            let mut chunk = vec![0u8; 4096];
            let n = cr.read(&mut chunk).await.unwrap_or(0);
            chunk.truncate(n);
            chunk
        } else {
            first
        };
        let mut sent = 0u64;
        let mut leaked = None;
        if scan {
            // Clear text of a sandbox that binds secrets: each chunk is checked (with the end
            // of the one before, so a stand-in split across reads is seen) before it goes out.
            let mut scanner = intercept::Scanner::default();
            let mut buf = vec![0u8; COPY_BUFFER];
            let mut chunk = if first.is_empty() {
                let n = cr.read(&mut buf).await.unwrap_or(0);
                buf[..n].to_vec()
            } else {
                first.clone()
            };
            loop {
                if chunk.is_empty() {
                    break;
                }
                if let Some(s) = scanner.scan(&chunk) {
                    leaked = Some(s);
                    cut_down.notify_one();
                    break;
                }
                if uw.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len() as u64;
                let n = cr.read(&mut buf).await.unwrap_or(0);
                chunk = buf[..n].to_vec();
            }
        } else if !first.is_empty() && uw.write_all(&first).await.is_ok() {
            sent = first.len() as u64 + tokio::io::copy_buf(&mut cr, &mut uw).await.unwrap_or(0);
        }
        let _ = uw.shutdown().await;
        (sent, first, leaked)
    };
    let down = async move {
        let mut ur = BufReader::with_capacity(COPY_BUFFER, ur);
        let n = tokio::select! {
            n = tokio::io::copy_buf(&mut ur, &mut cw) => n.unwrap_or(0),
            () = cut.notified() => 0,
        };
        let _ = cw.shutdown().await;
        n
    };
    let ((sent, first, leaked), received) = tokio::join!(up, down);
    (sent, received, first, leaked)
}

/// The answer to an HTTP request that was blocked: what, why, and how to change it.
fn forbidden_page(host: Option<&str>, dst: SocketAddrV4, rule: &str) -> Vec<u8> {
    let what = match host {
        Some(h) => format!("{h} ({dst})"),
        None => dst.to_string(),
    };
    let fix = if rule.starts_with("forbidden") {
        "The engine's operator can open it with --egress-allow.".to_string()
    } else {
        let entry = host
            .map(str::to_string)
            .unwrap_or_else(|| dst.ip().to_string());
        format!(
            "To allow it, add \"{entry}\" to network.allow_out (sandbox_update changes it at runtime)."
        )
    };
    let body = format!(
        "sandbox-mcp: the connection to {what} was blocked by the sandbox's network policy: {rule}.\n{fix}\n"
    );
    format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\nx-sandbox-mcp-blocked: {}\r\n\r\n{body}",
        body.len(),
        rule.replace(['\r', '\n'], " ")
    )
    .into_bytes()
}

pub(crate) async fn serve_dns(
    hub: Arc<Hub>,
    net: Arc<SandboxNet>,
    sock: UdpSocket,
    stop: CancellationToken,
) {
    let sock = Arc::new(sock);
    let limit = Arc::new(tokio::sync::Semaphore::new(DNS_CONCURRENCY));
    let mut buf = vec![0u8; dns::MAX_MESSAGE];
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            r = sock.recv_from(&mut buf) => r,
        };
        let Ok((n, from)) = received else { continue };
        let msg = buf[..n].to_vec();
        // Beyond the concurrency bound, queries are dropped (the client retries), never queued
        // without end.
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let (hub, net, sock) = (hub.clone(), net.clone(), sock.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let Some(q) = dns::question(&msg) else { return };
            let policy = net.policy();
            let started = Instant::now();
            let out = dns::resolve(&msg, &q, &policy, &hub.guard, &hub.upstreams).await;
            net.remember(&q.name, &out.addrs);
            let _ = sock.send_to(&out.response, from).await;
            let (verdict, rule) = match (&out.blocked, out.failed) {
                (Some(why), _) => ("blocked", why.clone()),
                (None, true) => ("failed", out.rule.clone()),
                (None, false) => ("allowed", out.rule.clone()),
            };
            let mut log = row(Some(q.name.clone()), None, "dns", verdict, rule);
            log.sent = msg.len() as u64;
            log.received = out.response.len() as u64;
            log.duration_ms = started.elapsed().as_millis() as u64;
            hub.log.record(&net.id, log);
        });
    }
}
