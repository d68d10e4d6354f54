//! The relay: accepts what a sandbox's namespace steers to the engine, decides, and carries
//! allowed connections out from the engine's own namespace. The peer is hostile: every read is
//! bounded in size and time, and a sandbox holds at most `max_connections` at once.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use sandbox_mcp_netparse::sniff::{self, Hello};

use super::log::{Row, row};
use super::{CONNECT_TIMEOUT, Hub, SandboxNet, dns, intercept};
use crate::policy::Verdict;
use pipe::pipe;

mod pipe;

/// How long the relay waits for the first bytes of a connection when the decision depends on the
/// name they carry (a server-first protocol sends none: it is then judged by address and by the
/// name the sandbox resolved).
const SNIFF_WAIT: Duration = Duration::from_millis(300);
/// Most bytes read before deciding (a ClientHello with post-quantum key shares is ~2 KiB).
const SNIFF_MAX: usize = 16 * 1024;
/// DNS queries of one sandbox answered at once.
const DNS_CONCURRENCY: usize = 64;
/// DNS queries one sandbox may send a second, sustained (a flood beyond is dropped unanswered,
/// and counted in its log) …
const DNS_PER_SECOND: f64 = 500.0;
/// … and at once.
const DNS_BURST: f64 = 1000.0;

pub fn listeners(
    tcp: std::net::TcpListener,
    dns: std::net::UdpSocket,
) -> std::io::Result<(TcpListener, UdpSocket)> {
    tcp.set_nonblocking(true)?;
    dns.set_nonblocking(true)?;
    Ok((TcpListener::from_std(tcp)?, UdpSocket::from_std(dns)?))
}

/// Holds one of the sandbox's connection slots (and, once granted, the engine's descriptors
/// for it).
struct Slot(Arc<SandboxNet>, Option<sandbox_mcp_sys::budget::Held>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

pub async fn serve_tcp(
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
        let mut slot = Slot(net.clone(), None);
        let max = hub.max_connections();
        // The sandbox's own cap first, then the engine's descriptors (two per connection),
        // which every sandbox shares.
        let refused_why = if held >= max {
            Some(format!(
                "connection cap: at most {max} connections at once per sandbox (--max-connections, and at most half of the engine's descriptors for sandbox traffic)"
            ))
        } else {
            match hub.fds().take(2) {
                Some(fds) => {
                    slot.1 = Some(fds);
                    None
                }
                None => Some(format!(
                    "the engine's descriptors for sandbox traffic are all in use ({} across its sandboxes); try again shortly",
                    hub.fds().total()
                )),
            }
        };
        if let Some(why) = refused_why {
            let dst = original_dst(&client).ok();
            refuse(client);
            hub.log.record(
                &net.id,
                row(None, dst.map(SocketAddr::V4), "tcp", "blocked", why),
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
                let Ok(_decrypting) = net.decrypted.clone().try_acquire_owned() else {
                    let why = format!(
                        "{}; at most {} connections to bound secrets' hosts at once per sandbox",
                        log.rule,
                        super::MAX_DECRYPTED
                    );
                    return fail(hub, net, client, log, why);
                };
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
    let (sent, received, first, leaked) =
        pipe(client, upstream, first, guarded, &net.fast_lanes).await;
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
                .is_some_and(|hosts| crate::secrets::host_matches(hosts, host)),
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

pub async fn serve_dns(
    hub: Arc<Hub>,
    net: Arc<SandboxNet>,
    sock: UdpSocket,
    stop: CancellationToken,
) {
    let sock = Arc::new(sock);
    let limit = Arc::new(tokio::sync::Semaphore::new(DNS_CONCURRENCY));
    let mut buf = vec![0u8; dns::MAX_MESSAGE];
    let (mut tokens, mut at) = (DNS_BURST, Instant::now());
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            r = sock.recv_from(&mut buf) => r,
        };
        let Ok((n, from)) = received else { continue };
        // A flood costs the flooding sandbox: beyond its rate, queries are dropped before they
        // are even parsed (the client retries), and only counted.
        let now = Instant::now();
        tokens = (tokens + now.duration_since(at).as_secs_f64() * DNS_PER_SECOND).min(DNS_BURST);
        at = now;
        if tokens < 1.0 {
            hub.log.dropped(&net.id, "dns", 1);
            continue;
        }
        tokens -= 1.0;
        let msg = buf[..n].to_vec();
        // Beyond the concurrency bound, or the engine's descriptors for sandbox traffic (one
        // per query sent upstream), queries are dropped (the client retries), never queued
        // without end.
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            hub.log.dropped(&net.id, "dns", 1);
            continue;
        };
        let Some(fd) = hub.fds().take(1) else {
            hub.log.dropped(&net.id, "dns", 1);
            continue;
        };
        let (hub, net, sock) = (hub.clone(), net.clone(), sock.clone());
        tokio::spawn(async move {
            let _held = (permit, fd);
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
