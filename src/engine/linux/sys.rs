//! Thin wrappers for the syscalls the launcher needs and nix does not wrap. Each is one syscall;
//! callers own the policy.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

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
    let tree = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns_fd as u64,
    };
    let empty = cstr("")?;
    // SAFETY: `tree` is a detached mount fd; `attr` is a valid mount_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tree)
}

/// `pivot_root(".", ".")`: the caller must have chdir'ed into the new root.
pub fn pivot_root_here() -> io::Result<()> {
    let dot = cstr(".")?;
    // SAFETY: valid NUL-terminated paths.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
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
pub fn exec_fd(fd: RawFd, argv: &[&str], env: &[(String, String)]) -> io::Error {
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
    let mut argv_p: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    env_p.push(std::ptr::null());
    let empty = c"";
    // SAFETY: argv and envp are NULL-terminated arrays of valid C strings that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            empty.as_ptr(),
            argv_p.as_ptr(),
            env_p.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    io::Error::last_os_error()
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

/// Empties the inheritable capability set. Together with the bounding set, it decides what an
/// exec'd root process gets, so it must not carry anything the bounding set dropped.
pub fn clear_inheritable_caps() -> io::Result<()> {
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data structs, as the ABI requires.
    unsafe {
        if libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        for d in &mut data {
            d.inheritable = 0;
        }
        if libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
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
