//! Thin wrappers for the syscalls that the launcher and the agent need and nix does not wrap
//! (each is one syscall; callers own the policy), and the few sequences of nix calls whose order
//! or check every caller must get right (ids, filesystem ids, a filled memfd, exec by
//! descriptor). Shared by both sides, so it belongs to neither.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::AtFlags;
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::unistd::{Gid, Uid, setfsgid, setfsuid, setresgid, setresuid};

/// Milliseconds since the Unix epoch (the clock the engine's records and the agent's jobs share).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3` with fork semantics (no new stack): returns 0 in the child, its pid in the parent.
///
/// # Safety
/// Like `fork`: the calling process must be single-threaded, so the child cannot inherit a lock
/// held by another thread.
pub unsafe fn clone3_fork(flags: u64) -> io::Result<i32> {
    let args = CloneArgs {
        flags,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid clone_args of the size passed; single-threadedness is the
    // caller's contract.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as i32)
    }
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached, read-only, nosuid, nodev copy of the mount at `path` whose file ownership is
/// shifted through `userns_fd`'s id map: host root's files appear owned by the sandbox's root,
/// so overlay copy-up works inside the sandbox while the host files stay untouched.
pub fn idmapped_tree(path: &str, userns_fd: RawFd) -> io::Result<OwnedFd> {
    idmapped(path, userns_fd, MOUNT_ATTR_RDONLY)
}

/// A detached, writable, nosuid, nodev copy of the mount at `path` whose file ownership is
/// shifted through `userns_fd`'s id map (a forked sandbox's own directory: see
/// [`userns_with_map`]).
pub fn idmapped_tree_rw(path: &str, userns_fd: RawFd) -> io::Result<OwnedFd> {
    idmapped(path, userns_fd, 0)
}

/// A detached, nosuid, nodev copy of the mount at `path` (a named volume's directory), its
/// ownership shifted through `userns_fd`'s id map, read-only if asked.
pub fn idmapped_volume(path: &str, userns_fd: RawFd, read_only: bool) -> io::Result<OwnedFd> {
    idmapped(
        path,
        userns_fd,
        if read_only { MOUNT_ATTR_RDONLY } else { 0 },
    )
}

/// Attaches a copy of the mount at `source` onto the directory `target` (a descriptor, so the
/// place was found without following a symlink), nosuid and nodev, read-only if asked. The
/// copy keeps the source's id mapping and its read-only flag.
pub fn attach_copy(source: &str, target: &OwnedFd, read_only: bool) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x0000_0040;
    let tree = clone_tree(source)?;
    let ro = if read_only { MOUNT_ATTR_RDONLY } else { 0 };
    set_attrs(&tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | ro, 0)?;
    let empty = cstr("")?;
    // SAFETY: two valid descriptors and empty paths, as the flags say.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            empty.as_ptr(),
            std::os::fd::AsRawFd::as_raw_fd(target),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn idmapped(path: &str, userns_fd: RawFd, extra: u64) -> io::Result<OwnedFd> {
    let tree = clone_tree(path)?;
    set_attrs(
        &tree,
        MOUNT_ATTR_IDMAP | extra | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        userns_fd as u64,
    )?;
    Ok(tree)
}

/// A detached copy of the mount at `path` (`open_tree` with `OPEN_TREE_CLONE`).
fn clone_tree(path: &str) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: valid NUL-terminated path; flags are constants.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sets `attr_set` (with the user namespace `userns_fd` for `MOUNT_ATTR_IDMAP`) on a detached
/// mount.
fn set_attrs(tree: &OwnedFd, attr_set: u64, userns_fd: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd,
    };
    let empty = cstr("")?;
    // SAFETY: `tree` is a detached mount fd; `attr` is a valid mount_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(tree),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A user namespace whose uid and gid maps are both `map` (`inside outside count`), for an
/// id-mapped mount: the kernel takes the map from a namespace, and a namespace needs a process
/// to be made in. That process (a child that does nothing but wait) is gone when this returns;
/// the descriptor keeps the namespace. The caller must be single-threaded (it forks) and
/// privileged in the host's user namespace (it writes a map of host ids).
pub fn userns_with_map(map: &str) -> io::Result<OwnedFd> {
    let (hold, release) = nix::unistd::pipe()?;
    // SAFETY: the caller is single-threaded; the child only reads from a pipe and exits.
    let pid = unsafe { clone3_fork(libc::CLONE_NEWUSER as u64) }?;
    if pid == 0 {
        drop(release);
        let mut byte = [0u8; 1];
        // Returns at EOF, once the parent holds the namespace.
        let _ = nix::unistd::read(&hold, &mut byte);
        // SAFETY: leaving the forked child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    drop(hold);
    let made = (|| {
        std::fs::write(format!("/proc/{pid}/uid_map"), map)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), map)?;
        std::fs::File::open(format!("/proc/{pid}/ns/user")).map(OwnedFd::from)
    })();
    drop(release);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    made
}

/// Marks every descriptor from `first` up close-on-exec.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: plain syscall on integer arguments.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)`: runs the program open at `fd`, which need not
/// be reachable from the current root. Returns only on failure.
pub fn exec_fd(fd: impl AsFd, argv: &[&str], env: &[(String, String)]) -> io::Error {
    let Ok(argv_c) = argv.iter().map(|a| cstr(a)).collect::<io::Result<Vec<_>>>() else {
        return io::Error::new(io::ErrorKind::InvalidInput, "argument contains a NUL byte");
    };
    let Ok(env_c) = env
        .iter()
        .map(|(k, v)| cstr(&format!("{k}={v}")))
        .collect::<io::Result<Vec<_>>>()
    else {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            "environment contains a NUL byte",
        );
    };
    match nix::unistd::execveat(fd, c"", &argv_c, &env_c, AtFlags::AT_EMPTY_PATH) {
        Ok(never) => match never {},
        Err(e) => e.into(),
    }
}

/// Brings the loopback interface up (a new network namespace starts with it down).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() with constant arguments.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: we own the new descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the flags member of a valid ifreq.
    unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Capability numbers (linux/capability.h), as far as this crate uses them.
pub mod cap {
    pub const CHOWN: u32 = 0;
    pub const DAC_OVERRIDE: u32 = 1;
    pub const DAC_READ_SEARCH: u32 = 2;
    pub const FOWNER: u32 = 3;
    pub const FSETID: u32 = 4;
    pub const KILL: u32 = 5;
    pub const SETGID: u32 = 6;
    pub const SETUID: u32 = 7;
    pub const SETPCAP: u32 = 8;
    pub const NET_BIND_SERVICE: u32 = 10;
    pub const SYS_CHROOT: u32 = 18;
    pub const SYS_PTRACE: u32 = 19;
    pub const SETFCAP: u32 = 31;
}

/// A process's three capability sets, one bit per capability.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CapSets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// The calling thread's capability sets. Allocates nothing (safe between fork and exec).
pub fn caps_get() -> io::Result<CapSets> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a v3 header and two data structs, as the ABI requires.
    if unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok(CapSets {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

/// Sets the calling thread's capability sets. Allocates nothing (safe between fork and exec).
pub fn caps_set(sets: CapSets) -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let half = |v: u64, i: usize| (v >> (32 * i)) as u32;
    let data: [CapData; 2] = std::array::from_fn(|i| CapData {
        effective: half(sets.effective, i),
        permitted: half(sets.permitted, i),
        inheritable: half(sets.inheritable, i),
    });
    // SAFETY: capset with a v3 header and two data structs, as the ABI requires.
    if unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bit mask of a list of capability numbers.
pub fn cap_mask(caps: &[u32]) -> u64 {
    caps.iter().fold(0, |m, c| m | (1u64 << c))
}

/// Empties the inheritable capability set. Together with the bounding set, it decides what an
/// exec'd root process gets, so it must not carry anything the bounding set dropped.
pub fn clear_inheritable_caps() -> io::Result<()> {
    let mut sets = caps_get()?;
    sets.inheritable = 0;
    caps_set(sets)
}

/// Drops every capability not in `keep` from the bounding set (so no exec can regain it), and
/// clears the ambient set. Allocates nothing (safe between fork and exec).
pub fn limit_bounding_set(keep: u64) -> io::Result<()> {
    for cap in 0..64u32 {
        if keep & (1 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if ret != 0 {
            let e = io::Error::last_os_error();
            // Numbers past the kernel's last capability do not exist: nothing to drop.
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(e);
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    Ok(())
}

/// Makes every permitted capability ambient, so an exec keeps them although the process is not
/// root in its user namespace.
pub fn keep_caps_across_exec() -> io::Result<()> {
    let mut sets = caps_get()?;
    sets.inheritable = sets.permitted;
    caps_set(sets)?;
    for cap in 0..64u32 {
        if sets.permitted & (1 << cap) == 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments.
        let ret = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets real, effective and saved uid *and* gid (gids first, while still privileged).
pub fn set_ids(real: u32, effective: u32, saved: u32) -> io::Result<()> {
    let uids = || setresuid(Uid::from(real), Uid::from(effective), Uid::from(saved));
    let gids = || setresgid(Gid::from(real), Gid::from(effective), Gid::from(saved));
    // Going to root, the uid must change first to regain the right to change gids; leaving
    // root, the gids must change while that right is still held.
    if effective == 0 {
        uids()?;
        gids()?;
    } else {
        gids()?;
        uids()?;
    }
    Ok(())
}

/// The filesystem uid and gid of the calling thread (and of threads it creates later): the ids
/// files are created with and permissions are checked against.
pub fn set_fs_ids(id: u32) -> io::Result<()> {
    setfsgid(Gid::from(id));
    setfsuid(Uid::from(id));
    // setfs*id report no error, only the id before the call: asking for an id no process can
    // have (-1) changes nothing and reads back the one in force.
    let now_uid = setfsuid(Uid::from(u32::MAX));
    let now_gid = setfsgid(Gid::from(u32::MAX));
    if now_uid.as_raw() != id || now_gid.as_raw() != id {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// An anonymous in-memory file holding `data`, positioned at its start (close-on-exec: a child
/// that should inherit it gets a copy at a fixed number).
pub fn memfd_with(name: &CStr, data: &[u8]) -> io::Result<OwnedFd> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, data)?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}

/// Attaches the detached mount `tree` at `target` (in the caller's current mount namespace).
pub fn move_mount_to(tree: &OwnedFd, target: &str) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
    let empty = cstr("")?;
    let target = cstr(target)?;
    // SAFETY: valid descriptor and NUL-terminated paths.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            std::os::fd::AsRawFd::as_raw_fd(tree),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Locks `m`, taking the data of a poisoned lock as it is: a panic elsewhere must not take
/// every later caller down with it (the data stays consistent at each unlock).
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
