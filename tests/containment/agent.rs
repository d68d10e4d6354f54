//! The agent is out of reach of the code it runs: code in the sandbox cannot signal, trace, limit
//! or reconfigure it (as root or not), a restarted agent loads nothing from the sandbox, and one
//! that stops answering is stopped and restarted from outside.

use serde_json::json;

use crate::common::{TestEngine, create, err, ok, sh};
use crate::{require_cgroups, require_sandboxes};

use super::{proc_field, py};

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
    let pid = engine.agent_pid(&id);
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
    let (engine, client) = crate::common::unprivileged_engine(dir.path(), &[]).await;
    let id = create(&client).await;
    let out = sh(&client, &id, &format!("{AGENT_ATTACKS}\necho done")).await;
    let traced = py(&client, &id, TRACE_ATTACKS).await;
    let own = sh(&client, &id, "prlimit --nofile=64 sh -c 'ulimit -n'").await;
    let alive = sh(&client, &id, "echo alive").await;
    drop(engine);
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
    let old = engine.crash_agent(&id);
    let out = sh(
        &client,
        &id,
        "ls /tmp/ | grep loaded-into; head -c 0 /etc/ld.so.preload",
    )
    .await;
    let agent = engine.agent_pid(&id);
    assert_ne!(agent, old, "the agent was restarted");
    assert_eq!(
        out, "loaded-into-command\n",
        "the restarted agent (PID 1) must load nothing from the sandbox's filesystem"
    );
    // Read from the host, which a constructor inside the agent could not fake or fail to mark
    // (the marker file above needs a write the agent's ids may not be allowed).
    let maps = std::fs::read_to_string(format!("/proc/{agent}/maps")).unwrap();
    assert!(
        !maps.contains("evil.so"),
        "the restarted agent mapped the sandbox's library:\n{maps}"
    );
}

#[tokio::test]
async fn an_agent_that_stops_answering_is_stopped_and_restarted_from_outside() {
    require_cgroups!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "echo kept > /root/file").await;
    let pid = engine.agent_pid(&id);
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
    assert_ne!(engine.agent_pid(&id), pid);
}
