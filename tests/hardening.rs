//! Hostile code against the engine and the agent: each finding of the hardening review,
//! reproduced from inside a sandbox (or from a hijacked agent's socket) and shown contained.
//! Resource-exhaustion tests give back what they take: their sandboxes are killed at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{McpClient, TestEngine, call, create, err, exec, ok, sh, text};
use crate::{require_cgroups, require_sandboxes};
use sandbox_mcp_model::config::DiskLimits;

/// Runs Python in the sandbox; its stdout.
async fn py(client: &McpClient, id: &str, code: &str) -> String {
    let r = exec(client, id, &format!("python3 - <<'EOF'\n{code}\nEOF")).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    r["stdout"].as_str().unwrap().to_string()
}

/// Starts `code` as a background Python job that writes what it holds to /tmp/held and then
/// keeps holding it; waits for that report.
async fn hold(client: &McpClient, id: &str, code: &str) -> String {
    ok(
        client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/hold.py", "content": code}),
    )
    .await;
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "python3 /root/hold.py", "background": true}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = exec(client, id, "cat /tmp/held 2>/dev/null").await;
        let out = r["stdout"].as_str().unwrap_or("").to_string();
        if !out.is_empty() {
            return out;
        }
        assert!(Instant::now() < deadline, "the holder never reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sandbox_dir(engine: &TestEngine, id: &str) -> PathBuf {
    engine.data_dir().join("sandboxes").join(id)
}

/// The host pid of a sandbox's agent.
fn agent_pid(engine: &TestEngine, id: &str) -> i32 {
    std::fs::read_to_string(sandbox_dir(engine, id).join("agent.pid"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn proc_field(pid: i32, file: &str, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_default()
        .to_string()
}

// ── 1. Deep trees: no walk of a sandbox's tree may crash the engine ────────────────────────

/// Builds /root/deep, 15 000 directories deep (far past PATH_MAX), with files along the way.
async fn deep_tree(client: &McpClient, id: &str) {
    let out = py(
        client,
        id,
        "import os\nos.mkdir('/root/deep'); os.chdir('/root/deep')\n\
         for i in range(15000):\n    os.mkdir('d'); os.chdir('d')\n    \
         if i % 1000 == 0: open('f', 'w').write('x'); os.symlink('/etc', 'l')\n\
         print(i + 1)",
    )
    .await;
    assert_eq!(out, "15000\n");
}

async fn deep_trees_survive_every_delete(disk: DiskLimits) {
    let engine = TestEngine::start_with(|c| c.disk_limits = disk).await;
    let client = engine.mcp().await;

    // The agent deletes one on request, and goes on answering.
    let a = create(&client).await;
    if disk == DiskLimits::Auto {
        // The btrfs store must really be in use, or this is the plain-store test again.
        let m = ok(&client, "sandbox_metrics", json!({"sandbox_id": a})).await;
        assert_eq!(
            m["disk_limit_enforced"], true,
            "the btrfs store was not set up (loop devices and btrfs are needed): {m}"
        );
    }
    deep_tree(&client, &a).await;
    // Capturing it as a template is refused with words the caller can act on (no host path),
    // and the sandbox goes on.
    let refused = err(
        &client,
        "sandbox_template_create",
        json!({"name": "deep", "from_sandbox": a}),
    )
    .await;
    assert!(
        refused.contains("/root/deep/d/d") && refused.contains("nested too deep"),
        "{refused}"
    );
    assert!(
        !refused.contains(&engine.data_dir().display().to_string()),
        "{refused}"
    );
    assert_eq!(sh(&client, &a, "echo alive").await, "alive\n");
    ok(
        &client,
        "sandbox_files_delete",
        json!({"sandbox_id": a, "path": "deep", "recursive": true}),
    )
    .await;
    assert_eq!(
        sh(&client, &a, "test -e /root/deep || echo gone").await,
        "gone\n"
    );

    // sandbox_kill deletes the sandbox's files (on a plain store, file by file).
    deep_tree(&client, &a).await;
    ok(&client, "sandbox_kill", json!({"sandbox_id": a})).await;
    assert!(!sandbox_dir(&engine, &a).exists());

    // Expiry runs the same delete. The tree takes seconds to build, and over 30 s on a machine
    // busy with other builds: leave it a minute.
    let b = ok(&client, "sandbox_create", json!({"timeout_seconds": 60})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    deep_tree(&client, &b).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    while sandbox_dir(&engine, &b).exists() {
        assert!(
            Instant::now() < deadline,
            "the expired sandbox was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Recovery after a restart finishes an interrupted kill, and the engine comes up; a deep
    // sandbox that lives on through the restart is killed afterwards like any other.
    let c = create(&client).await;
    deep_tree(&client, &c).await;
    let d = create(&client).await;
    deep_tree(&client, &d).await;
    drop(client);
    let dir = engine.stop().await;
    let config = {
        let mut c = TestEngine::config_for(dir.path());
        c.disk_limits = disk;
        c
    };
    sandbox_mcp_engine::state::Store::open(&config.state_db())
        .unwrap()
        .set_status(&c, sandbox_mcp_engine::state::Status::Killing)
        .unwrap();
    let engine = TestEngine::start_on(dir, config).await;
    assert!(!sandbox_dir(&engine, &c).exists());
    let client = engine.mcp().await;
    let listed = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["sandboxes"][0]["id"], d.as_str(), "{listed}");
    ok(&client, "sandbox_kill", json!({"sandbox_id": d})).await;
    assert!(!sandbox_dir(&engine, &d).exists());
    assert!(create(&client).await.starts_with("sbx_"));
}

#[tokio::test]
async fn a_tree_15000_deep_cannot_crash_a_plain_store() {
    require_sandboxes!();
    deep_trees_survive_every_delete(DiskLimits::Off).await;
}

#[tokio::test]
async fn a_tree_15000_deep_cannot_crash_the_btrfs_store() {
    require_cgroups!();
    if !std::path::Path::new("/usr/sbin/mkfs.btrfs").exists() {
        if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
            panic!("mkfs.btrfs (btrfs-progs) is required here");
        }
        eprintln!("SKIPPED a_tree_15000_deep_cannot_crash_the_btrfs_store: needs mkfs.btrfs");
        return;
    }
    deep_trees_survive_every_delete(DiskLimits::Auto).await;
}

// ── 2. The agent is out of reach of the code it runs ───────────────────────────────────────

/// Everything sandbox code might try on its agent (PID 1); prints what worked.
const AGENT_ATTACKS: &str = "\
    for sig in TERM KILL STOP INT USR1 HUP; do kill -$sig 1 2>/dev/null && echo \"signal $sig delivered\"; done
    prlimit --pid 1 --nofile=8 2>/dev/null && echo 'prlimit worked'
    (echo 1000 > /proc/1/oom_score_adj) 2>/dev/null && echo 'oom_score_adj written'
    (echo -1000 > /proc/1/oom_score_adj) 2>/dev/null && echo 'oom_score_adj lowered'
    for f in environ maps mem fd/0 root/ cwd/ exe stack syscall io; do
        cat /proc/1/$f >/dev/null 2>&1 && echo \"read /proc/1/$f\"
        ls /proc/1/$f >/dev/null 2>&1 && [ \"${f%/}\" != \"$f\" ] && echo \"listed /proc/1/$f\"
    done";

/// PTRACE_ATTACH to the agent, and reading its memory with process_vm_readv; prints how each
/// ended.
const TRACE_ATTACKS: &str = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
class iovec(ctypes.Structure): _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n\
buf = ctypes.create_string_buffer(64)\n\
local, remote = iovec(ctypes.addressof(buf), 64), iovec(0x400000, 64)\n\
said = lambda r: 'refused' if r == -1 else f'returned {r}'\n\
print(said(libc.ptrace(16, 1, 0, 0)), said(libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)))";

#[tokio::test]
async fn sandbox_code_cannot_signal_trace_limit_or_reconfigure_the_agent() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let pid = agent_pid(&engine, &id);
    let oom_before = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
    let files_before = proc_field(pid, "limits", "Max open files");
    let out = sh(
        &client,
        &id,
        &format!("{AGENT_ATTACKS}\nrenice -n 19 -p 1 >/dev/null 2>&1 && echo reniced\necho done"),
    )
    .await;
    assert_eq!(out, "done\n", "sandbox code reached the agent:\n{out}");
    // ptrace and process_vm_readv (both refused) say the same.
    let out = py(&client, &id, TRACE_ATTACKS).await;
    assert_eq!(out, "refused refused\n", "ptrace, process_vm_readv");
    // From the host: nothing changed, and the agent still answers.
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap(),
        oom_before
    );
    assert_eq!(proc_field(pid, "limits", "Max open files"), files_before);
    for _ in 0..3 {
        assert_eq!(sh(&client, &id, "echo alive").await, "alive\n");
    }
    if nix::unistd::geteuid().is_root() {
        // As root the agent runs as an id outside the range mapped into the sandbox.
        let uid = proc_field(pid, "status", "Uid:");
        let host_uid: u32 = uid.split_whitespace().nth(1).unwrap().parse().unwrap();
        let inside = sh(&client, &id, "cat /proc/1/status | grep ^Uid").await;
        assert!(
            inside.contains("65534"),
            "the agent's id shows as unmapped: {inside}"
        );
        assert!(host_uid >= sandbox_mcp_linux::plan::UID_BASE, "{uid}");
        // The sandbox's user namespace is owned by the agent's own id, not root: the kernel
        // charges the sandbox's per-user budgets to that id.
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user")).unwrap();
        let mut owner: libc::uid_t = u32::MAX;
        // SAFETY: NS_GET_OWNER_UID (_IO(0xb7, 0x4)) writes one uid_t through the pointer.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&ns),
                0xb704,
                &mut owner as *mut libc::uid_t,
            )
        };
        assert_eq!(
            r,
            0,
            "NS_GET_OWNER_UID: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(owner, host_uid, "the sandbox's user namespace owner");
    }
}

/// The same attacks with the engine run as an ordinary user: sandbox code then has the agent's
/// own uid, and the agent is kept out of reach by Landlock (signals, ptrace-style access to its
/// /proc), a read-only /proc (oom_score_adj) and seccomp (prlimit of another process).
#[tokio::test]
async fn unprivileged_the_agent_is_out_of_reach_too() {
    require_sandboxes!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED unprivileged_the_agent_is_out_of_reach_too: the suite already runs unprivileged"
        );
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smcp")
        .tempdir_in("/tmp")
        .unwrap();
    // Unprivileged, sandbox code has the agent's own uid, and only a Landlock scope keeps its
    // signals from the agent: that scope is Landlock ABI 6 (Linux 6.12).
    // SAFETY: landlock_create_ruleset with LANDLOCK_CREATE_RULESET_VERSION only reports the ABI.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if abi < 6 {
        eprintln!(
            "SKIPPED unprivileged_the_agent_is_out_of_reach_too: needs Landlock ABI 6 (signal scoping, Linux 6.12); this kernel has {abi}"
        );
        return;
    }
    let (mut engine, client) = crate::common::unprivileged_engine(dir.path(), &[]).await;
    let id = create(&client).await;
    let out = sh(&client, &id, &format!("{AGENT_ATTACKS}\necho done")).await;
    let traced = py(&client, &id, TRACE_ATTACKS).await;
    let own = sh(&client, &id, "prlimit --nofile=64 sh -c 'ulimit -n'").await;
    let alive = sh(&client, &id, "echo alive").await;
    let _ = engine.kill();
    let _ = engine.wait();
    assert_eq!(
        out, "done\n",
        "sandbox code reached the unprivileged agent:\n{out}"
    );
    assert_eq!(traced, "refused refused\n", "ptrace, process_vm_readv");
    assert_eq!(own, "64\n", "a process may still change its own limits");
    assert_eq!(alive, "alive\n");
}

#[tokio::test]
async fn a_restarted_agent_loads_nothing_from_the_sandbox() {
    require_sandboxes!();
    if !std::path::Path::new("/usr/bin/gcc").exists() {
        if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
            panic!("gcc is required here (to build a preload library inside a sandbox)");
        }
        eprintln!("SKIPPED a_restarted_agent_loads_nothing_from_the_sandbox: needs gcc");
        return;
    }
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    // A library that marks every process it is loaded into, and a system-wide preload of it:
    // the classic way to take over whatever the dynamic loader starts next.
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/evil.c", "content":
            "#include <stdio.h>\n#include <unistd.h>\n\
             __attribute__((constructor)) static void grab(void) {\n\
               char p[64]; snprintf(p, sizeof p, \"/tmp/loaded-into-%s\", getpid() == 1 ? \"pid1\" : \"command\");\n\
               FILE *f = fopen(p, \"w\"); if (f) fclose(f); }\n"}),
    )
    .await;
    sh(
        &client,
        &id,
        "gcc -shared -fPIC -o /usr/lib/evil.so /root/evil.c && echo /usr/lib/evil.so > /etc/ld.so.preload",
    )
    .await;
    assert_eq!(
        sh(&client, &id, "true; ls /tmp/ | grep loaded-into").await,
        "loaded-into-command\n",
        "the preload works for the sandbox's own programs"
    );
    // The agent dies (as after an OOM kill); the next call starts a new one.
    let old = agent_pid(&engine, &id);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::SIGKILL).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let out = sh(
        &client,
        &id,
        "ls /tmp/ | grep loaded-into; head -c 0 /etc/ld.so.preload",
    )
    .await;
    assert_ne!(agent_pid(&engine, &id), old, "the agent was restarted");
    assert_eq!(
        out, "loaded-into-command\n",
        "the restarted agent (PID 1) must load nothing from the sandbox's filesystem"
    );
}

#[tokio::test]
async fn an_agent_that_stops_answering_is_stopped_and_restarted_from_outside() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "echo kept > /root/file").await;
    let pid = agent_pid(&engine, &id);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGSTOP).unwrap();
    let message = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo hi", "timeout_ms": 200}),
    )
    .await;
    assert!(message.contains("stopped answering"), "{message}");
    // Not trusted again: the next call runs under a fresh agent, on the same files.
    assert_eq!(sh(&client, &id, "cat /root/file").await, "kept\n");
    assert_ne!(agent_pid(&engine, &id), pid);
}

// ── 3. Nothing from inside a sandbox is buffered without a bound ───────────────────────────

/// Peak resident memory of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    proc_field(pid as i32, "status", "VmHWM:")
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_hijacked_agent_cannot_flood_the_engine() {
    require_sandboxes!();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = crate::common::TempData::new();
    let (mut engine, url) = crate::common::spawn_engine_process(&dir.data()).await;
    let backend = sandbox_mcp_server::backend::Backend::remote(
        &url,
        Some(sandbox_mcp_api::ApiKey::new(crate::common::KEY)),
    )
    .unwrap();
    let client = crate::common::mcp_for(backend, Default::default(), "all").await;
    let id = create(&client).await;
    sh(&client, &id, "echo warm").await;
    let before = peak_rss_kib(engine.id());

    // Whatever answers on the agent's socket is hostile: a frame that claims 20 MiB and delivers
    // it, or an error message of 8 MiB. The engine stops an agent that breaks the protocol and
    // starts a fresh one on the next call (which binds a new socket), so the hostile listener is
    // planted again before each call.
    let socket = dir.data().join("sandboxes").join(&id).join("agent.sock");
    let plant = |flood: bool| {
        let _ = std::fs::rename(&socket, socket.with_extension(format!("real.{flood}")));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut len = [0u8; 4];
                let _ = conn.read_exact(&mut len).await;
                let mut req = vec![0u8; u32::from_be_bytes(len) as usize];
                let _ = conn.read_exact(&mut req).await;
                let body = if flood {
                    vec![b'x'; 20 << 20]
                } else {
                    let message = "e".repeat(8 << 20);
                    serde_json::to_vec(&json!({"type": "error", "kind": "io", "message": message}))
                        .unwrap()
                };
                let _ = conn.write_all(&(body.len() as u32).to_be_bytes()).await;
                let _ = conn.write_all(&body).await;
            }
        })
    };
    for flood in [true, false, true, false] {
        // A genuine agent first (the engine restarts one after each hostile round), then the
        // hostile listener in its place.
        assert_eq!(sh(&client, &id, "echo genuine").await, "genuine\n");
        let hostile = plant(flood);
        let r = call(
            &client,
            "sandbox_exec",
            json!({"sandbox_id": id, "command": "true"}),
        )
        .await;
        hostile.abort();
        assert_eq!(r.is_error, Some(true));
        assert!(
            text(&r).len() < 8192,
            "an error of {} bytes reached the client",
            text(&r).len()
        );
    }
    // The hostile answers were not trusted: the next call runs under a genuine agent again.
    assert_eq!(sh(&client, &id, "echo genuine").await, "genuine\n");
    let grown = peak_rss_kib(engine.id()).saturating_sub(before);
    let _ = engine.kill();
    let _ = engine.wait();
    crate::common::kill_left_behind(&dir.data());
    assert!(
        grown < 16 * 1024,
        "the engine's peak memory grew by {grown} KiB reading a hostile agent"
    );
}

// ── 4. Kernel budgets are per sandbox ──────────────────────────────────────────────────────

/// Per-user kernel budgets can only be told apart by host ids, which exist only as root.
macro_rules! require_own_ids {
    () => {
        $crate::require_cgroups!();
        if !nix::unistd::geteuid().is_root() {
            eprintln!(
                "SKIPPED {}: needs root (per-sandbox host ids)",
                module_path!()
            );
            return;
        }
    };
}

/// Kills the sandbox that took a budget, and shows the budget comes back within seconds: a new
/// sandbox (which gets the freed uid range) runs `probe` and prints `expect`.
async fn kill_and_see_it_restored(client: &McpClient, taker: &str, probe: &str, expect: &str) {
    ok(client, "sandbox_kill", json!({"sandbox_id": taker})).await;
    let fresh = create(client).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = py(client, &fresh, probe).await;
        if out == expect {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the budget did not come back after the kill: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ok(client, "sandbox_kill", json!({"sandbox_id": fresh})).await;
}

#[tokio::test]
async fn inotify_instances_of_one_sandbox_leave_others_and_the_host_theirs() {
    require_own_ids!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (a, b) = (create(&client).await, create(&client).await);
    assert!(
        host_inotify_ok(),
        "the host has no inotify instance to spare before the test"
    );
    // Every instance the sandbox's id may have, and on them every watch it may add: 128
    // instances watching the same 1600 files are more watches than a user may hold.
    let held = hold(
        &client,
        &a,
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nfds = []\n\
         while len(fds) < 100000:\n    fd = libc.inotify_init1(0)\n    if fd < 0: break\n    fds.append(fd)\n\
         errno = ctypes.get_errno()\nos.makedirs('/tmp/w', exist_ok=True)\n\
         names = [f'/tmp/w/{i}'.encode() for i in range(1600)]\n\
         for n in names: open(n, 'w').close()\n\
         watches, werr = 0, 0\n\
         for fd in fds:\n    for n in names:\n        if libc.inotify_add_watch(fd, n, 2) < 0: werr = ctypes.get_errno(); break\n        watches += 1\n    if werr: break\n\
         open('/tmp/held', 'w').write(f'{len(fds)} {errno} {watches} {werr}')\ntime.sleep(600)\n",
    )
    .await;
    let fields: Vec<&str> = held.split(' ').collect();
    let [count, errno, watches, werr] = fields[..] else {
        panic!("{held}")
    };
    assert_eq!(
        errno, "24",
        "the sandbox ran into its own limit of instances (EMFILE): {held}"
    );
    assert!(count.parse::<u32>().unwrap() <= 128, "{held}");
    assert_eq!(
        werr, "28",
        "the sandbox ran into its own limit of watches (ENOSPC): {held}"
    );
    let max_watches: u64 = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(watches.parse::<u64>().unwrap() <= max_watches, "{held}");
    let probe = "import ctypes\nlibc = ctypes.CDLL(None)\nfd = libc.inotify_init1(0)\n\
        print(fd >= 0 and libc.inotify_add_watch(fd, b'/tmp', 2) >= 0)";
    assert_eq!(
        py(&client, &b, probe).await,
        "True\n",
        "another sandbox lost its inotify instances or watches"
    );
    assert!(host_inotify_ok(), "the host lost its inotify instances");
    // What it took comes back: a new sandbox gets 100 instances.
    let many = "import ctypes\nlibc = ctypes.CDLL(None)\n\
        print(all(libc.inotify_init1(0) >= 0 for _ in range(100)))";
    kill_and_see_it_restored(&client, &a, many, "True\n").await;
}

/// Runs Python on the host, as root outside any sandbox; its stdout (its stderr if it printed
/// nothing, so a failure says why).
fn host_py(code: &str) -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .output()
        .unwrap();
    match String::from_utf8_lossy(&out.stdout).into_owned() {
        s if s.is_empty() => String::from_utf8_lossy(&out.stderr).into_owned(),
        s => s,
    }
}

/// Whether a host process can make an inotify instance and add a watch.
fn host_inotify_ok() -> bool {
    // SAFETY: inotify_init1 returns a new descriptor (closed below) or -1.
    let fd = unsafe { libc::inotify_init1(0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: a watch on a NUL-terminated path, on the descriptor just made.
    let watched = unsafe { libc::inotify_add_watch(fd, c"/tmp".as_ptr(), libc::IN_MODIFY) } >= 0;
    // SAFETY: closing the descriptor just made.
    unsafe { libc::close(fd) };
    watched
}

const SIGQUEUE: &str = "import ctypes, os, signal, time\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
class sigval(ctypes.Union): _fields_ = [('i', ctypes.c_int), ('p', ctypes.c_void_p)]\n\
sig = signal.SIGRTMIN\nsignal.pthread_sigmask(signal.SIG_BLOCK, {sig})\n\
def queue(limit):\n    n = 0\n    while n < limit and libc.sigqueue(os.getpid(), sig, sigval(0)) == 0: n += 1\n    return n, ctypes.get_errno()\n";

#[tokio::test]
async fn pending_signals_of_one_sandbox_leave_others_and_the_host_theirs() {
    require_own_ids!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (a, b) = (create(&client).await, create(&client).await);
    let held = hold(
        &client,
        &a,
        &format!(
            "{SIGQUEUE}n, e = queue(10_000_000)\nopen('/tmp/held', 'w').write(f'{{n}} {{e}}')\ntime.sleep(600)\n"
        ),
    )
    .await;
    assert!(
        held.ends_with(" 11"),
        "the sandbox ran into its own limit (EAGAIN): {held}"
    );
    let probe = format!("{SIGQUEUE}print(queue(1)[0])");
    assert_eq!(
        py(&client, &b, &probe).await,
        "1\n",
        "another sandbox could not queue a signal"
    );
    assert_eq!(host_py(&probe), "1\n", "the host could not queue a signal");
    let n = held.split(' ').next().unwrap();
    kill_and_see_it_restored(
        &client,
        &a,
        &format!("{SIGQUEUE}print(queue({n})[0])"),
        &format!("{n}\n"),
    )
    .await;
}

#[tokio::test]
async fn ptys_are_shared_out_so_one_sandbox_cannot_take_them_all() {
    require_own_ids!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (a, b) = (create(&client).await, create(&client).await);
    let held = hold(
        &client,
        &a,
        "import os, time\nfds = []\nerr = 0\ntry:\n    while len(fds) < 100000: fds.append(os.openpty())\n\
         except OSError as e: err = e.errno\nopen('/tmp/held', 'w').write(f'{len(fds)} {err}')\ntime.sleep(600)\n",
    )
    .await;
    let (count, _) = held.split_once(' ').unwrap();
    use sandbox_mcp_linux::plan::{pty_pool, pty_share};
    let share = pty_share(pty_pool(), 100);
    assert!(
        count.parse::<u32>().unwrap() <= share,
        "one sandbox held {count} ptys; its share is {share}"
    );
    let other = py(&client, &b, "import os\nos.openpty()\nprint('ok')").await;
    assert_eq!(other, "ok\n", "another sandbox could not open a pty");
    assert!(
        nix::pty::openpty(None, None).is_ok(),
        "the host could not open a pty"
    );
    kill_and_see_it_restored(
        &client,
        &a,
        &format!("import os\nfds = [os.openpty() for _ in range({count})]\nprint(len(fds))"),
        &format!("{count}\n"),
    )
    .await;
}

/// A registry of its own in `dir`, where another engine's live sandbox (its data dir: `/`, which
/// exists) holds all of the host's ptys but `left`. Slots 1–5000 are taken too, so the test's
/// sandboxes get ranges far from those the host's registry hands other tests' engines meanwhile.
fn registry_with_ptys_left(dir: &std::path::Path, left: u32) -> std::path::PathBuf {
    let path = dir.join("uid-ranges");
    let pool = sandbox_mcp_linux::plan::pty_pool();
    let mut claims = format!("1 {} /\n", pool - left);
    for slot in 2..=5000 {
        claims.push_str(&format!("{slot} 0 /\n"));
    }
    std::fs::write(&path, claims).unwrap();
    path
}

/// A sandbox that would get no ptys (other engines' live sandboxes hold the host's whole pool)
/// is not made without them: the create fails, saying why, and takes nothing.
#[tokio::test]
async fn a_sandbox_is_not_made_without_ptys_when_the_pool_is_spent() {
    require_own_ids!();
    let registry = tempfile::tempdir().unwrap();
    let path = registry_with_ptys_left(registry.path(), 0);
    let before = std::fs::read_to_string(&path).unwrap();
    let engine = TestEngine::start_with(|c| c.uid_registry = path.clone()).await;
    let client = engine.mcp().await;
    let e = err(&client, "sandbox_create", json!({})).await;
    assert!(e.contains("ptys are all held"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        before,
        "nothing claimed"
    );
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"], json!([]), "{list}");
}

/// An engine whose data dir is deleted while its sandboxes live (here paused, as a clean stop
/// leaves them) used to leave them running forever, holding their uid ranges and their share of
/// the host's ptys, until new sandboxes got none. The next engine to claim a range reaps them.
#[tokio::test]
async fn sandboxes_whose_data_dir_is_gone_are_reaped_by_the_next_claim() {
    require_own_ids!();
    let registry = tempfile::tempdir().unwrap();
    let share = sandbox_mcp_linux::plan::pty_share(sandbox_mcp_linux::plan::pty_pool(), 100);
    // Room for exactly one sandbox's ptys: the orphan's.
    let path = registry_with_ptys_left(registry.path(), share);
    let first = TestEngine::start_with(|c| c.uid_registry = path.clone()).await;
    let client = first.mcp().await;
    let orphan = create(&client).await;
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": orphan, "command": "sleep 600", "background": true}),
    )
    .await;
    drop(client);
    let layout = sandbox_mcp_linux::cgroups::Layout::detect();
    let pids = layout.sandbox(&orphan).pids();
    assert!(pids.len() >= 2, "the agent and sleep: {pids:?}");
    // A clean stop leaves the sandbox paused, its processes alive; then the data dir goes.
    let dir = first.stop().await;
    let data = dir.path().join("data");
    let _ = nix::mount::umount2(&data.join("sandboxes"), nix::mount::MntFlags::MNT_DETACH);
    std::fs::remove_dir_all(&data).unwrap();
    let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    assert!(
        pids.iter().all(|p| alive(*p)),
        "orphans before the next claim"
    );
    // The next engine's first create reaps them, and gets the ptys they held.
    let second = TestEngine::start_with(|c| c.uid_registry = path.clone()).await;
    let client = second.mcp().await;
    let id = create(&client).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        pids.iter().all(|p| !alive(*p)),
        "orphans still alive: {pids:?}"
    );
    assert!(layout.sandbox(&orphan).pids().is_empty());
    let lines = std::fs::read_to_string(&path).unwrap();
    assert!(
        !lines.contains(&data.to_string_lossy().to_string()),
        "the vanished data dir's claim is gone: {lines}"
    );
    let out = py(&client, &id, "import os\nos.openpty()\nprint('opened')").await;
    assert_eq!(out, "opened\n");
}

#[tokio::test]
async fn fds_in_flight_of_one_sandbox_leave_other_sandboxes_theirs() {
    require_own_ids!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (a, b) = (create(&client).await, create(&client).await);
    let send = "import array, os, socket, time\nfd = os.open('/dev/null', os.O_RDONLY)\n\
        def flood(limit):\n    pairs, n = [], 0\n    try:\n        while n < limit:\n            s, r = socket.socketpair(); s.setblocking(False); pairs.append((s, r))\n\
        \x20           try:\n                while n < limit:\n                    s.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd] * 250))]); n += 250\n\
        \x20           except BlockingIOError: pass\n    except OSError as e: return n, e.errno, pairs\n    return n, 0, pairs\n";
    let held = hold(
        &client,
        &a,
        &format!("{send}n, e, keep = flood(50_000_000)\nopen('/tmp/held', 'w').write(f'{{n}} {{e}}')\ntime.sleep(600)\n"),
    )
    .await;
    assert!(
        held.ends_with(" 109"),
        "the sandbox ran into its own limit (ETOOMANYREFS): {held}"
    );
    let other = py(
        &client,
        &b,
        &format!("{send}n, e, _ = flood(250)\nprint(n, e)"),
    )
    .await;
    assert_eq!(
        other, "250 0\n",
        "another sandbox could not pass a descriptor"
    );
    assert_eq!(
        host_py(&format!("{send}n, e, _ = flood(250)\nprint(n, e)")),
        "250 0\n",
        "a host process could not pass a descriptor"
    );
    let n = held.split(' ').next().unwrap();
    kill_and_see_it_restored(
        &client,
        &a,
        &format!("{send}n, e, keep = flood({n})\nprint(n, e)"),
        &format!("{n} 0\n"),
    )
    .await;
}

// ── 5. Uid ranges are host-wide ────────────────────────────────────────────────────────────

#[tokio::test]
async fn two_engines_on_one_host_get_disjoint_uid_ranges() {
    require_own_ids!();
    use sandbox_mcp_linux::plan::{UID_BASE, UID_RANGE};
    let (one, two) = (TestEngine::start().await, TestEngine::start().await);
    let (c1, c2) = (one.mcp().await, two.mcp().await);
    let (a, b) = (create(&c1).await, create(&c2).await);
    let range = |engine: &TestEngine, id: &str| {
        let status = proc_field(agent_pid(engine, id), "status", "Uid:");
        let uid: u32 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
        (uid - UID_BASE) / UID_RANGE
    };
    let (ra, rb) = (range(&one, &a), range(&two, &b));
    assert_ne!(ra, rb, "two engines' sandboxes share a uid range");
    // The processes sandbox code runs are in their sandbox's own range too.
    sh(&c1, &a, "sleep 300 >/dev/null 2>&1 &").await;
    let cg = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&a);
    for pid in cg.pids() {
        let uid: u32 = proc_field(pid, "status", "Uid:")
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            (uid - UID_BASE) / UID_RANGE,
            ra,
            "pid {pid} runs outside its range"
        );
    }
}

/// The registry's claims of the engine on `data_dir`: the slots, each with its line.
fn claims_of(config: &sandbox_mcp_model::config::EngineConfig) -> Vec<String> {
    let owner = std::fs::canonicalize(config.data_dir.join("sandboxes")).unwrap();
    std::fs::read_to_string(&config.uid_registry)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&format!(" {}", owner.display())))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_sandbox_whose_cleanup_fails_keeps_its_uid_range() {
    require_own_ids!();
    let engine = TestEngine::start_with(|c| c.disk_limits = DiskLimits::Off).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "echo x > /root/pinned").await;
    let uid: u32 = proc_field(agent_pid(&engine, &id), "status", "Uid:")
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let slot = (uid - sandbox_mcp_linux::plan::UID_BASE) / sandbox_mcp_linux::plan::UID_RANGE;
    let sandbox = sandbox_dir(&engine, &id);
    drop(client);
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let config = sandbox_mcp_model::config::EngineConfig {
        disk_limits: DiskLimits::Off,
        ..config
    };
    sandbox_mcp_engine::state::Store::open(&config.state_db())
        .unwrap()
        .set_status(&id, sandbox_mcp_engine::state::Status::Killing)
        .unwrap();
    // An immutable file in its upper layer: not even root can delete it, so the cleanup after
    // the restart fails.
    // (Found afresh each time: a failed delete may have moved it up the tree.)
    let chattr = |flag: &str| {
        let found = std::process::Command::new("find")
            .arg(&sandbox)
            .args(["-name", "pinned"])
            .output()
            .unwrap();
        let pinned = String::from_utf8(found.stdout).unwrap().trim().to_string();
        assert!(!pinned.is_empty(), "the file is in the sandbox's directory");
        std::process::Command::new("chattr")
            .args([flag, &pinned])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        eprintln!(
            "SKIPPED a_sandbox_whose_cleanup_fails_keeps_its_uid_range: needs the immutable attribute (chattr +i) on /tmp's filesystem"
        );
        return;
    }
    let engine = TestEngine::start_on(dir, config.clone()).await;
    let kept = claims_of(&config);
    assert!(chattr("-i"));
    assert!(sandbox.exists(), "the cleanup could not finish");
    assert_eq!(
        kept,
        vec![slot.to_string()],
        "the range of a sandbox that may still hold files is not given back"
    );
    // Once the cleanup can finish (the next start), the range is released.
    let dir = engine.stop().await;
    let _engine = TestEngine::start_on(dir, config.clone()).await;
    assert!(!sandbox.exists());
    assert_eq!(claims_of(&config), Vec::<String>::new());
}

// ── 6. No file operation blocks on a special file, or stalls the agent ─────────────────────

/// `f`, which must finish within 20 s (a blocked agent never would).
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

#[tokio::test]
async fn special_files_never_block_a_file_tool() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(
        &client,
        &id,
        "mkfifo /root/fifo /root/fifo2 /dev/shm/fifo && echo a > /root/a && echo b > /root/b && \
         python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/root/sock')\" && \
         mkdir -p /tmp/sandbox-mcp/jobs && mkfifo /tmp/sandbox-mcp/jobs/job_1.log && echo made",
    )
    .await;
    for path in ["fifo", "/dev/zero", "/dev/null", "sock", "/proc/self/fd/0"] {
        let r = within("files_read", async {
            let r = call(
                &client,
                "sandbox_files_read",
                json!({"sandbox_id": id, "path": path}),
            )
            .await;
            json!({"error": r.is_error, "text": text(&r)})
        })
        .await;
        assert_eq!(r["error"], true, "{path}: {r}");
        assert!(
            r["text"].as_str().unwrap().contains("not a regular file"),
            "{path}: {r}"
        );
    }
    // Writing or moving onto a FIFO replaces it; moving a FIFO across filesystems is refused.
    within(
        "files_write",
        ok(
            &client,
            "sandbox_files_write",
            json!({"sandbox_id": id, "path": "fifo", "content": "w"}),
        ),
    )
    .await;
    within(
        "files_move",
        ok(
            &client,
            "sandbox_files_move",
            json!({"sandbox_id": id, "from": "a", "to": "fifo2"}),
        ),
    )
    .await;
    within(
        "files_move",
        ok(
            &client,
            "sandbox_files_move",
            json!({"sandbox_id": id, "from": "b", "to": "/dev/shm/fifo"}),
        ),
    )
    .await;
    sh(&client, &id, "mkfifo /root/fifo3").await;
    let refused = within("files_move", async {
        json!(
            err(
                &client,
                "sandbox_files_move",
                json!({"sandbox_id": id, "from": "fifo3", "to": "/dev/shm/x"})
            )
            .await
        )
    })
    .await;
    assert!(
        refused.as_str().unwrap().contains("not a regular file"),
        "{refused}"
    );
    assert_eq!(
        sh(&client, &id, "cat /root/fifo /root/fifo2 /dev/shm/fifo").await,
        "wa\nb\n"
    );
    let zip = within(
        "download_dir",
        ok(
            &client,
            "sandbox_files_download_dir",
            json!({"sandbox_id": id, "path": "/root"}),
        ),
    )
    .await;
    let skipped = zip["skipped"].to_string();
    assert!(
        skipped.contains("fifo3") && skipped.contains("sock"),
        "{zip}"
    );
    within(
        "files_list",
        ok(
            &client,
            "sandbox_files_list",
            json!({"sandbox_id": id, "path": "/root"}),
        ),
    )
    .await;
    within(
        "files_delete",
        ok(
            &client,
            "sandbox_files_delete",
            json!({"sandbox_id": id, "path": "fifo3"}),
        ),
    )
    .await;
    // The agent's own job log was a planted FIFO: it is replaced, and the job works.
    let job = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo from-the-job", "background": true}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = within(
        "job_status",
        ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": id, "job_id": job["job_id"]}),
        ),
    )
    .await;
    assert_eq!(status["output"], "from-the-job\n", "{status}");
    assert_eq!(
        sh(&client, &id, "echo still-serving").await,
        "still-serving\n"
    );
}

#[tokio::test]
async fn a_slow_file_operation_does_not_hold_up_other_calls() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    // Incompressible data to zip: the zip takes a while, and runs on a file thread.
    sh(
        &client,
        &id,
        "mkdir /root/big && for i in 1 2 3 4 5 6 7 8; do head -c 1000000 /dev/urandom > /root/big/$i; done",
    )
    .await;
    let zip = async {
        let r = ok(
            &client,
            "sandbox_files_download_dir",
            json!({"sandbox_id": id, "path": "/root/big"}),
        )
        .await;
        (Instant::now(), r["files"].clone())
    };
    let execs = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for _ in 0..5 {
            assert_eq!(sh(&client, &id, "echo quick").await, "quick\n");
        }
        Instant::now()
    };
    let ((zip_done, files), execs_done) = tokio::join!(zip, execs);
    assert_eq!(files, 8);
    assert!(
        execs_done < zip_done,
        "five quick execs waited for the zip to finish"
    );
}

// ── 8. The sandbox store's mount ────────────────────────────────────────────────────────────

/// After `kill -9` the store stays mounted (nothing could unmount it); the next engine uses that
/// mount, and no second loop device is attached to the image.
#[tokio::test]
async fn a_store_left_mounted_by_kill_9_is_reused() {
    require_cgroups!();
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let (mut first, url) = crate::common::spawn_engine_process(&data).await;
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let create = |url: String| {
        let http = http.clone();
        async move {
            let r = http
                .post(format!("{url}/v1/sandboxes"))
                .bearer_auth(crate::common::KEY)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
        }
    };
    create(url).await;
    let image = data.join("sandboxes.img");
    let enforced = image.exists();
    let _ = first.kill();
    let _ = first.wait();
    let (mut second, url) = crate::common::spawn_engine_process(&data).await;
    create(url).await;
    let devices = crate::common::loop_devices_of(&image);
    let _ = second.kill();
    let _ = second.wait();
    crate::common::kill_left_behind(&data);
    if enforced {
        assert_eq!(devices.len(), 1, "one image, one loop device");
    }
}

/// A clean exit with a paused sandbox: its frozen processes keep the store's loop device
/// attached after the engine lets go of the mount, and the next engine must mount that device
/// again (one image, one device) and find the sandbox's files.
#[tokio::test]
async fn a_store_still_attached_after_a_clean_exit_is_mounted_again() {
    require_cgroups!();
    use crate::common::{api, loop_devices_of, mounted};
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let (mut first, url) = crate::common::spawn_engine_process(&data).await;
    let (status, made) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{made}");
    let exec = format!("/v1/sandboxes/{}/exec", made["id"].as_str().unwrap());
    let (status, _) = api(
        &url,
        "POST",
        &exec,
        Some(json!({"command": "echo kept > /root/f"})),
    )
    .await;
    assert_eq!(status, 200);
    let image = data.join("sandboxes.img");
    if !image.exists() {
        let _ = first.kill();
        let _ = first.wait();
        crate::common::kill_left_behind(&data);
        if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
            panic!("the btrfs store (loop devices, mkfs.btrfs) is required here");
        }
        eprintln!(
            "SKIPPED a_store_still_attached_after_a_clean_exit_is_mounted_again: needs the btrfs store"
        );
        return;
    }
    // SIGTERM: a clean exit, which pauses the sandbox and lets go of the store's mount.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    assert!(first.wait().unwrap().success());
    assert!(
        !mounted(&data.join("sandboxes")),
        "the engine let go of the store's mount at exit"
    );
    assert_eq!(
        loop_devices_of(&image).len(),
        1,
        "the paused sandbox's processes keep the device"
    );
    let (mut second, url) = crate::common::spawn_engine_process(&data).await;
    let (_, out) = api(&url, "POST", &exec, Some(json!({"command": "cat /root/f"}))).await;
    let (status, _) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let devices = loop_devices_of(&image);
    let _ = second.kill();
    let _ = second.wait();
    crate::common::kill_left_behind(&data);
    assert_eq!(out["stdout"], "kept\n", "{out}");
    assert_eq!(status, 201);
    assert_eq!(devices.len(), 1, "one image, one loop device");
}
