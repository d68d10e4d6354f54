//! Disk limits. Each sandbox's directory (its overlay upper and work dirs) is a btrfs subvolume
//! with a quota group limited to the template's `disk_mb`, so a sandbox that fills its disk gets
//! `EDQUOT` ("Disk quota exceeded") and the host's disk, the engine and the other sandboxes are
//! unaffected.
//!
//! Why btrfs: overlayfs has no size limit of its own, ext4/xfs project quotas need mount options
//! (and kernel quota formats) we cannot count on, and one loop-mounted filesystem per sandbox costs
//! a loop device, a mount and a journal each. A btrfs subvolume plus a qgroup limit is two ioctls
//! (well under a millisecond) and deleting one is a third. The store is the data dir's own btrfs
//! when it has one, otherwise a sparse image file (`<data>/sandboxes.img`, at most 80% of the free
//! space when made) loop-mounted on `<data>/sandboxes` once per boot.
//!
//! Without root, without btrfs support, or on a data dir that already holds sandboxes in plain
//! directories, the store is plain: disk use is reported but not enforced, and the engine says
//! so in its log and health report.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

pub use sandbox_mcp_model::config::DiskLimits;

mod image;
pub use image::{open, release};

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;

#[derive(Debug, Clone)]
pub enum Store {
    /// Sandbox directories are btrfs subvolumes with quota limits.
    Btrfs,
    /// Plain directories; the reason disk limits are not enforced.
    Plain(String),
}

impl Store {
    pub fn enforced(&self) -> bool {
        matches!(self, Store::Btrfs)
    }
}

#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

#[repr(C)]
#[derive(Default)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
#[derive(Default)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; 4040],
}

#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; 16],
    reserved: [u8; 944],
}

nix::ioctl_write_ptr!(btrfs_subvol_create, 0x94, 14, VolArgs);
nix::ioctl_readwrite!(btrfs_ino_lookup, 0x94, 18, InoLookupArgs);
nix::ioctl_read!(btrfs_fs_info, 0x94, 31, FsInfoArgs);
nix::ioctl_write_ptr!(btrfs_snap_create_v2, 0x94, 23, VolArgsV2);
nix::ioctl_write_ptr!(btrfs_snap_destroy, 0x94, 15, VolArgs);
nix::ioctl_readwrite!(btrfs_quota_ctl, 0x94, 40, QuotaCtlArgs);
nix::ioctl_read!(btrfs_qgroup_limit, 0x94, 43, QgroupLimitArgs);

const QUOTA_CTL_ENABLE: u64 = 1;
const QUOTA_CTL_ENABLE_SIMPLE: u64 = 4;
const QGROUP_LIMIT_MAX_RFER: u64 = 1;
const SUBVOL_RDONLY: u64 = 1 << 1;

fn vol_args(name: &str) -> io::Result<VolArgs> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= 4088
        || bytes.contains(&0)
        || bytes.contains(&b'/')
        || name == "."
        || name == ".."
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "invalid subvolume name",
        ));
    }
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

// The statfs/statvfs field types differ between architectures.
#[allow(clippy::unnecessary_cast)]
fn is_btrfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 as i64 == BTRFS_SUPER_MAGIC)
}

fn open_dir(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
}

fn enable_quota(mount: &Path) -> io::Result<()> {
    let dir = open_dir(mount)?;
    for cmd in [QUOTA_CTL_ENABLE_SIMPLE, QUOTA_CTL_ENABLE] {
        let mut args = QuotaCtlArgs { cmd, status: 0 };
        // SAFETY: a valid btrfs_ioctl_quota_ctl_args on an open directory of the filesystem.
        match unsafe { btrfs_quota_ctl(dir.as_raw_fd(), &mut args) } {
            Ok(_) => return Ok(()),
            // Simple quotas need Linux 6.7; fall back to full qgroups.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::EOPNOTSUPP)
                if cmd == QUOTA_CTL_ENABLE_SIMPLE => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Creates a sandbox's directory `parent/name`: a subvolume limited to `limit_bytes` in a btrfs
/// store, a plain directory otherwise. Idempotent.
pub fn create_dir(store: &Store, parent: &Path, name: &str, limit_bytes: u64) -> io::Result<()> {
    let path = parent.join(name);
    if path.exists() {
        return Ok(());
    }
    match store {
        Store::Plain(_) => fs::create_dir(&path)?,
        Store::Btrfs => {
            let dir = open_dir(parent)?;
            let args = vol_args(name)?;
            // SAFETY: a valid btrfs_ioctl_vol_args on an open directory of the filesystem.
            unsafe { btrfs_subvol_create(dir.as_raw_fd(), &args) }?;
            let sub = open_dir(&path)?;
            let mut limit = QgroupLimitArgs {
                qgroupid: 0, // the subvolume `sub` is in
                flags: QGROUP_LIMIT_MAX_RFER,
                max_rfer: limit_bytes,
                ..QgroupLimitArgs::default()
            };
            // SAFETY: a valid btrfs_ioctl_qgroup_limit_args on the new subvolume's root.
            if let Err(e) = unsafe { btrfs_qgroup_limit(sub.as_raw_fd(), &mut limit) } {
                drop(sub);
                let _ = remove_dir(store, parent, name);
                return Err(io::Error::other(format!("cannot set the disk limit: {e}")));
            }
        }
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(0o711))
}

/// Makes `parent/to` a copy-on-write snapshot of the subvolume `parent/from`: read-only (a
/// sandbox snapshot, never changed after), or writable with a disk limit (a forked or restored
/// sandbox). `Ok(false)` when the store cannot (plain, or `from` is a plain directory): the caller
/// copies instead. A snapshot of a 20,000-file tree takes a few milliseconds whatever its size.
pub fn snapshot(
    store: &Store,
    parent: &Path,
    from: &str,
    to: &str,
    limit_bytes: Option<u64>,
) -> io::Result<bool> {
    let Store::Btrfs = store else {
        return Ok(false);
    };
    let source = open_dir(&parent.join(from))?;
    let dir = open_dir(parent)?;
    let name = vol_args(to)?.name;
    let mut args = VolArgsV2 {
        fd: source.as_raw_fd().into(),
        transid: 0,
        flags: if limit_bytes.is_none() {
            SUBVOL_RDONLY
        } else {
            0
        },
        unused: [0; 4],
        name: [0; 4040],
    };
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    if len >= args.name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "invalid subvolume name",
        ));
    }
    args.name[..len].copy_from_slice(&name[..len]);
    // SAFETY: a valid btrfs_ioctl_vol_args_v2 naming an open subvolume, on an open directory of
    // the same filesystem.
    match unsafe { btrfs_snap_create_v2(dir.as_raw_fd(), &args) } {
        Ok(_) => {}
        // Not a subvolume (a sandbox made before the store was): copy.
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOTTY) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    if let Some(limit) = limit_bytes {
        let sub = open_dir(&parent.join(to))?;
        let mut args = QgroupLimitArgs {
            qgroupid: 0,
            flags: QGROUP_LIMIT_MAX_RFER,
            max_rfer: limit,
            ..QgroupLimitArgs::default()
        };
        // SAFETY: a valid btrfs_ioctl_qgroup_limit_args on the new subvolume's root.
        if let Err(e) = unsafe { btrfs_qgroup_limit(sub.as_raw_fd(), &mut args) } {
            drop(sub);
            let _ = remove_dir(store, parent, to);
            return Err(io::Error::other(format!("cannot set the disk limit: {e}")));
        }
    }
    Ok(true)
}

/// What the kernel charges to the subvolume at `path` under btrfs *simple* quotas (Linux 6.7):
/// every extent it wrote that anything still references, its snapshots' share included, and
/// data written but not yet committed. Read
/// from sysfs in constant time, where walking the files would take a lookup per file. `None`
/// when the store is not btrfs or keeps full qgroups, which charge a snapshot's share to the
/// snapshot (the caller then adds snapshots up itself).
pub fn simple_quota_bytes(path: &Path) -> Option<u64> {
    let dir = open_dir(path).ok()?;
    let mut lookup = InoLookupArgs {
        treeid: 0,
        objectid: 256, // BTRFS_FIRST_FREE_OBJECTID: a subvolume's root directory
        name: [0; 4080],
    };
    // SAFETY: a valid btrfs_ioctl_ino_lookup_args on an open directory; treeid 0 asks for the
    // subvolume the directory is in.
    unsafe { btrfs_ino_lookup(dir.as_raw_fd(), &mut lookup) }.ok()?;
    // SAFETY: an all-zero btrfs_ioctl_fs_info_args is a valid request (no optional fields).
    let mut info: FsInfoArgs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid btrfs_ioctl_fs_info_args on an open directory of the filesystem.
    unsafe { btrfs_fs_info(dir.as_raw_fd(), &mut info) }.ok()?;
    let fsid = uuid_text(&info.fsid);
    let qgroups = Path::new("/sys/fs/btrfs").join(fsid).join("qgroups");
    if fs::read_to_string(qgroups.join("mode")).ok()?.trim() != "squota" {
        return None;
    }
    let qgroup = qgroups.join(format!("0_{}", lookup.treeid));
    let read = |name: &str| -> Option<u64> {
        fs::read_to_string(qgroup.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    // Data written but not yet committed is reserved, not yet referenced: the kernel's limit
    // counts both, and so does this.
    Some(read("referenced")? + read("rsv_data").unwrap_or(0))
}

/// A filesystem id as sysfs names it: `8-4-4-4-12` lowercase hex.
fn uuid_text(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Swaps the names `parent/a` and `parent/b` in one step (both exist): a restore or a merge
/// puts the new tree in place without a moment where the sandbox has none, whenever it crashes.
pub fn exchange(parent: &Path, a: &str, b: &str) -> io::Result<()> {
    let dir = open_dir(parent)?;
    let (a, b) = (
        CString::new(a).map_err(io::Error::other)?,
        CString::new(b).map_err(io::Error::other)?,
    );
    // SAFETY: NUL-terminated names relative to an open directory; RENAME_EXCHANGE is atomic.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir.as_raw_fd(),
            a.as_ptr(),
            dir.as_raw_fd(),
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // The swap is durable before the caller acknowledges it.
    dir.sync_all()
}

/// Deletes a sandbox's directory and everything in it.
pub fn remove_dir(store: &Store, parent: &Path, name: &str) -> io::Result<()> {
    let path = parent.join(name);
    if let Store::Btrfs = store
        && let Ok(dir) = open_dir(parent)
        && let Ok(args) = vol_args(name)
    {
        // SAFETY: a valid btrfs_ioctl_vol_args on an open directory of the filesystem.
        match unsafe { btrfs_snap_destroy(dir.as_raw_fd(), &args) } {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::ENOENT) => return Ok(()),
            // Not a subvolume (made before the store was): delete it file by file below.
            Err(_) => {}
        }
    }
    // Iterative and in constant memory: the tree is the sandbox's, as deep as it liked.
    sandbox_mcp_sys::fs_tree::remove_tree(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filesystem_ids_are_written_as_sysfs_names_them() {
        let id = [
            0x22, 0x79, 0xa7, 0xb4, 0x20, 0xfa, 0x4f, 0xb8, 0x94, 0xa8, 0x6b, 0x20, 0x85, 0x87,
            0x7e, 0x43,
        ];
        assert_eq!(uuid_text(&id), "2279a7b4-20fa-4fb8-94a8-6b2085877e43");
    }

    #[test]
    fn subvolume_names_are_single_components() {
        assert!(vol_args("sbx_abc").is_ok());
        for bad in ["", "a/b", ".", "..", "a\0b"] {
            assert!(vol_args(bad).is_err(), "{bad:?}");
        }
        assert!(vol_args(&"x".repeat(4088)).is_err());
    }
}
