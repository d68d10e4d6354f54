//! Forbidden destinations stay unreachable whatever the rules say, and root in the sandbox cannot
//! change its network.

use serde_json::json;

use crate::require_sandboxes;

use super::{FETCH, create_with, engine_for, log, py, pypi_only};

#[tokio::test]
async fn forbidden_destinations_stay_unreachable_whatever_the_rules() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    // Even a sandbox that allows everything by name and address.
    let id = create_with(&client, json!({"allow_out": ["*.test", "0.0.0.0/0"]})).await;
    let host = net.host_ip;
    let engine_port = engine.url.rsplit(':').next().unwrap().to_string();
    let out = py(
        &client,
        &id,
        &format!(
            r#"{FETCH}
import socket
for name in ("rebind.test", "private.test", "metadata.test"):
    try:
        print(name, socket.gethostbyname(name))
    except OSError as e:
        print(name, "unresolved")
for url in ("http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://{host}/", "http://127.0.0.2:{engine_port}/v1/health"):
    print(url, fetch(url)[:3])
# A protocol whose server speaks first (the client sends nothing): reset, not left hanging.
s = socket.create_connection(("10.0.0.1", 22), timeout=10)
try:
    print("ssh", s.recv(100) or "closed")
except socket.timeout:
    print("ssh hung")
except OSError as e:
    print("ssh reset", e.errno)
"#
        ),
    )
    .await;
    for name in ["rebind.test", "private.test", "metadata.test"] {
        assert!(out.contains(&format!("{name} unresolved")), "{out}");
    }
    assert!(
        out.contains("169.254.169.254/latest/meta-data/ 403"),
        "{out}"
    );
    assert!(out.contains("http://10.0.0.1/ 403"), "{out}");
    assert!(
        out.contains(&format!("http://{host}/ 403")),
        "the host's own address: {out}"
    );
    assert!(!out.contains("health 200"), "{out}");
    assert!(out.contains("ssh reset 104"), "ECONNRESET, at once: {out}");
    let blocked = log(&client, &id, json!({"verdict": "blocked"})).await;
    let rules: Vec<&str> = blocked.iter().filter_map(|e| e["rule"].as_str()).collect();
    assert!(
        rules.iter().any(|r| r.contains("this host's own address")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.contains("DNS rebinding")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.contains("169.254.0.0/16")),
        "{rules:?}"
    );
}

#[tokio::test]
async fn root_in_the_sandbox_cannot_change_its_network() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net, |_| {}).await;
    let client = engine.mcp().await;
    let id = create_with(&client, pypi_only()).await;
    let ip = net.net_ip;
    let out = py(
        &client,
        &id,
        &format!(
            r#"{FETCH}
import socket, struct, subprocess
def run(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    print(cmd, "->", r.returncode)
run("ip route add 198.51.100.0/24 dev lo")
run("ip link add dummy0 type dummy")
run("ip addr add 10.9.9.9/32 dev lo")
run("ip link set lo down")
# `nft flush ruleset`, spoken directly: a netfilter batch deleting the steering table.
def nlmsg(kind, flags, body, seq):
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body
name = b"sandbox\0"
attr = struct.pack("=HH", 4 + len(name), 1) + name + b"\0" * (-len(name) % 4)
batch = (nlmsg(0x10, 1, struct.pack("=BBH", 0, 0, socket.htons(10)), 1)
         + nlmsg((10 << 8) | 2, 1 | 4, struct.pack("=BBH", 2, 0, 0) + attr, 2)
         + nlmsg(0x11, 1, struct.pack("=BBH", 0, 0, socket.htons(10)), 3))
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)
    s.send(batch)
    reply = s.recv(4096)
    code = struct.unpack("=i", reply[16:20])[0]
    print("nft delete table ->", code)
except OSError as e:
    print("nft delete table -> refused", e.errno)
for kind in (socket.SOCK_RAW,):
    try:
        socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP); print("raw socket opened")
    except OSError as e:
        print("raw socket refused", e.errno)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("{ip}", 9999)); print("udp sent")
except OSError as e:
    print("udp refused", e.errno)
print("after", fetch("http://pypi.test/")[:3], fetch("http://{ip}/", host="other.test")[:3])
"#
        ),
    )
    .await;
    for cmd in [
        "ip route add 198.51.100.0/24 dev lo",
        "ip link add dummy0 type dummy",
        "ip addr add 10.9.9.9/32 dev lo",
        "ip link set lo down",
    ] {
        assert!(out.contains(&format!("{cmd} ->")), "{out}");
        assert!(
            !out.contains(&format!("{cmd} -> 0")),
            "`{cmd}` succeeded: {out}"
        );
    }
    assert!(!out.contains("nft delete table -> 0\n"), "{out}");
    assert!(out.contains("raw socket refused"), "{out}");
    assert!(
        out.contains("udp refused 1"),
        "other UDP fails at once with EPERM: {out}"
    );
    // The rules still hold.
    assert!(out.contains("after 200 403"), "{out}");
}
