//! The inside half of building a sandbox, run by the agent itself right after the launcher exec'd
//! it. Security-critical; keep it small.
//!
//! The exec happened while the host's root was still in place, so the agent's code and every
//! library it maps came from the host, never from the sandbox's filesystem. From here, in order:
//! read the plan; enter the sandbox's directory; mount the overlays, a fresh /proc and a minimal
//! /dev; pivot into the new root and detach the host's; bring loopback up; then restrict the agent
//! (its own capabilities, no_new_privs, seccomp) and prepare what every command it starts gets:
//! the sandbox's root identity, the sandbox's capabilities, and a Landlock domain the agent itself
//! is outside of.
//!
//! As root, the agent runs as a host id that has no id inside the sandbox (see
//! [`LaunchPlan::agent_id`]). It creates files as the sandbox's root (its filesystem id is 0
//! there), but its process is owned by an id no capability inside the sandbox applies to: sandbox
//! code cannot signal, trace, prlimit, renice or read the `/proc` of the agent, nor change its
//! `oom_score_adj`.

use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::launcher::{AGENT_DIR_FD, AGENT_PLAN_FD, MAX_PLAN};
use super::plan::LaunchPlan;
use super::seccomp;
use super::step::{BuildError, ctx};
use sandbox_mcp_sys::syscalls::{self as sys, cap};

/// Capabilities sandbox code keeps (inside its user namespace only). Roughly Docker's default set
/// minus NET_RAW and MKNOD: enough for package managers and chown/chmod, nothing that mounts,
/// traces, loads modules, raises limits or administers the network.
pub const SANDBOX_CAPS: [u32; 11] = [
    cap::CHOWN,
    cap::DAC_OVERRIDE,
    cap::FOWNER,
    cap::FSETID,
    cap::KILL,
    cap::SETGID,
    cap::SETUID,
    cap::SETPCAP,
    cap::NET_BIND_SERVICE,
    cap::SYS_CHROOT,
    cap::SETFCAP,
];

/// Capabilities the agent keeps once the sandbox is built: file operations as the sandbox's root
/// (DAC and ownership), starting commands as the sandbox's root (SETUID, SETGID, SETPCAP to shed
/// the rest), killing them (KILL) and finding the processes that hold a command's pipes
/// (SYS_PTRACE, for reading other users' /proc/<pid>/fd; the ptrace call itself stays forbidden by
/// seccomp). None of these applies outside the sandbox's user namespace.
const AGENT_CAPS: [u32; 10] = [
    cap::CHOWN,
    cap::DAC_OVERRIDE,
    cap::DAC_READ_SEARCH,
    cap::FOWNER,
    cap::FSETID,
    cap::KILL,
    cap::SETGID,
    cap::SETUID,
    cap::SETPCAP,
    cap::SYS_PTRACE,
];

/// What the agent takes from building the sandbox.
pub struct Entered {
    /// The sandbox's environment variables (every command starts with them).
    pub env: Vec<(String, String)>,
    /// What each command the agent starts is restricted to.
    pub commands: CommandPolicy,
    /// Unprivileged: the engine's egress sockets (TCP listener, DNS), or why there are none.
    pub egress: Option<Result<[OwnedFd; 2], String>>,
    /// Working directory of commands that name none (the template's).
    pub workdir: Option<String>,
    /// uid and gid commands run as (the template's user; root when `None`).
    pub user: Option<(u32, u32)>,
}

/// Applied to every command between fork and exec: become the sandbox's root with the sandbox's
/// capabilities, and enter a Landlock domain the agent is not part of.
pub struct CommandPolicy {
    /// Capabilities a command may hold (bit mask).
    pub caps: u64,
    /// A prepared Landlock ruleset (none when the kernel lacks Landlock).
    pub landlock: Option<OwnedFd>,
}

/// Builds the sandbox around the calling process (the freshly exec'd agent) and restricts it.
pub fn enter() -> Result<Entered, BuildError> {
    // SAFETY: the launcher passes these descriptors at fixed numbers, for the agent alone.
    let (plan_fd, dir) = unsafe {
        (
            OwnedFd::from_raw_fd(AGENT_PLAN_FD),
            OwnedFd::from_raw_fd(AGENT_DIR_FD),
        )
    };
    let mut bytes = Vec::new();
    ctx(
        fs::File::from(plan_fd)
            .take(MAX_PLAN + 1)
            .read_to_end(&mut bytes),
        "read plan",
    )?;
    let plan: LaunchPlan = ctx(serde_json::from_slice(&bytes), "parse plan")?;

    // The sandbox's directory, by descriptor: the agent's own id may be unable to reach it by
    // path. Closed right away, so no command can ever inherit a handle on the host's filesystem.
    ctx(nix::unistd::fchdir(&dir), "enter the sandbox's directory")?;
    drop(dir);
    if plan.privileged {
        // Everything created from here on (mounts' roots, /dev, copied-up files, files the agent
        // writes for the model) belongs to the sandbox's root, never to the agent's own id.
        ctx(sys::set_fs_ids(0), "act as the sandbox's root on files")?;
    }
    setup(&plan)?;
    // Unprivileged, the agent steers its namespace's traffic to the engine itself (see
    // `netns::configure_unprivileged`); where the kernel refuses, the sandbox keeps loopback only
    // and the engine is told why.
    let egress = (!plan.privileged)
        .then(|| super::netns::configure_unprivileged().map_err(|e| e.to_string()));
    let commands = restrict_agent(&plan)?;
    Ok(Entered {
        env: plan.env,
        commands,
        egress,
        workdir: plan.workdir,
        user: plan.user,
    })
}

/// Mounts, pivot, hostname, network: everything that shapes what the sandbox sees.
fn setup(plan: &LaunchPlan) -> Result<(), BuildError> {
    let base = plan.rootfs.parent().ok_or_else(|| {
        BuildError::Refused("the sandbox's rootfs has no parent directory".into())
    })?;
    let inside = |p: &Path| -> Result<PathBuf, BuildError> {
        p.strip_prefix(base).map(Path::to_path_buf).map_err(|_| {
            BuildError::Refused(format!(
                "{} is outside the sandbox's directory",
                p.display()
            ))
        })
    };
    let rootfs = inside(&plan.rootfs)?;
    let rootfs = rootfs.as_path();
    for layer in &plan.layers {
        // As root the lower layers are the id-mapped copies the parent attached; otherwise the
        // host directories themselves (whose files then stay read-only inside the sandbox).
        let lowers = if plan.privileged {
            layer
                .staging
                .iter()
                .map(|p| inside(p))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            layer.lowers.clone()
        };
        let lower = lowers
            .iter()
            .map(|p| {
                let s = p.display().to_string();
                // `:` separates lower directories and `,` mount options: such a path would be
                // read as something else.
                if s.contains([':', ',']) {
                    Err(BuildError::Refused(format!(
                        "{s}: an overlay layer's path may not contain ':' or ','"
                    )))
                } else {
                    Ok(s)
                }
            })
            .collect::<Result<Vec<_>, _>>()?
            .join(":");
        // Below the root, the mount point is found (or made) without following a symlink:
        // the root's upper is the sandbox's to write, and a link there must not move a mount.
        let point = (layer.target != "/")
            .then(|| mount_point(rootfs, &layer.target))
            .transpose()?;
        let target = match &point {
            None => rootfs.to_path_buf(),
            Some(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        };
        let data = format!(
            "lowerdir={lower},upperdir={},workdir={},userxattr",
            inside(&layer.upper)?.display(),
            inside(&layer.work)?.display()
        );
        ctx(
            mount(
                Some("overlay"),
                &target,
                Some("overlay"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(data.as_str()),
            ),
            &format!("mount overlay on {}", layer.target),
        )?;
    }

    for v in &plan.volumes {
        // As root, the id-mapped copy the launcher attached; otherwise the host directory.
        let source = if plan.privileged {
            inside(&v.staging)?
        } else {
            v.source.clone()
        };
        let point = mount_point(rootfs, &v.target)?;
        ctx(
            sys::attach_copy(&source.to_string_lossy(), &point, v.read_only),
            &format!("mount the volume at {}", v.target),
        )?;
    }

    let at = |p: &str| rootfs.join(p);
    let mut proc_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if plan.proc_readonly {
        proc_flags |= MsFlags::MS_RDONLY;
    }
    ctx(
        mount(
            Some("proc"),
            &at("proc"),
            Some("proc"),
            proc_flags,
            None::<&str>,
        ),
        "mount /proc",
    )?;
    setup_dev(&at("dev"), plan.shm_bytes, plan.pty_max)?;
    if let Some(id) = &plan.boot_id {
        own_boot_id(&at("dev"), id, &at("proc/sys/kernel/random/boot_id"))?;
    }

    // Enter the new root; detach the host's.
    ctx(nix::unistd::chdir(rootfs), "enter new root")?;
    ctx(nix::unistd::pivot_root(".", "."), "pivot_root")?;
    ctx(umount2(".", MntFlags::MNT_DETACH), "detach host root")?;
    ctx(nix::unistd::chdir("/"), "chdir /")?;
    ctx(
        mount(
            None::<&str>,
            "/dev",
            None::<&str>,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NOEXEC,
            None::<&str>,
        ),
        "make /dev read-only",
    )?;

    ctx(nix::unistd::sethostname(&plan.hostname), "set hostname")?;
    if !plan.privileged {
        // As root the launcher configured the network namespace (which the sandbox's user
        // namespace does not own, so this would be refused).
        ctx(sys::loopback_up(), "bring loopback up")?;
    }
    let no_core = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    ctx(no_core, "disable core dumps")?;
    Ok(())
}

/// Shows `id` (the sandbox's own boot id) read-only over the kernel's `boot_id` at `target`:
/// written to a file in the sandbox's new /dev (memory the sandbox's /dev is charged for; never
/// its disk, whose quota the sandbox may have spent), bound there, and unlinked, so the file is
/// reachable only as the boot id. Sandbox code holds no capability to undo a mount, so the host's
/// id stays hidden.
fn own_boot_id(dev: &Path, id: &str, target: &Path) -> Result<(), BuildError> {
    let what = "show the sandbox's own boot id";
    if id.len() != 37
        || !id.ends_with('\n')
        || !id.as_bytes()[..36]
            .iter()
            .all(|&b| b.is_ascii_hexdigit() || b == b'-')
    {
        return Err(BuildError::Refused(format!("{id:?} is not a boot id")));
    }
    let file = dev.join(".boot_id");
    ctx(fs::write(&file, id), what)?;
    ctx(
        mount(
            Some(&file),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ),
        what,
    )?;
    ctx(
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            None::<&str>,
        ),
        what,
    )?;
    ctx(fs::remove_file(&file), what)
}

/// The directory `target` (absolute) below `rootfs`, each missing name made, none followed if it
/// is a symlink: a path the sandbox could have bent with a link is refused.
fn mount_point(rootfs: &Path, target: &str) -> Result<OwnedFd, BuildError> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::{Mode, fstat, mkdirat};
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut dir = ctx(open(rootfs, flags, Mode::empty()), "open the new root")?;
    for name in target.split('/').filter(|n| !n.is_empty()) {
        if name == "." || name == ".." {
            return Err(BuildError::Refused(format!(
                "mount point {target} holds `.` or `..`"
            )));
        }
        let next = match openat(&dir, name, flags, Mode::empty()) {
            Err(nix::errno::Errno::ENOENT) => {
                ctx(
                    mkdirat(&dir, name, Mode::from_bits_truncate(0o755)),
                    &format!("make mount point {target}"),
                )?;
                openat(&dir, name, flags, Mode::empty())
            }
            other => other,
        };
        let next = next.map_err(|e| {
            BuildError::Refused(format!(
                "mount point {target}: {name} is a symlink or not a directory ({e}); mount points must be real directories"
            ))
        })?;
        let st = ctx(fstat(&next), &format!("inspect mount point {target}"))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(BuildError::Refused(format!(
                "mount point {target}: {name} is not a directory"
            )));
        }
        dir = next;
    }
    Ok(dir)
}

/// A minimal /dev: a small tmpfs with the harmless host devices bind-mounted in, a private
/// devpts holding at most the sandbox's share of the host's ptys, and a size-limited /dev/shm.
fn setup_dev(dev: &Path, shm_bytes: u64, pty_max: u32) -> Result<(), BuildError> {
    ctx(
        mount(
            Some("tmpfs"),
            dev,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=755,size=65536,nr_inodes=64"),
        ),
        "mount /dev",
    )?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(name);
        ctx(fs::File::create(&target), &format!("create /dev/{name}"))?;
        ctx(
            mount(
                Some(&Path::new("/dev").join(name)),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            ),
            &format!("bind /dev/{name}"),
        )?;
    }
    let pts = dev.join("pts");
    ctx(fs::create_dir(&pts), "create /dev/pts")?;
    // No share of the host's ptys (the pool is spent): no devpts at all, so /dev/ptmx leads
    // nowhere. `max=0` would not do: the kernel reads it as no limit of the instance's own.
    if pty_max > 0 {
        ctx(
            mount(
                Some("devpts"),
                &pts,
                Some("devpts"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some(format!("newinstance,ptmxmode=0666,mode=0620,max={pty_max}").as_str()),
            ),
            "mount /dev/pts",
        )?;
    }
    let shm = dev.join("shm");
    ctx(fs::create_dir(&shm), "create /dev/shm")?;
    ctx(
        mount(
            Some("tmpfs"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("mode=1777,size={shm_bytes}").as_str()),
        ),
        "mount /dev/shm",
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ctx(
            std::os::unix::fs::symlink(target, dev.join(link)),
            &format!("link /dev/{link}"),
        )?;
    }
    Ok(())
}

/// The agent's own restrictions, in the only order that works: shed capabilities (keeping
/// SETPCAP until the bounding set is cut), no_new_privs (required by seccomp and Landlock), the
/// Landlock ruleset for commands (built now, entered by each command), then seccomp.
fn restrict_agent(plan: &LaunchPlan) -> Result<CommandPolicy, BuildError> {
    let agent = sys::cap_mask(&AGENT_CAPS);
    let sandbox = sys::cap_mask(&SANDBOX_CAPS);
    ctx(
        sys::limit_bounding_set(agent | sandbox),
        "limit capabilities",
    )?;
    ctx(
        sys::caps_set(sys::CapSets {
            effective: agent,
            permitted: agent,
            inheritable: 0,
        }),
        "drop capabilities",
    )?;
    // As root the agent stays dumpable: its /proc files then belong to its own id, which no
    // capability inside the sandbox covers. Unprivileged, sandbox code has the agent's id, and
    // only non-dumpability keeps it from reading the agent's /proc (Landlock does too).
    ctx(
        nix::sys::prctl::set_dumpable(plan.privileged),
        "set dumpable",
    )?;
    ctx(nix::sys::prctl::set_no_new_privs(), "set no_new_privs")?;
    // Kernels without Landlock still get everything else.
    let landlock = command_ruleset(&[Path::new("/")]).ok().flatten();
    ctx(seccomp::install(), "install the seccomp filter")?;
    Ok(CommandPolicy {
        caps: sandbox,
        landlock,
    })
}

/// The Landlock ruleset each command enters: everything below `roots` (the sandbox's `/`) stays
/// usable except creating device nodes, and a command cannot signal a process outside its
/// domain — the agent above all. (Landlock also confines ptrace-style access, the agent's /proc
/// included, to the domain.) TCP is not restricted: servers on the sandbox's own loopback must
/// keep working; the network namespace cuts it off from the host. Abstract unix sockets are not
/// scoped either: the only ones in a sandbox's network namespace are its own processes' and,
/// while a checkpoint runs, CRIU's (whose code inside the dumped process must reach it; every
/// other process of the sandbox is stopped meanwhile). A restore enters the same ruleset, with
/// the host's `/` beside the target's root, so the restored tree gets the same domain.
pub fn command_ruleset(
    roots: &[&Path],
) -> Result<Option<OwnedFd>, Box<dyn std::error::Error + Send + Sync>> {
    const ABI_TARGET: ABI = ABI::V6;
    let all = AccessFs::from_all(ABI_TARGET);
    let allowed = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?
        .scope(Scope::Signal)?
        .create()?;
    for root in roots {
        ruleset = ruleset.add_rule(PathBeneath::new(PathFd::new(root)?, allowed))?;
    }
    Ok(ruleset.into())
}
