//! A "test internet" for the network tests: real traffic that never leaves this machine.
//!
//! [`TestNet::start`] creates a network namespace of its own, joined to the host by a veth pair
//! addressed from a /28 of 198.51.100.0/24 (TEST-NET-2, reserved for documentation: no real
//! host has it, and it is neither private nor this machine's own), and runs
//! `tests/fixtures/testnet.py` in it: DNS, HTTP, HTTPS (certificate from a CA made at start-up),
//! a PEP 503 index with one wheel, WebSocket echo and TCP echo. The host reaches it through the
//! connected /28 alone; nothing is routed anywhere else.
//!
//! Tests in one process (and in concurrent processes: two `cargo test` runs) may each start one:
//! each gets its own /28 and names carrying the owner's pid ([`crate::netlinks`], shared with
//! the benchmarks), so that leftovers of a killed run are recognised and removed by the next.

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The server script, run with the system's Python (not a pyenv shim earlier on PATH).
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/testnet.py");
const PYTHON: &str = "/usr/bin/python3";
/// Namespaces are `smcp-tn-<pid>-<n>`; host ends of the veth pairs `tn<pid>-<n>` (at most 15
/// characters: a pid has at most 7 digits, so `n` is kept to 5).
const NS_PREFIX: &str = "smcp-tn-";
const LINK_PREFIX: &str = "tn";
/// The servers' directories are `/tmp/smcp-testnet-<pid>-<random>`.
const DIR_PREFIX: &str = "smcp-testnet-";
/// How long the servers may take to bind everything (they make a CA and a wheel first).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The names the DNS server maps to [`TestNet::net_ip`]; the certificate covers all of them.
pub const SERVED_NAMES: [&str; 4] = ["pypi.test", "api.example.test", "other.test", "ws.test"];

/// A running test internet; dropping it stops the servers and removes the namespace.
pub struct TestNet {
    /// The network namespace the servers run in.
    pub ns: String,
    /// The host's end of the veth pair.
    pub host_ip: Ipv4Addr,
    /// The namespace's end: every server listens here, and DNS answers it for [`SERVED_NAMES`].
    pub net_ip: Ipv4Addr,
    /// The /28 both ends are in, e.g. "198.51.100.16/28".
    pub subnet: String,
    /// The DNS server: `net_ip:53` (UDP).
    pub dns: SocketAddr,
    /// The servers' files: `ca.pem`, `dns-queries.log`, `server.log`, `ready`.
    pub dir: tempfile::TempDir,
    server: Child,
    /// Dropped after `server` is killed (see `Drop`), which removes the namespace.
    _links: crate::netlinks::Links,
}

impl TestNet {
    /// Creates the namespace and veth pair and starts the servers, waiting until they listen.
    ///
    /// Err(reason naming the missing feature or tool) when this machine cannot: not root, no
    /// network namespaces or veth, no `ip`, `openssl` or `/usr/bin/python3`, or all 16 /28s in
    /// use.
    pub fn start() -> Result<TestNet, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root (to create network namespaces and veth pairs)".into());
        }
        crate::common::ensure_host_tools();
        for (tool, package) in [("ip", "iproute2"), ("openssl", "openssl")] {
            let found = Command::new(tool)
                .arg(if tool == "ip" { "-V" } else { "version" })
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                return Err(format!("needs the `{tool}` command (package {package})"));
            }
        }
        if !std::path::Path::new(PYTHON).exists() {
            return Err(format!("needs {PYTHON} (package python3)"));
        }

        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 100_000;
        remove_stale_dirs();
        let links = crate::netlinks::claim(NS_PREFIX, LINK_PREFIX, n, false)?;
        let (ns, host_ip, net_ip) = (links.ns.clone(), links.host_ip(), links.net_ip());

        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{pid}-"))
            .tempdir_in("/tmp")
            .map_err(|e| format!("make a temporary dir: {e}"))?;
        let log = fs::File::create(dir.path().join("server.log"))
            .map_err(|e| format!("create server.log: {e}"))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("dup server.log: {e}"))?;
        // `ip netns exec` execs the command itself (no fork): the child is the server, whose
        // parent is this process, so it also exits if this process dies without dropping it.
        let server = Command::new("ip")
            .args(["netns", "exec", &ns, PYTHON, SCRIPT, "--dir"])
            .arg(dir.path())
            .args(["--net-ip", &net_ip.to_string()])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("start {SCRIPT}: {e}"))?;
        let mut net = TestNet {
            ns,
            host_ip,
            net_ip,
            subnet: links.subnet(),
            dns: SocketAddr::from((net_ip, 53)),
            dir,
            server,
            _links: links,
        };
        net.wait_ready()?;
        Ok(net)
    }

    /// The test CA's certificate (PEM): what a client must trust to reach the HTTPS server.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Every request `/record` received so far (method, path, lower-cased headers), in order.
    pub fn recorded(&self) -> Vec<serde_json::Value> {
        fs::read_to_string(self.dir.path().join("requests.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Every name the DNS server has been asked about so far (lower-cased, no trailing dot), in
    /// order of arrival: a test can show that a name did, or never did, get here.
    pub fn dns_queries(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("dns-queries.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let ready = self.dir.path().join("ready");
        let deadline = Instant::now() + READY_TIMEOUT;
        while !ready.exists() {
            let log = || fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            if let Ok(Some(status)) = self.server.try_wait() {
                return Err(format!(
                    "the test network's servers exited ({status}):\n{}",
                    log()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the test network's servers were not ready within {READY_TIMEOUT:?}:\n{}",
                    log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for TestNet {
    /// Kills the servers; then `_links` removes the veth pair and the namespace, and `dir` goes.
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Removes the server directories of processes that no longer exist (a test run killed before
/// it could drop its [`TestNet`]).
fn remove_stale_dirs() {
    for entry in fs::read_dir("/tmp").into_iter().flatten().flatten() {
        if crate::netlinks::stale(&entry.file_name().to_string_lossy(), DIR_PREFIX) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// `let net = require_testnet!();`: a [`TestNet`], or the test returns, saying why it skipped
/// (or panics when `SANDBOX_MCP_REQUIRE_SANDBOX` is set, as in CI, like `require_sandboxes!`).
#[macro_export]
macro_rules! require_testnet {
    () => {
        match $crate::testnet::TestNet::start() {
            Ok(net) => net,
            Err(reason) => {
                if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                    panic!("the test network is required here but unavailable: {reason}");
                }
                eprintln!("SKIPPED {}: {reason}", module_path!());
                return;
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// The fixture's self-test, from the host's namespace.

/// One DNS question over UDP: (response code, A addresses in the answer section, answer count).
/// Also checks the ID was copied, QR and RA are set and the question is echoed.
fn dns_query(server: SocketAddr, name: &str, qtype: u16) -> (u8, Vec<Ipv4Addr>, u16) {
    let id: u16 = 0x5a17;
    let mut query = Vec::new();
    query.extend(id.to_be_bytes());
    query.extend([0x01, 0x00]); // RD
    query.extend([0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.split('.') {
        query.push(u8::try_from(label.len()).unwrap());
        query.extend(label.as_bytes());
    }
    query.push(0);
    query.extend(qtype.to_be_bytes());
    query.extend(1u16.to_be_bytes()); // class IN

    let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    socket.send_to(&query, server).unwrap();
    let mut buf = [0u8; 512];
    let len = socket.recv(&mut buf).unwrap();
    let reply = &buf[..len];
    assert_eq!(reply[..2], id.to_be_bytes(), "ID copied");
    assert_eq!(reply[2] & 0x80, 0x80, "QR set");
    assert_eq!(reply[3] & 0x80, 0x80, "RA set");
    assert_eq!(reply[4..6], [0, 1], "one question");
    assert_eq!(reply[12..query.len()], query[12..], "question echoed");
    let count = u16::from_be_bytes([reply[6], reply[7]]);
    let mut addrs = Vec::new();
    let mut pos = query.len();
    for _ in 0..count {
        // Name (a 2-byte pointer here), type, class, TTL, RDLENGTH, RDATA.
        assert_eq!(reply[pos] & 0xC0, 0xC0, "answer name is a pointer");
        let rtype = u16::from_be_bytes([reply[pos + 2], reply[pos + 3]]);
        let rdlen = usize::from(u16::from_be_bytes([reply[pos + 10], reply[pos + 11]]));
        let rdata = &reply[pos + 12..pos + 12 + rdlen];
        if rtype == 1 {
            addrs.push(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]));
        }
        pos += 12 + rdlen;
    }
    (reply[3] & 0x0F, addrs, count)
}

/// One WebSocket frame from a client: FIN set, masked (clients must mask).
pub(crate) fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut frame = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | u8::try_from(n).unwrap()),
        n if n < 1 << 16 => {
            frame.push(0x80 | 126);
            frame.extend(u16::try_from(n).unwrap().to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend(u64::try_from(n).unwrap().to_be_bytes());
        }
    }
    frame.extend(mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// One frame from the server (never masked): (opcode, payload).
pub(crate) fn ws_read(stream: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(head[1] & 0x80, 0, "server frames are not masked");
    let len = match head[1] & 0x7F {
        126 => {
            let mut n = [0u8; 2];
            stream.read_exact(&mut n).unwrap();
            u64::from(u16::from_be_bytes(n))
        }
        127 => {
            let mut n = [0u8; 8];
            stream.read_exact(&mut n).unwrap();
            u64::from_be_bytes(n)
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; usize::try_from(len).unwrap()];
    stream.read_exact(&mut payload).unwrap();
    (head[0] & 0x0F, payload)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn testnet_serves_dns_http_https_ws_tcp_and_an_index() {
    let started = Instant::now();
    let net = crate::require_testnet!();
    eprintln!(
        "testnet: {} ({} <-> {}) started in {:?}",
        net.ns,
        net.host_ip,
        net.net_ip,
        started.elapsed()
    );
    let [a, b, c, d] = net.host_ip.octets();
    assert_eq!([a, b, c], crate::netlinks::TEST_NET);
    assert_eq!(net.subnet, format!("{a}.{b}.{c}.{}/28", d - 1));
    assert_eq!(net.net_ip, Ipv4Addr::new(a, b, c, d + 1));
    assert_eq!(net.dns, SocketAddr::from((net.net_ip, 53)));

    // DNS.
    for name in SERVED_NAMES {
        assert_eq!(
            dns_query(net.dns, name, 1),
            (0, vec![net.net_ip], 1),
            "{name}"
        );
    }
    for (name, addr) in [
        ("rebind.test", Ipv4Addr::LOCALHOST),
        ("private.test", Ipv4Addr::new(10, 0, 0, 1)),
        ("metadata.test", Ipv4Addr::new(169, 254, 169, 254)),
    ] {
        assert_eq!(dns_query(net.dns, name, 1), (0, vec![addr], 1), "{name}");
    }
    assert_eq!(dns_query(net.dns, "pypi.test", 28), (0, vec![], 0), "AAAA");
    assert_eq!(dns_query(net.dns, "unknown.test", 1), (3, vec![], 0));
    let tunnelled = format!("c2vjcmv0-{}.tunnel.test", std::process::id());
    assert_eq!(dns_query(net.dns, &tunnelled, 1), (3, vec![], 0));
    let queries = net.dns_queries();
    assert!(queries.contains(&tunnelled), "{queries:?}");
    assert!(queries.contains(&"unknown.test".to_owned()));
    assert!(!queries.iter().any(|q| q.starts_with("never-asked")));

    // HTTP, by name (reqwest resolves the test names to the namespace).
    sandbox_mcp_api::install_tls();
    let ca = reqwest::Certificate::from_pem(&fs::read(net.ca_pem()).unwrap()).unwrap();
    let mut builder = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .tls_certs_only([ca]);
    for name in SERVED_NAMES.into_iter().chain(["unlisted.test"]) {
        builder = builder.resolve(name, SocketAddr::from((net.net_ip, 0)));
    }
    let http = builder.build().unwrap();
    let get = |url: &str| {
        let response = http.get(url).send().unwrap();
        assert!(
            response.status().is_success(),
            "{url}: {}",
            response.status()
        );
        response.bytes().unwrap()
    };
    assert_eq!(get("http://pypi.test/"), "hello from pypi.test");
    assert_eq!(get("http://api.example.test/bytes/1000").len(), 1000);
    let echo: serde_json::Value = http
        .get("http://other.test/echo")
        .header("X-Testnet", "yes")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["path"], "/echo");
    assert_eq!(echo["headers"]["x-testnet"], "yes");
    assert_eq!(echo["headers"]["host"], "other.test");
    let upload: serde_json::Value = http
        .post("http://pypi.test/upload")
        .body(vec![7u8; 100_000])
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(upload["received"], 100_000);
    assert_eq!(
        get("http://pypi.test/sse"),
        "data: 1\n\ndata: 2\n\ndata: 3\n\n"
    );

    // HTTPS: verified against the test CA, for every served name and no other.
    assert_eq!(
        get("https://api.example.test/"),
        "hello from api.example.test"
    );
    assert_eq!(get("https://ws.test/bytes/70000").len(), 70000);
    let unlisted = http.get("https://unlisted.test/").send();
    assert!(unlisted.is_err(), "a name off the certificate must fail");

    // The simple index, and the wheel matching its link's hash.
    let index = String::from_utf8(get("http://pypi.test/simple/").to_vec()).unwrap();
    assert!(
        index.contains(r#"href="/simple/sandboxtestpkg/""#),
        "{index}"
    );
    let page = String::from_utf8(get("https://pypi.test/simple/sandboxtestpkg/").to_vec()).unwrap();
    let href = page
        .split("href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap();
    let (path, sha) = href.split_once("#sha256=").unwrap();
    assert_eq!(path, "/packages/sandboxtestpkg-1.0-py3-none-any.whl");
    let wheel = get(&format!("http://pypi.test{path}"));
    assert_eq!(hex(&Sha256::digest(&wheel)), sha);
    assert!(wheel.starts_with(b"PK\x03\x04"), "a zip");

    // WebSocket echo: the RFC 6455 example key has a known accept value.
    let mut ws = TcpStream::connect((net.net_ip, 8080)).unwrap();
    ws.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ws.write_all(
        b"GET /echo HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        ws.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
        "{head}"
    );
    ws.write_all(&ws_frame(0x1, b"hello testnet")).unwrap();
    assert_eq!(ws_read(&mut ws), (0x1, b"hello testnet".to_vec()));
    let big: Vec<u8> = (0..70_000u32).map(|i| i.to_le_bytes()[0]).collect();
    ws.write_all(&ws_frame(0x2, &big)).unwrap();
    assert_eq!(ws_read(&mut ws), (0x2, big));
    ws.write_all(&ws_frame(0x8, &1000u16.to_be_bytes()))
        .unwrap();
    assert_eq!(ws_read(&mut ws), (0x8, 1000u16.to_be_bytes().to_vec()));

    // TCP echo.
    let mut tcp = TcpStream::connect((net.net_ip, 7)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.write_all(b"echo me").unwrap();
    let mut back = [0u8; 7];
    tcp.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"echo me");

    // Dropping removes everything.
    let (ns, dir) = (net.ns.clone(), net.dir.path().to_owned());
    drop(net);
    assert!(
        !crate::netlinks::ip(&["netns", "list"])
            .unwrap()
            .contains(&ns)
    );
    assert!(!dir.exists());
}
