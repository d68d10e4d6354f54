//! The seccomp filter every sandbox process runs under.
//!
//! A deny list on top of the namespaces and dropped capabilities: it removes kernel attack
//! surface a sandbox never needs (module loading, kexec, bpf, keyrings, perf, userfaultfd,
//! io_uring), anything that could reshape the mount tree after the launcher built it, ptrace and
//! cross-process memory access, new user namespaces (the usual first step of a kernel exploit),
//! terminal input injection (TIOCSTI/TIOCLINUX), and changing another process's resource limits
//! (`prlimit` on a pid: unprivileged, sandbox code shares the agent's uid, and that would let it
//! starve the agent of descriptors). Denied calls fail with EPERM, so programs see
//! an ordinary permission error. `clone3` fails with ENOSYS instead: its flags live in memory that
//! seccomp cannot inspect, and ENOSYS makes libc fall back to `clone`, whose flags it can.
//!
//! The other ABIs of the same kernel: a 32-bit call (`int 0x80`, another audit arch) kills the
//! process, as every filter checks the arch first; an x32 call (the x86-64 arch, its number with
//! bit 30 set, where the kernel has x32) fails with EPERM whatever it is, since the deny list
//! matches numbers and would not see it.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, Result, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// Syscalls denied outright.
fn denied() -> Vec<i64> {
    let mut list = vec![
        // Reshaping mounts.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        // Other processes' memory.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        // Kernel attack surface and host-wide state.
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_setns,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_fanotify_init,
    ];
    #[cfg(target_arch = "x86_64")]
    list.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_uselib,
        libc::SYS_lookup_dcookie,
    ]);
    list
}

fn arch() -> Result<TargetArch> {
    Ok(TargetArch::try_from(std::env::consts::ARCH)?)
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition> {
    Ok(SeccompCondition::new(arg, len, op, value)?)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule> {
    Ok(SeccompRule::new(conditions)?)
}

/// The programs to install, in order: the EPERM deny list, `clone3` → ENOSYS, and on x86-64 any
/// x32 call → EPERM.
pub fn programs() -> Result<Vec<BpfProgram>> {
    let arch = arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        denied().into_iter().map(|nr| (nr, vec![])).collect();

    let new_user = libc::CLONE_NEWUSER as u64;
    // clone(flags, ...) and unshare(flags): deny when CLONE_NEWUSER is set.
    for call in [libc::SYS_clone, libc::SYS_unshare] {
        rules.insert(
            call,
            vec![rule(vec![cond(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(new_user),
                new_user,
            )?])?],
        );
    }
    // prlimit64(pid, ...) with a pid: only a process's own limits (pid 0) may change.
    rules.insert(
        libc::SYS_prlimit64,
        vec![rule(vec![cond(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            0,
        )?])?],
    );
    // ioctl(fd, TIOCSTI | TIOCLINUX, ...): no typing into a terminal someone else reads.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCSTI,
            )?])?,
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCLINUX,
            )?])?,
        ],
    );
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;

    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;

    let mut programs = [deny, clone3]
        .into_iter()
        .map(|f| Ok(BpfProgram::try_from(f)?))
        .collect::<Result<Vec<_>>>()?;
    #[cfg(target_arch = "x86_64")]
    programs.push(no_x32());
    Ok(programs)
}

/// Every x32 system call refused with EPERM: a number with `__X32_SYSCALL_BIT` set (or above,
/// which no call has). The arch is checked by the other programs, which run on every call too.
#[cfg(target_arch = "x86_64")]
fn no_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // `seccomp_data.nr` is its first field.
    const NR_OFFSET: u32 = 0;
    let op = |code: u32, jt: u8, jf: u8, k: u32| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    vec![
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, NR_OFFSET),
        op(
            libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
            0,
            1,
            X32_SYSCALL_BIT,
        ),
        op(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Installs the filters on the calling thread (and so on everything it execs). Needs
/// `no_new_privs` set first.
pub fn install() -> Result<()> {
    for program in programs()? {
        seccompiler::apply_filter(&program)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    #[test]
    fn programs_compile() {
        let programs = super::programs().unwrap();
        assert_eq!(
            programs.len(),
            if cfg!(target_arch = "x86_64") { 3 } else { 2 }
        );
        assert!(programs[0].len() > 50);
    }
}
