//! Turning on the kernel's `favordynmods` for the host's cgroup2 hierarchy, keeping the mount's
//! own flags and the hierarchy's other options (a cgroup2 remount applies the whole list), and
//! checking in the mount table that the kernel applied it.

use std::fs;
use std::io;
use std::path::PathBuf;

use sandbox_mcp_sys::mounts::{MountLine, mounts};

/// The remount that turns on the kernel's `favordynmods` for the host's cgroup2 hierarchy.
///
/// Why: every sandbox start writes its launcher into the sandbox's `cgroup.procs`, and the
/// kernel makes that write wait for an RCU grace period (5–9 ms measured here during forks, most
/// of an agent's start) unless `favordynmods` is on: the option keeps the lock that write takes
/// in the mode where it never waits (since Linux 6.18, it takes a per-process lock instead); the
/// kernel's documented price is slightly dearer forks and exits host-wide. The lock is shared by
/// every hierarchy, so the cgroup2 mount's option also speeds up a hybrid host's v1 controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remount {
    pub target: PathBuf,
    /// The mount's own flags, kept: a remount sets them anew (nosuid, nodev, noexec, ro).
    pub flags: nix::mount::MsFlags,
    /// The hierarchy's options, kept, plus `favordynmods`: a cgroup2 remount applies the whole
    /// list, so leaving one out (`nsdelegate`, `memory_recursiveprot`) would turn it off.
    pub data: String,
}

/// The remount for the first cgroup2 mount in `info` (mountinfo), if it lacks `favordynmods`.
/// Pure, for tests.
pub fn favordynmods_remount(info: &str) -> Option<Remount> {
    use nix::mount::MsFlags;
    let MountLine {
        point: target,
        options: mount_options,
        super_options,
        ..
    } = mounts(info).find(|m| m.fstype == "cgroup2")?;
    // A mount point with an escaped character (`\040`) would need unescaping: left alone.
    if target.contains('\\') || super_options.split(',').any(|o| o == "favordynmods") {
        return None;
    }
    let mut flags = MsFlags::MS_REMOUNT;
    for option in mount_options.split(',') {
        flags |= match option {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            _ => MsFlags::empty(),
        };
    }
    let data: Vec<&str> = super_options
        .split(',')
        .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
        .chain(["favordynmods"])
        .collect();
    Some(Remount {
        target: PathBuf::from(target),
        flags,
        data: data.join(","),
    })
}

/// Turns on `favordynmods` for the host's cgroup2 hierarchy if it is off (root only; a kernel
/// without the option refuses it, and nothing changes). Returns the mount point changed.
pub fn favor_dynamic_moves() -> io::Result<Option<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    let Some(remount) = favordynmods_remount(&info) else {
        return Ok(None);
    };
    nix::mount::mount(
        None::<&str>,
        &remount.target,
        None::<&str>,
        remount.flags,
        Some(remount.data.as_str()),
    )
    .map_err(|e| io::Error::other(format!("remount {}: {e}", remount.target.display())))?;
    // Outside the host's cgroup namespace (a container) the remount succeeds and changes
    // nothing: only the mount table says whether the option is on.
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    if favordynmods_remount(&info).is_some() {
        return Err(io::Error::other(format!(
            "the kernel did not apply it to {} (not the host's cgroup namespace?)",
            remount.target.display()
        )));
    }
    Ok(Some(remount.target))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::cgroups::tests::HYBRID;

    #[test]
    fn favordynmods_remount_keeps_the_mounts_own_flags_and_options() {
        // This host's hybrid layout: nothing but `rw` to keep.
        let r = favordynmods_remount(HYBRID).unwrap();
        assert_eq!(r.target, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(r.flags, nix::mount::MsFlags::MS_REMOUNT);
        assert_eq!(r.data, "favordynmods");
        // systemd's pure v2 mount: its flags and both hierarchy options survive the remount.
        let systemd = "25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let r = favordynmods_remount(systemd).unwrap();
        use nix::mount::MsFlags as F;
        assert_eq!(
            r.flags,
            F::MS_REMOUNT | F::MS_NOSUID | F::MS_NODEV | F::MS_NOEXEC
        );
        assert_eq!(r.data, "nsdelegate,memory_recursiveprot,favordynmods");
        // Already on, no cgroup2 mount, or a mount point that would need unescaping: nothing.
        let on = systemd.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods");
        assert_eq!(favordynmods_remount(&on), None);
        assert_eq!(
            favordynmods_remount("31 23 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
            None
        );
        let escaped = "25 22 0:22 / /cg\\040x rw - cgroup2 cgroup2 rw\n";
        assert_eq!(favordynmods_remount(escaped), None);
    }
}
