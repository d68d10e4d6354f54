//! Kernel budgets are per sandbox: what one sandbox takes of a per-user kernel budget (inotify
//! instances, pending signals, POSIX message queues, ptys, file descriptors in flight) leaves
//! other sandboxes and the host theirs, and comes back when it is killed.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{McpClient, TestEngine, create, err, ok};

use super::{hold, py};

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

/// POSIX message queues of 10 × 8 KiB until the id's `RLIMIT_MSGQUEUE` (819 200 bytes by
/// default) is spent (EMFILE); `(made, errno)`. Names are unique to the process.
const MQUEUE: &str = r#"import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
class attr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long), ('msgsize', ctypes.c_long), ('curmsgs', ctypes.c_long), ('pad', ctypes.c_long * 4)]
def take(limit):
    n, a = 0, attr(0, 10, 8192, 0)
    while n < limit:
        if libc.mq_open(f'/q{os.getpid()}-{n}'.encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
            return n, ctypes.get_errno()
        n += 1
    return n, 0
"#;

#[tokio::test]
async fn message_queues_of_one_sandbox_leave_others_and_the_host_theirs() {
    require_own_ids!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (a, b) = (create(&client).await, create(&client).await);
    let held = hold(
        &client,
        &a,
        &format!(
            "{MQUEUE}n, e = take(100_000)\nopen('/tmp/held', 'w').write(f'{{n}} {{e}}')\ntime.sleep(600)\n"
        ),
    )
    .await;
    // It runs into its own limit (EMFILE), or may make none at all (EACCES: Landlock gives
    // commands no right on the queues' filesystem, as here).
    assert!(
        held.ends_with(" 24") || held == "0 13",
        "the sandbox ran into its own limit (EMFILE) or was refused (EACCES): {held}"
    );
    // Another sandbox gets what the first one got at its first try (a queue, or the same
    // refusal), not a budget spent; the host makes one. The probes remove what they made.
    let probe = format!(
        "{MQUEUE}n, e = take(1)\nlibc.mq_unlink(f'/q{{os.getpid()}}-0'.encode())\nprint(n, e)"
    );
    let first_try = if held == "0 13" { "0 13\n" } else { "1 0\n" };
    assert_eq!(
        py(&client, &b, &probe).await,
        first_try,
        "another sandbox lost its message queues"
    );
    assert_eq!(
        host_py(&probe),
        "1 0\n",
        "the host could not make a message queue"
    );
    let n = held.split(' ').next().unwrap();
    if n != "0" {
        kill_and_see_it_restored(
            &client,
            &a,
            &format!("{MQUEUE}print(take({n})[0])"),
            &format!("{n}\n"),
        )
        .await;
    }
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

/// However few sandboxes an engine allows, each gets at most a hundredth of the host's ptys:
/// before, an engine started with `--max-sandboxes 2` gave each of its two sandboxes half the
/// pool, and while they lived every other engine's creates failed (a test of the quota, run
/// beside others, did exactly that to them).
#[tokio::test]
async fn an_engine_allowing_few_sandboxes_leaves_the_hosts_ptys_to_the_others() {
    require_own_ids!();
    let registry = tempfile::tempdir().unwrap();
    let pool = sandbox_mcp_linux::plan::pty_pool();
    let path = registry_with_ptys_left(registry.path(), pool);
    let small = TestEngine::start_with(|c| {
        c.uid_registry = path.clone();
        c.max_sandboxes = 2;
    })
    .await;
    let small_client = small.mcp().await;
    for _ in 0..2 {
        create(&small_client).await;
    }
    let owner = std::fs::canonicalize(small.data_dir().join("sandboxes")).unwrap();
    let held: u32 = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(&*owner.to_string_lossy()))
        .map(|l| l.split(' ').nth(1).unwrap().parse::<u32>().unwrap())
        .sum();
    assert!(
        held <= 2 * pool / 100,
        "two sandboxes of an engine allowing two hold {held} of the host's {pool} ptys"
    );
    let other = TestEngine::start_with(|c| c.uid_registry = path.clone()).await;
    let client = other.mcp().await;
    let id = create(&client).await;
    let out = py(&client, &id, "import os\nos.openpty()\nprint('ok')").await;
    assert_eq!(
        out, "ok\n",
        "a sandbox of another engine could not open a pty"
    );
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
