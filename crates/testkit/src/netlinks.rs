//! The links of a test internet, shared by the tests (`tests/testnet.rs`) and the benchmarks
//! (`benches/bench/main.rs`): a network namespace of its own, joined to the host by
//! a veth pair addressed from a /28 of 198.51.100.0/24 (TEST-NET-2, reserved for documentation:
//! no real host has it, and it is neither private nor this machine's own).
//!
//! Runs in one process and in concurrent ones each get their own /28, chosen under a file lock;
//! namespace and interface names carry the owner's pid (`<prefix><pid>-<n>`), so the leftovers
//! of a killed run are recognised and removed by the next claim. Uses the `ip` command
//! (iproute2): fine for a fixture, and nothing to get wrong.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::fcntl::{Flock, FlockArg};

/// Serialises the choice of a /28 between threads and processes (flock: per open file).
const LOCK: &str = "/tmp/sandbox-mcp-testnet.lock";
/// The namespace's end of the veth pair (created there directly: no clash with the host's).
const NS_LINK: &str = "veth0";
/// The network the /28s are cut from.
pub const TEST_NET: [u8; 3] = [198, 51, 100];

/// A namespace and the veth pair into it, removed on drop (also when a start fails halfway).
pub struct Links {
    pub ns: String,
    pub host_if: String,
    /// Which /28 of TEST-NET-2: addresses `slot * 16 ..= slot * 16 + 15`.
    pub slot: u8,
}

impl Links {
    fn addr(&self, last: u8) -> Ipv4Addr {
        let [a, b, c] = TEST_NET;
        Ipv4Addr::new(a, b, c, self.slot * 16 + last)
    }

    /// The host's end of the pair.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.addr(1)
    }

    /// The namespace's end, where servers listen.
    pub fn net_ip(&self) -> Ipv4Addr {
        self.addr(2)
    }

    /// The /28 both ends are in, e.g. "198.51.100.16/28".
    pub fn subnet(&self) -> String {
        format!("{}/28", self.addr(0))
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        // Deleting one end deletes both, at once; the namespace alone would take its veth with
        // it only once the kernel gets round to destroying the namespace.
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// Claims a free /28 and creates namespace `<ns_prefix><pid>-<n>` (with `lo` up) and a veth
/// pair from host interface `<link_prefix><pid>-<n>` into it (at most 15 characters: keep the
/// link prefix short and `n` small). `highest`: take the highest free /28 rather than the
/// lowest, so that concurrent users of different kinds rarely meet.
pub fn claim(ns_prefix: &str, link_prefix: &str, n: u32, highest: bool) -> Result<Links, String> {
    let pid = std::process::id();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .map_err(|e| format!("open {LOCK}: {e}"))?;
    let _lock =
        Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| format!("lock {LOCK}: {e}"))?;
    remove_stale(ns_prefix, link_prefix);
    let slot = free_slot(highest)?;
    create(
        &format!("{ns_prefix}{pid}-{n}"),
        &format!("{link_prefix}{pid}-{n}"),
        slot,
    )
    // Unlocked here: the new host address now marks the /28 as taken.
}

fn create(ns: &str, host_if: &str, slot: u8) -> Result<Links, String> {
    ip(&["netns", "add", ns]).map_err(|e| format!("needs network namespaces: {e}"))?;
    let links = Links {
        ns: ns.to_owned(),
        host_if: host_if.to_owned(),
        slot,
    };
    ip(&[
        "link", "add", host_if, "type", "veth", "peer", "name", NS_LINK, "netns", ns,
    ])
    .map_err(|e| format!("needs veth interfaces: {e}"))?;
    let (host, net) = (
        format!("{}/28", links.host_ip()),
        format!("{}/28", links.net_ip()),
    );
    ip(&["addr", "add", &host, "dev", host_if])?;
    ip(&["link", "set", host_if, "up"])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&["-n", ns, "addr", "add", &net, "dev", NS_LINK])?;
    ip(&["-n", ns, "link", "set", NS_LINK, "up"])?;
    Ok(links)
}

/// A /28 of 198.51.100.0/24 with no address of it on any host interface. Called under the lock,
/// after [`remove_stale`].
fn free_slot(highest: bool) -> Result<u8, String> {
    let addrs = ip(&["-o", "-4", "addr", "show"])?;
    let prefix = format!("inet {}.{}.{}.", TEST_NET[0], TEST_NET[1], TEST_NET[2]);
    let used: Vec<u8> = addrs
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find(&prefix)? + prefix.len()..];
            let last: u8 = rest.split('/').next()?.parse().ok()?;
            Some(last / 16)
        })
        .collect();
    let mut free = (0..16).filter(|slot| !used.contains(slot));
    let slot = if highest {
        free.next_back()
    } else {
        free.next()
    };
    slot.ok_or_else(|| "all 16 test networks (/28s of 198.51.100.0/24) are in use".into())
}

/// Removes the namespaces and host interfaces of processes that no longer exist (a run killed
/// before it could drop its [`Links`]), killing any process still in them.
fn remove_stale(ns_prefix: &str, link_prefix: &str) {
    for line in ip(&["netns", "list"]).unwrap_or_default().lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if stale(name, ns_prefix) {
            for pid in ip(&["netns", "pids", name]).unwrap_or_default().lines() {
                if let Ok(pid) = pid.trim().parse() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            let _ = ip(&["netns", "del", name]);
        }
    }
    // Lines look like "12: tn4242-0@if2: <BROADCAST,...".
    for line in ip(&["-o", "link", "show"]).unwrap_or_default().lines() {
        let name = line.split(": ").nth(1).unwrap_or_default();
        let name = name.split('@').next().unwrap_or_default();
        if stale(name, link_prefix) {
            let _ = ip(&["link", "del", name]);
        }
    }
}

/// Whether `name` is `<prefix><pid>-<suffix>` (suffix letters and digits) of a process that no
/// longer exists.
pub fn stale(name: &str, prefix: &str) -> bool {
    let Some((pid, suffix)) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.split_once('-'))
    else {
        return false;
    };
    !suffix.is_empty()
        && suffix.bytes().all(|b| b.is_ascii_alphanumeric())
        && pid
            .parse::<u32>()
            .is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Runs `ip ARGS`: its stdout, or Err with the command and its stderr.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("needs the `ip` command (iproute2): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
