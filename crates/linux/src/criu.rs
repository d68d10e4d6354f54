//! Live state: checkpoint a sandbox's process trees and restore them into another sandbox (or
//! the same one, restarted) with CRIU, run as a separate program (it is GPL; never linked).
//!
//! A tree (a code context's interpreter, a background job) is dumped from the host by its root's
//! pid, with the sandbox's pid namespace marked external and its pipes to the agent left out
//! (the agent of the target makes new ones, handed to the restore with `--inherit-fd`). The
//! restore then runs in the target sandbox's cgroups, network and cgroup namespaces, joins its
//! user, mount, IPC and UTS namespaces, and forks the tree into its pid namespace: the restored
//! processes are the target's, with its uid range and limits, and share nothing with the source.
//!
//! What a restore keeps: memory, registers, open files (by path, in the target's copy of the
//! files), pipes and unix sockets within the tree, listening sockets, the seccomp filter,
//! `no_new_privs`, capabilities and ids (as the target's user namespace maps them). What CRIU
//! does not restore — the Landlock domain — the restore re-creates: CRIU runs inside the same
//! ruleset commands enter, so the restored tree inherits a domain that cannot signal or trace
//! anything outside it. Established TCP connections cannot be cloned (their peer is not): the
//! restored sockets are closed, so a client sees its connection end and reconnects, and a server
//! keeps listening.

pub mod images;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sandbox_mcp_sys::syscalls as sys;

/// How to get CRIU where it is missing, for errors and the health answer.
pub const INSTALL_HINT: &str = "install CRIU 4.0 or later (packaged by Debian 13, Ubuntu 25.04, Fedora and Arch; or built from https://criu.org) and restart the engine, or name its path with --criu";

/// A CRIU that passed its own `criu check`.
#[derive(Debug, Clone)]
pub struct Criu {
    pub path: PathBuf,
    pub version: String,
    /// Where CRIU run with `--unprivileged` (every restore) keeps what it learnt of the kernel
    /// ([`kernel_cache`]); `None`: it probes the kernel again each run.
    pub cache: Option<PathBuf>,
    /// Where CRIU run as root (dumps, and the `criu check` above) keeps it: mounted on `/run`
    /// for CRIU alone ([`with_own_run`]); a directory of its own, since what CRIU learns as
    /// root is not what it learns unprivileged.
    pub root_cache: Option<PathBuf>,
}

/// Directories of the engine's own on a tmpfs (`/dev/shm`), for CRIU's kernel-feature cache:
/// one for its unprivileged runs, and `root` in it for its runs as root. CRIU keeps that cache
/// only on a tmpfs (it must not outlive a reboot): as root in `/run`, and with `--unprivileged`
/// in `$XDG_RUNTIME_DIR`, which the engine's clean environment lacks. Without them every
/// restore probed the kernel anew (about 7 ms of each run here), and every dump on a host whose
/// `/run` is no tmpfs (most containers, this one) about 30 ms, most of it the `iptables`,
/// `ip6tables` and `nft` runs CRIU starts to learn what it can lock — while the sandbox's other
/// processes are stopped. Each directory is made 0700; one that is not a directory of this
/// uid's alone (made by another user first, a symlink) is not used, and CRIU probes as before.
fn kernel_cache() -> (Option<PathBuf>, Option<PathBuf>) {
    let uid = nix::unistd::geteuid().as_raw();
    let Some(dir) = own_dir(
        PathBuf::from(format!("/dev/shm/sandbox-mcp-criu-{uid}")),
        uid,
    ) else {
        return (None, None);
    };
    let root = own_dir(dir.join("root"), uid);
    (Some(dir), root)
}

/// `dir`, made 0700 if missing, if it is a directory (not a symlink) of `uid`'s alone.
fn own_dir(dir: PathBuf, uid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    (meta.is_dir() && meta.uid() == uid && meta.mode() & 0o777 == 0o700).then_some(dir)
}

/// Finds CRIU (the given path, else `criu` on PATH or in the usual sbin directories), checks
/// its version (4.0 or later: 3.x fails on current kernels' vDSO) and runs `criu check` once.
/// The error says what is missing and how to get it.
pub fn probe(explicit: Option<&Path>) -> Result<Criu, String> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => find_on_path().ok_or_else(|| format!("criu is not installed: {INSTALL_HINT}"))?,
    };
    let out = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}; {INSTALL_HINT}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("{} does not report a CRIU version", path.display()))?;
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 4 {
        return Err(format!(
            "criu {version} at {} is too old (it fails on current kernels); {INSTALL_HINT}",
            path.display()
        ));
    }
    let (cache, root_cache) = kernel_cache();
    check(&path, root_cache.as_deref())?;
    Ok(Criu {
        path,
        version,
        cache,
        root_cache,
    })
}

/// Runs `criu check` (as root: in a `/run` of `run` when given, where it leaves its kernel
/// cache for the dumps to come); the error says why CRIU cannot work here.
fn check(path: &Path, run: Option<&Path>) -> Result<(), String> {
    let mut cmd = Command::new(path);
    cmd.arg("check").stdin(Stdio::null());
    if let Some(dir) = run {
        with_own_run(&mut cmd, dir);
    }
    let check = cmd
        .output()
        .map_err(|e| format!("cannot run {} check: {e}", path.display()))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    if !check.status.success() || !said.contains("Looks good") {
        let last = said
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(format!(
            "`{} check` fails on this host ({last}); processes cannot be checkpointed here",
            path.display()
        ));
    }
    Ok(())
}

/// Runs `cmd` in a mount namespace of its own whose `/run` is `dir`, every other mount the
/// host's: CRIU run as root keeps its kernel cache in `/run` only, and only if that is a tmpfs
/// ([`kernel_cache`]). The host's mounts are made slaves there first, so nothing mounted in
/// that namespace reaches the host, while an unmount on the host still reaches it. Where the
/// namespace cannot be made (no CAP_SYS_ADMIN), CRIU runs as before and probes the kernel.
fn with_own_run(cmd: &mut Command, dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(dir) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: runs between fork and exec; only system calls on strings made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let (none, data) = (std::ptr::null(), std::ptr::null());
            if libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_SLAVE,
                    data,
                ) == 0
            {
                libc::mount(dir.as_ptr(), c"/run".as_ptr(), none, libc::MS_BIND, data);
            }
            Ok(())
        });
    }
}

fn find_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("criu"))
        .find(|p| p.is_file())
}

/// What to dump: one tree of a running sandbox.
pub struct Dump<'a> {
    /// The sandbox's agent, host pid (its namespaces are the tree's).
    pub agent: i32,
    /// The tree's root, host pid.
    pub root: i32,
    /// Inodes of the agent's pipes the tree holds (left out of the dump).
    pub pipes: &'a [u64],
    /// A new, empty directory only the engine can read.
    pub dir: &'a Path,
}

/// Dumps one tree, leaving its processes stopped (the caller continues them once the files
/// are copied, so both are one moment's).
pub fn dump(criu: &Criu, d: &Dump<'_>) -> io::Result<()> {
    let pidns = std::fs::metadata(format!("/proc/{}/ns/pid", d.agent))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))?;
    let mut args: Vec<String> = vec![
        "dump".into(),
        "-t".into(),
        d.root.to_string(),
        "-D".into(),
        d.dir.display().to_string(),
        "-o".into(),
        "criu.log".into(),
        "-v2".into(),
        "--leave-stopped".into(),
        // Established TCP connections are dumped (the network is locked meanwhile) so the tree
        // can be; the restore closes them (below): a peer outside cannot be cloned.
        "--tcp-established".into(),
        "--manage-cgroups=ignore".into(),
        "--external".into(),
        "mnt[]".into(),
        "--external".into(),
        format!("pid[{pidns}]:pidns"),
    ];
    for ino in d.pipes.iter().filter(|i| **i != 0) {
        args.push("--external".into());
        args.push(format!("pipe[{ino}]:pipe{ino}"));
    }
    // Marked external, these mounts are left as they are; the restore joins a mount namespace
    // that has its own at the same places:
    // - named volumes: binds of a directory below the engine's store, which CRIU cannot place
    //   in the tree's mounts by itself;
    // - the sandbox's tmpfs mounts (`/dev`, `/dev/shm`): CRIU would otherwise archive each with
    //   a `tar | gzip` it starts while the tree is stopped, for images no restore reads (the
    //   target's tmpfs mounts are its own; a tree holding a file of them is not carried).
    let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", d.root))?;
    for (i, point) in external_mounts(&info).iter().enumerate() {
        args.push("--external".into());
        args.push(format!("mnt[{point}]:mount{i}"));
    }
    let netns = open(&format!("/proc/{}/ns/net", d.agent))?;
    // Reading another user namespace's rlimits takes CAP_SYS_RESOURCE over it. Where root lacks
    // it (some container hosts), CRIU runs as the tree's own uid, keeping every other capability
    // (`--unprivileged` is what CRIU calls that).
    let as_owner = !has_sys_resource();
    let owner = if as_owner {
        args.push("--unprivileged".into());
        let meta = std::fs::metadata(format!("/proc/{}", d.root))?;
        let (uid, gid) = (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta),
        );
        std::os::unix::fs::chown(d.dir, Some(uid), Some(gid))?;
        Some(uid)
    } else {
        None
    };
    let netns_fd = netns.as_raw_fd();
    let mut cmd = criu_command(criu, &args);
    // SAFETY: runs between fork and exec; only system calls on integers and open descriptors.
    unsafe {
        cmd.pre_exec(move || {
            setns(netns_fd, libc::CLONE_NEWNET)?;
            if let Some(uid) = owner {
                become_keeping_caps(uid)?;
            }
            Ok(())
        });
    }
    if let (None, Some(dir)) = (owner, &criu.root_cache) {
        with_own_run(&mut cmd, dir);
    }
    run(cmd, d.dir, "dump")
}

/// The mount points of a tree's `mountinfo` its dump marks external (see [`dump`]): binds of
/// a directory (named volumes) and tmpfs mounts, not the device nodes bound from the host.
fn external_mounts(mountinfo: &str) -> Vec<String> {
    sandbox_mcp_sys::mounts::mounts(mountinfo)
        .filter(|m| m.fstype != "devtmpfs" && (m.root != "/" || m.fstype == "tmpfs"))
        .map(|m| m.point.to_string())
        .collect()
}

/// What to restore, and where.
pub struct Restore<'a> {
    /// The target sandbox's agent, host pid.
    pub agent: i32,
    /// The target's `cgroup.procs` files: the restored tree joins its cgroups.
    pub cgroup_procs: &'a [PathBuf],
    /// The dump, and its root's pid as the sandbox sees it.
    pub dir: &'a Path,
    pub root_pid: i32,
    /// New pipes for the ones the tree held, by their old inode (the process's ends).
    pub pipes: Vec<(u64, OwnedFd)>,
}

/// Restores one dumped tree into the target sandbox, inside the Landlock domain commands get.
pub fn restore(criu: &Criu, r: Restore<'_>) -> io::Result<()> {
    let ns = |kind: &str| format!("/proc/{}/ns/{kind}", r.agent);
    let pidns = open(&ns("pid"))?;
    let netns = open(&ns("net"))?;
    let cgroupns = open(&ns("cgroup"))?;
    let procs = r
        .cgroup_procs
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .map(OwnedFd::from)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let ruleset = crate::inside::command_ruleset(&[
        Path::new("/"),
        Path::new(&format!("/proc/{}/root", r.agent)),
    ])
    .map_err(|e| io::Error::other(format!("cannot prepare the Landlock ruleset: {e}")))?;
    // Descriptors the restore inherits, at fixed numbers above anything CRIU opens first.
    let mut keep: Vec<(RawFd, RawFd)> = vec![(pidns.as_raw_fd(), 200)];
    let mut args: Vec<String> = vec![
        "restore".into(),
        "-D".into(),
        r.dir.display().to_string(),
        "-o".into(),
        "criu.log".into(),
        "-v2".into(),
        "--unprivileged".into(),
        "--restore-detached".into(),
        "--tcp-close".into(),
        "--manage-cgroups=ignore".into(),
        "--inherit-fd".into(),
        "fd[200]:pidns".into(),
    ];
    for (i, (ino, fd)) in r.pipes.iter().enumerate() {
        let at = 201 + i as RawFd;
        keep.push((fd.as_raw_fd(), at));
        args.push("--inherit-fd".into());
        args.push(format!("fd[{at}]:pipe:[{ino}]"));
    }
    // By descriptor: inside the Landlock domain, the target agent's /proc is out of reach.
    let joined = ["user", "mnt", "ipc", "uts"]
        .iter()
        .map(|kind| open(&ns(kind)).map(|fd| (*kind, fd)))
        .collect::<io::Result<Vec<_>>>()?;
    for (i, (kind, fd)) in joined.iter().enumerate() {
        let at = 190 + i as RawFd;
        keep.push((fd.as_raw_fd(), at));
        args.push("--join-ns".into());
        args.push(format!("{kind}:/proc/self/fd/{at}"));
    }
    let (netns_fd, cgroupns_fd) = (netns.as_raw_fd(), cgroupns.as_raw_fd());
    let procs_fds: Vec<RawFd> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let landlock = ruleset.as_ref().map(|f| f.as_raw_fd());
    let mut cmd = criu_command(criu, &args);
    // SAFETY: runs between fork and exec; only system calls on integers and open descriptors
    // prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &procs_fds {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            setns(netns_fd, libc::CLONE_NEWNET)?;
            setns(cgroupns_fd, libc::CLONE_NEWCGROUP)?;
            for (from, to) in &keep {
                if libc::dup2(*from, *to) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(fd) = landlock
                && libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) < 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run(cmd, r.dir, "restore");
    drop((pidns, netns, cgroupns, procs, ruleset, r.pipes, joined));
    out
}

fn criu_command(criu: &Criu, args: &[String]) -> Command {
    let mut cmd = Command::new(&criu.path);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(dir) = &criu.cache {
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
    cmd
}

/// Runs CRIU to its end; a failure carries CRIU's own last errors (from its log).
fn run(mut cmd: Command, dir: &Path, what: &str) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    let log = std::fs::read_to_string(dir.join("criu.log")).unwrap_or_default();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Error"))
        .map(|l| l.split_once("): ").map_or(l, |(_, m)| m))
        .filter(|l| !l.contains("rlimit") && !l.contains("FAILED"))
        .take(3)
        .collect();
    let said = if errors.is_empty() {
        let text = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .take(3)
            .collect();
        lines.join("; ")
    } else {
        errors.join("; ")
    };
    Err(io::Error::other(format!("criu {what} failed: {said}")))
}

fn open(path: &str) -> io::Result<OwnedFd> {
    std::fs::File::open(path).map(OwnedFd::from)
}

fn setns(fd: RawFd, kind: libc::c_int) -> io::Result<()> {
    // SAFETY: setns on a namespace descriptor we hold.
    if unsafe { libc::setns(fd, kind) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes `uid` (and the same gid) for real, effective and saved ids, keeping every capability
/// across the exec. Between fork and exec: system calls only.
fn become_keeping_caps(uid: u32) -> io::Result<()> {
    // SAFETY: prctl and setgroups on integer arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0
            || libc::setgroups(0, std::ptr::null()) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    sys::set_ids(uid, uid, uid)?;
    let mut sets = sys::caps_get()?;
    sets.effective = sets.permitted;
    sys::caps_set(sets)?;
    sys::keep_caps_across_exec()
}

fn has_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    sys::caps_get().is_ok_and(|s| s.effective & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Host pids of a process and all its descendants (through `/proc/<pid>/task/*/children`).
pub fn tree_pids(root: i32) -> Vec<i32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() && all.len() < 4096 {
        let pid = all[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                all.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    all
}

/// Whether `pid` is `root`'s descendant now, by its parents: a child the tree forks is its
/// from the moment it exists, whether or not a walk of the tree saw it.
pub fn descends_from(pid: i32, root: i32) -> bool {
    let mut at = pid;
    // Bounded, should a recycled pid ever make a loop of parents.
    for _ in 0..4096 {
        match crate::procs::stat_field(at, 1) {
            Some(parent) if parent as i32 == root => return true,
            Some(parent) if parent > 1 => at = parent as i32,
            _ => return false,
        }
    }
    false
}

/// The pid a process has inside its own (innermost) pid namespace.
pub fn inner_pid(host: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use super::*;

    #[test]
    fn the_kernel_cache_is_a_directory_of_the_engines_alone() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let base = tempfile::tempdir().unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let fresh = base.path().join("fresh");
        assert_eq!(own_dir(fresh.clone(), uid), Some(fresh.clone()));
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            own_dir(fresh.clone(), uid),
            Some(fresh.clone()),
            "made before"
        );
        // One that others may enter, a symlink (even to a good one), or someone else's: unused.
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(own_dir(open, uid), None);
        let link = base.path().join("link");
        symlink(&fresh, &link).unwrap();
        assert_eq!(own_dir(link, uid), None);
        assert_eq!(own_dir(fresh.clone(), uid + 1), None, "another uid's");
        let file = base.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(own_dir(file, uid), None);
    }

    /// CRIU run as root leaves its kernel cache in the directory given as its `/run`, even where
    /// the host's `/run` is no tmpfs, and the host never sees that directory mounted. Skips
    /// without root or a working CRIU; fails so in CI.
    #[test]
    fn criu_as_root_keeps_its_kernel_cache_in_a_run_of_its_own() {
        let criu = match probe(None) {
            Ok(c) if nix::unistd::geteuid().is_root() => c,
            other => {
                let why = other.err().unwrap_or_else(|| "not root".into());
                assert!(
                    std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
                    "CRIU as root is required here (.ci/run builds it): {why}"
                );
                eprintln!("SKIPPED: CRIU's kernel cache needs root and CRIU: {why}");
                return;
            }
        };
        let run = tempfile::tempdir_in("/dev/shm").unwrap();
        let name = run
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let mounted = || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(&name)
        };
        check(&criu.path, Some(run.path())).unwrap();
        assert!(
            run.path().join("criu.kdat").is_file(),
            "criu check left no kernel cache in its /run"
        );
        assert!(!mounted(), "the host sees CRIU's /run mounted");
    }

    #[test]
    fn volumes_and_tmpfs_mounts_are_external_and_device_nodes_are_not() {
        // A sandbox's mounts as its processes see them (uid and sizes shortened).
        let info = "\
416 415 0:129 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
421 416 0:130 / /dev ro,nosuid,noexec,relatime - tmpfs tmpfs rw,size=64k,mode=755
422 421 0:6 /null /dev/null rw,relatime - devtmpfs devtmpfs rw,mode=755
429 421 0:132 / /dev/shm rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=262144k
430 420 0:130 /.boot_id//deleted /proc/sys/kernel/random/boot_id ro,relatime - tmpfs tmpfs rw,size=64k
431 416 254:0 /store/volumes/v /data rw,relatime - ext4 /dev/vda rw
432 416 0:140 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
";
        assert_eq!(
            external_mounts(info),
            [
                "/dev",
                "/dev/shm",
                "/proc/sys/kernel/random/boot_id",
                "/data"
            ]
        );
    }

    #[test]
    fn a_child_is_its_tree_s_from_the_moment_it_exists() {
        let mut sh = Command::new("sh")
            .args(["-c", "sleep 100 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let (root, child) = (sh.id() as i32, line.trim().parse::<i32>().unwrap());
        let me = std::process::id() as i32;
        assert!(descends_from(child, root));
        assert!(descends_from(child, me), "a grandchild is the tree's too");
        assert!(!descends_from(root, child));
        assert!(!descends_from(me, root));
        assert!(
            !descends_from(i32::MAX, root),
            "a pid that is gone is no one's"
        );
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
        sh.wait().unwrap();
    }
}
