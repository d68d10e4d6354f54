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
mod probe;
mod proto;
mod rpc;

pub use probe::{Criu, INSTALL_HINT, probe};

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use probe::with_own_run;
use sandbox_mcp_sys::syscalls as sys;

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

/// What a dump's caller does at two moments of it, CRIU waiting for each (see [`rpc`]).
pub struct Moments<'a> {
    /// Every process of the tree is seized and frozen; CRIU's code enters none before this
    /// returns.
    pub frozen: &'a mut dyn FnMut(),
    /// CRIU's code has left every process of the tree (still frozen).
    pub cured: &'a mut dyn FnMut(),
}

/// Dumps one tree, leaving its processes stopped (the caller continues them once the files
/// are copied, so both are one moment's).
pub fn dump(criu: &Criu, d: &Dump<'_>, at: Moments<'_>) -> io::Result<()> {
    let pidns = std::fs::metadata(format!("/proc/{}/ns/pid", d.agent))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))?;
    let mut external: Vec<String> = vec!["mnt[]".into(), format!("pid[{pidns}]:pidns")];
    external.extend(
        d.pipes
            .iter()
            .filter(|i| **i != 0)
            .map(|ino| format!("pipe[{ino}]:pipe{ino}")),
    );
    // Marked external, these mounts are left as they are; the restore joins a mount namespace
    // that has its own at the same places:
    // - named volumes: binds of a directory below the engine's store, which CRIU cannot place
    //   in the tree's mounts by itself;
    // - the sandbox's tmpfs mounts (`/dev`, `/dev/shm`): CRIU would otherwise archive each with
    //   a `tar | gzip` it starts while the tree is stopped, for images no restore reads (the
    //   target's tmpfs mounts are its own; a tree holding a file of them is not carried).
    let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", d.root))?;
    for (i, point) in external_mounts(&info).iter().enumerate() {
        external.push(format!("mnt[{point}]:mount{i}"));
    }
    let netns = open(&format!("/proc/{}/ns/net", d.agent))?;
    // Reading another user namespace's rlimits takes CAP_SYS_RESOURCE over it. Where root lacks
    // it (some container hosts), CRIU runs as the tree's own uid, keeping every other capability
    // (`--unprivileged` is what CRIU calls that).
    let as_owner = !has_sys_resource();
    let owner = if as_owner {
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
    let images = d
        .dir
        .to_str()
        .ok_or_else(|| io::Error::other("the checkpoint's directory is not UTF-8"))?;
    let request = rpc::dump_request(&rpc::DumpOptions {
        pid: d.root,
        images_dir: images,
        external: &external,
        unprivileged: as_owner,
    });
    let (ours, theirs) = rpc::seqpacket_pair()?;
    let (netns_fd, theirs_fd) = (netns.as_raw_fd(), theirs.as_raw_fd());
    let mut cmd = criu_command(criu, &["swrk".into(), theirs_fd.to_string()], as_owner);
    // SAFETY: runs between fork and exec; only system calls on integers and open descriptors.
    unsafe {
        cmd.pre_exec(move || {
            // CRIU's end of the socket, at the number its command line names, survives the exec.
            if libc::fcntl(theirs_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            setns(netns_fd, libc::CLONE_NEWNET)?;
            if let Some(uid) = owner {
                become_keeping_caps(uid)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop((theirs, netns));
    let answer = rpc::converse(&ours, &request, at);
    drop(ours);
    let out = child.wait_with_output()?;
    match answer {
        Ok(Some(true)) if out.status.success() => Ok(()),
        Ok(_) => Err(failure(d.dir, "dump", &out)),
        Err(_) if !out.status.success() => Err(failure(d.dir, "dump", &out)),
        Err(e) => Err(io::Error::other(format!("criu dump: {e}"))),
    }
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
        "--restore-detached".into(),
        // Stopped until the caller continues it, once every tree is back (see `live_restore`).
        "--leave-stopped".into(),
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
    let mut cmd = criu_command(criu, &args, true);
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

/// CRIU with `args`, a clean environment and its kernel cache: run `--unprivileged`, it finds
/// the cache through `XDG_RUNTIME_DIR`; run as root, in a `/run` of its own.
fn criu_command(criu: &Criu, args: &[String], unprivileged: bool) -> Command {
    let mut cmd = Command::new(&criu.path);
    cmd.args(args)
        .args(unprivileged.then_some("--unprivileged"))
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match (unprivileged, &criu.cache, &criu.root_cache) {
        (true, Some(dir), _) => {
            cmd.env("XDG_RUNTIME_DIR", dir);
        }
        (false, _, Some(dir)) => with_own_run(&mut cmd, dir),
        _ => {}
    }
    cmd
}

/// Runs CRIU to its end; a failure carries CRIU's own last errors (see [`failure`]).
fn run(mut cmd: Command, dir: &Path, what: &str) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(failure(dir, what, &out))
}

/// A failed run of CRIU, said with its last errors: from its log, else its standard error.
fn failure(dir: &Path, what: &str, out: &std::process::Output) -> io::Error {
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
    io::Error::other(format!("criu {what} failed: {said}"))
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
