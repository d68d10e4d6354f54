//! Sandbox networking on the engine's side: the egress policy, the resolver, the relay every
//! outbound TCP connection goes through, the network log, and brokered secrets (their store,
//! and the interception that swaps them in).
//!
//! A sandbox's network namespace (set up by the launcher: `linux::netns`) steers its DNS queries
//! and TCP connections to two sockets the engine creates *inside* that namespace
//! ([`EgressSockets`]). The engine accepts there, decides with the sandbox's current [`Policy`]
//! (read per connection, so a changed policy applies to the next connection at once), and
//! relays allowed connections from its own namespace. Nothing else leaves a sandbox.

pub mod dns;
pub mod intercept;
pub mod log;
pub mod policy;
pub mod proxy;
pub mod relay;
pub mod secrets;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::policy::{Cidr, Guard, Policy};
pub use sandbox_mcp_model::config::{DEFAULT_MAX_CONNECTIONS, EgressDefault, NetworkConfig};
pub use sandbox_mcp_model::driver::EgressSockets;
use sandbox_mcp_sys::budget::Descriptors;

/// Connections one sandbox may hold open through the relay at once, unless configured.
/// How long an outbound connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Names remembered per sandbox (address → the name it was resolved for).
const MAX_NAMES: usize = 4096;
/// Lanes of 256 KiB of copy buffer one sandbox's connections may hold at once: a direction that
/// keeps its buffer full takes them while they are free (one transfer may grow to all of them),
/// so its fast transfers cost the engine 4 MiB at most.
pub const FAST_LANES: usize = 16;
/// Connections of one sandbox decrypted at once (to a bound secret's host): each holds TLS and
/// HTTP state on both sides, so they are fewer than plain ones.
pub const MAX_DECRYPTED: usize = 32;

/// Parses an `--egress-allow` value, or says how to write it.
pub fn parse_egress_allow(s: &str) -> Result<String, String> {
    Cidr::parse(s.trim())
        .map(|c| c.to_string())
        .ok_or_else(|| format!("{s:?} is not a CIDR (write 198.51.100.0/24, or an address)"))
}

/// Parses a `--dns-upstream` value: `IP` or `IP:PORT` (`[IPv6]:PORT`).
pub fn parse_dns_upstream(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| {
            format!("{s:?} is not a resolver address (write 192.0.2.53 or 192.0.2.53:5353)")
        })
}

/// A sandbox's secret bindings, as the egress path needs them.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// Whose secrets these are.
    pub tenant: Option<String>,
    /// Stand-in → (environment variable, secret name).
    pub by_standin: HashMap<String, (String, String)>,
    /// Secret name → its hosts when it was bound (for a secret deleted since).
    pub hosts_when_bound: HashMap<String, Vec<String>>,
}

impl Bindings {
    /// How the log and refusals name a stand-in: its variable and secret.
    pub fn describe(&self, standin: &str) -> String {
        match self.by_standin.get(standin) {
            Some((env, secret)) => format!("{env} (secret {secret})"),
            None => "a stand-in not bound in this sandbox".into(),
        }
    }
}

/// What the engine shares between every sandbox's network.
pub struct Hub {
    config: NetworkConfig,
    guard: Guard,
    upstreams: Vec<SocketAddr>,
    log: log::NetLog,
    secrets: Arc<crate::secrets::SecretStore>,
    /// The CA and TLS settings for decrypting connections to bound secrets' hosts.
    interceptor: Option<Arc<intercept::Interceptor>>,
    /// The engine's descriptors that sandbox traffic may use.
    fds: Arc<Descriptors>,
}

impl Hub {
    pub fn new(
        config: NetworkConfig,
        log: log::NetLog,
        secrets: Arc<crate::secrets::SecretStore>,
        interceptor: Option<Arc<intercept::Interceptor>>,
        fds: Arc<Descriptors>,
    ) -> Arc<Hub> {
        let operator_allowed = config
            .egress_allow
            .iter()
            .filter_map(|c| Cidr::parse(c))
            .collect();
        let upstreams = if config.dns_upstream.is_empty() {
            dns::host_resolvers()
        } else {
            config.dns_upstream.clone()
        };
        Arc::new(Hub {
            guard: Guard {
                operator_allowed,
                host_addrs: sandbox_mcp_model::addrs::host_addresses(),
            },
            upstreams,
            log,
            secrets,
            interceptor,
            config,
            fds,
        })
    }

    /// The engine's descriptors that sandbox traffic may use.
    pub fn fds(&self) -> &Arc<Descriptors> {
        &self.fds
    }

    /// The relayed connections one sandbox may hold at once: `--max-connections`, or less when
    /// the engine's descriptors are fewer.
    pub fn max_connections(&self) -> usize {
        self.config
            .max_connections
            .min(self.fds.connections_per_sandbox())
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    pub fn log(&self) -> &log::NetLog {
        &self.log
    }

    pub fn secrets(&self) -> &crate::secrets::SecretStore {
        &self.secrets
    }

    pub fn interceptor(&self) -> Option<&Arc<intercept::Interceptor>> {
        self.interceptor.as_ref()
    }

    /// Parses a sandbox's rules under this engine's default.
    pub fn policy(&self, allow_out: &[String], deny_out: &[String]) -> Result<Policy, String> {
        Policy::parse(allow_out, deny_out, self.config.egress)
    }

    /// A policy with no rules: the engine's default alone.
    pub fn default_policy(&self) -> Policy {
        Policy::none(self.config.egress)
    }

    /// Serves a sandbox's egress sockets until `net` is stopped or re-attached.
    pub fn attach(
        self: &Arc<Self>,
        net: &Arc<SandboxNet>,
        sockets: EgressSockets,
    ) -> std::io::Result<()> {
        *lock(&net.netns) = sockets.netns.map(Arc::new);
        net.loopback_only
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let (tcp, udp) = relay::listeners(sockets.tcp, sockets.dns)?;
        let stop = {
            let mut current = lock(&net.attached);
            current.cancel();
            *current = net.stop.child_token();
            current.clone()
        };
        tokio::spawn(relay::serve_tcp(
            self.clone(),
            net.clone(),
            tcp,
            stop.clone(),
        ));
        tokio::spawn(relay::serve_dns(self.clone(), net.clone(), udp, stop));
        Ok(())
    }
}

/// One sandbox's network: its policy, the names it resolved, its open connections.
pub struct SandboxNet {
    pub id: String,
    policy: RwLock<Arc<Policy>>,
    names: Mutex<HashMap<Ipv4Addr, String>>,
    pub connections: AtomicUsize,
    /// Large copy buffers its connections may take (see [`FAST_LANES`]).
    pub fast_lanes: Arc<tokio::sync::Semaphore>,
    /// Decrypted connections it may hold (see [`MAX_DECRYPTED`]).
    pub decrypted: Arc<tokio::sync::Semaphore>,
    /// The sandbox's network namespace, once attached.
    netns: Mutex<Option<Arc<std::fs::File>>>,
    /// Its secret bindings (read per connection, so an attach or detach applies at once).
    bindings: RwLock<Arc<Bindings>>,
    /// The driver could not steer this sandbox's traffic (an unprivileged agent whose kernel
    /// refused the rules): it has loopback only.
    loopback_only: std::sync::atomic::AtomicBool,
    stop: CancellationToken,
    attached: Mutex<CancellationToken>,
}

impl SandboxNet {
    pub fn new(id: &str, policy: Policy) -> Arc<SandboxNet> {
        let stop = CancellationToken::new();
        Arc::new(SandboxNet {
            id: id.to_string(),
            policy: RwLock::new(Arc::new(policy)),
            names: Mutex::new(HashMap::new()),
            connections: AtomicUsize::new(0),
            fast_lanes: Arc::new(tokio::sync::Semaphore::new(FAST_LANES)),
            decrypted: Arc::new(tokio::sync::Semaphore::new(MAX_DECRYPTED)),
            netns: Mutex::new(None),
            bindings: RwLock::new(Arc::new(Bindings::default())),
            loopback_only: std::sync::atomic::AtomicBool::new(false),
            attached: Mutex::new(stop.child_token()),
            stop,
        })
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn bindings(&self) -> Arc<Bindings> {
        self.bindings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_bindings(&self, bindings: Bindings) {
        *self.bindings.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(bindings);
    }

    /// Applies to every connection and query from now on.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }

    fn remember(&self, name: &str, addrs: &[Ipv4Addr]) {
        let mut names = lock(&self.names);
        if names.len() + addrs.len() > MAX_NAMES {
            names.clear();
        }
        for a in addrs {
            names.insert(*a, name.to_string());
        }
    }

    fn name_of(&self, ip: IpAddr) -> Option<String> {
        match ip {
            IpAddr::V4(v4) => lock(&self.names).get(&v4).cloned(),
            IpAddr::V6(_) => None,
        }
    }

    pub fn set_loopback_only(&self) {
        self.loopback_only
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_loopback_only(&self) -> bool {
        self.loopback_only
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the engine can enter the sandbox's namespace (as root, once attached).
    pub fn can_enter(&self) -> bool {
        lock(&self.netns).is_some()
    }

    /// Connects to `127.0.0.1:port` inside the sandbox (a preview's way in). The socket is
    /// created in the sandbox's namespace on a thread of its own, thrown away afterwards: entering
    /// a namespace changes the calling thread for good, and no pooled thread may stay in it.
    pub async fn connect_inside(&self, port: u16) -> std::io::Result<tokio::net::TcpStream> {
        let ns = lock(&self.netns).clone().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the engine has not attached the sandbox's network namespace (the engine's log says why)",
            )
        })?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("preview-connect".into())
            .spawn(move || {
                let made = nix::sched::setns(&*ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
                    .and_then(|()| tokio::net::TcpSocket::new_v4());
                let _ = tx.send(made);
            })?;
        let socket = rx
            .await
            .map_err(|_| std::io::Error::other("the preview connect thread died"))??;
        // A socket belongs to the namespace it was made in, wherever it is used from.
        socket
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }

    /// Cancelled when the sandbox is gone.
    pub fn closed(&self) -> &CancellationToken {
        &self.stop
    }

    /// Stops serving (the sandbox is gone).
    pub fn close(&self) {
        self.stop.cancel();
    }
}

impl Drop for SandboxNet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

use sandbox_mcp_sys::lock;
