//! The store's image: `<data>/sandboxes.img`, a sparse btrfs image made on first start and
//! loop-mounted on `<data>/sandboxes`, and the loop device that outlives an engine while paused
//! sandboxes still use the filesystem.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{DiskLimits, Store, enable_quota, is_btrfs, run};

/// Smallest image worth making; below this the store stays plain.
const MIN_IMAGE: u64 = 2 << 30;
/// Largest image made by default.
const MAX_IMAGE: u64 = 512 << 30;

/// Whether something is mounted exactly at `path` (per /proc/self/mountinfo).
fn mounted_at(path: &Path) -> bool {
    let Ok(path) = fs::canonicalize(path) else {
        return false;
    };
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|line| {
        line.split(' ').nth(4).is_some_and(|m| {
            sandbox_mcp_sys::mounts::unescape(m) == path.as_os_str().as_encoded_bytes()
        })
    })
}

/// Mounts the store's image on `sandboxes_dir`. A loop device still attached to the image (the
/// store was released while paused sandboxes kept it alive) is mounted again rather than a second
/// one attached: the kernel then hands back the same filesystem, which those sandboxes still use.
fn mount_image(image: &Path, sandboxes_dir: &Path) -> io::Result<()> {
    // The device is held open until mounted, so that it can neither go meanwhile (with the last
    // of those sandboxes, as autoclear detaches it) nor be attached to another image.
    if let Some(held) = HeldLoop::of(image) {
        return run(Command::new("mount")
            .arg("-t")
            .arg("btrfs")
            .arg("-o")
            .arg("noatime")
            .arg(&held.path)
            .arg(sandboxes_dir));
    }
    run(Command::new("mount")
        .arg("-t")
        .arg("btrfs")
        .arg("-o")
        .arg("loop,noatime")
        .arg(image)
        .arg(sandboxes_dir))
}

/// A loop device attached to a store image, open: while it is, the device stays attached to
/// that image (autoclear detaches a device at its last close, and an attached device is never
/// given to another file).
struct HeldLoop {
    path: PathBuf,
    _open: fs::File,
}

/// The head of the kernel's `struct loop_info64` (232 bytes), which `LOOP_GET_STATUS64` fills.
#[repr(C)]
struct LoopInfo64 {
    /// The backing file's device and inode numbers.
    lo_device: u64,
    lo_inode: u64,
    _rest: [u8; 216],
}

nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);

impl HeldLoop {
    /// The loop device attached to `image`, if one is: found by its backing file's name in
    /// sysfs, then checked once open (that file's device and inode numbers), since it may have
    /// gone, or been attached to another image, in between.
    fn of(image: &Path) -> Option<Self> {
        let meta = fs::metadata(image).ok()?;
        let image = fs::canonicalize(image).ok()?;
        let entries = fs::read_dir("/sys/block").ok()?;
        entries.flatten().find_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let backing = fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            if Path::new(backing.trim_end()) != image {
                return None;
            }
            Self::open(&Path::new("/dev").join(name), &meta)
        })
    }

    /// Loop device `device`, open, if it is attached to the file `meta` describes.
    fn open(device: &Path, meta: &fs::Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let open = fs::File::open(device).ok()?;
        let mut info = LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            _rest: [0; 216],
        };
        // SAFETY: LOOP_GET_STATUS64 writes one loop_info64 (`LoopInfo64`'s size and layout) on
        // an open device; a device with no file attached fails with ENXIO and writes nothing.
        unsafe { loop_get_status64(open.as_raw_fd(), &mut info) }.ok()?;
        (info.lo_device == meta.dev() && info.lo_inode == meta.ino()).then(|| Self {
            path: device.to_path_buf(),
            _open: open,
        })
    }
}

fn find_mkfs() -> Option<PathBuf> {
    [
        "/usr/sbin/mkfs.btrfs",
        "/sbin/mkfs.btrfs",
        "/usr/bin/mkfs.btrfs",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

fn kernel_has_btrfs() -> bool {
    fs::read_to_string("/proc/filesystems").is_ok_and(|f| {
        f.lines()
            .any(|l| l.split_whitespace().last() == Some("btrfs"))
    })
}

/// Makes `sandboxes_dir` a btrfs store with quotas if it can; says why not otherwise.
///
/// An existing image is always mounted (the sandboxes live in it): failing that is an error.
pub fn open(sandboxes_dir: &Path, limits: DiskLimits) -> io::Result<Store> {
    let image = sandboxes_dir.with_extension("img");
    if image.exists() {
        // An image an older engine made open to all (0644) is closed now.
        fs::set_permissions(&image, fs::Permissions::from_mode(0o600))?;
        // Mounted already when the engine restarts without a reboot.
        if !(mounted_at(sandboxes_dir) && is_btrfs(sandboxes_dir)) {
            mount_image(&image, sandboxes_dir).map_err(|e| {
                io::Error::other(format!(
                    "cannot mount the sandbox store {}: {e}",
                    image.display()
                ))
            })?;
        }
        fs::set_permissions(sandboxes_dir, fs::Permissions::from_mode(0o711))?;
        enable_quota(sandboxes_dir)?;
        return Ok(Store::Btrfs);
    }
    let plain = |why: &str| Ok(Store::Plain(why.to_string()));
    if limits == DiskLimits::Off {
        return plain("disk limits are turned off (SANDBOX_MCP_DISK_LIMITS=off)");
    }
    if !nix::unistd::geteuid().is_root() {
        return plain("disk limits need root (a loop-mounted btrfs store)");
    }
    if !kernel_has_btrfs() {
        return plain("disk limits need btrfs, which this kernel lacks");
    }
    let Some(mkfs) = find_mkfs() else {
        return plain("disk limits need mkfs.btrfs (install btrfs-progs)");
    };
    if fs::read_dir(sandboxes_dir)?.next().is_some() {
        return plain(
            "this data dir already holds sandboxes in plain directories; a new data dir gets disk limits",
        );
    }
    #[allow(clippy::unnecessary_cast)] // field types differ between architectures
    let free = nix::sys::statvfs::statvfs(sandboxes_dir)
        .map(|s| s.blocks_available() as u64 * s.fragment_size() as u64)
        .unwrap_or(0);
    let size = (free / 10 * 8).min(MAX_IMAGE);
    if size < MIN_IMAGE {
        return plain("too little free disk space for a sandbox store (2 GiB)");
    }
    // Build the image aside and rename it into place: a crash never leaves a half-made store
    // that the next start would try to mount.
    // 0600: it holds every sandbox's files, which no other user of the host may read.
    let made = sandbox_mcp_sys::durable::replace_with(&image, 0o600, |f, tmp| {
        f.set_len(size)?;
        f.sync_all()?;
        run(Command::new(&mkfs).arg("-q").arg("-f").arg(tmp))
    });
    if let Err(e) = made {
        return plain(&format!("could not make a btrfs store: {e}"));
    }
    if let Err(e) = mount_image(&image, sandboxes_dir) {
        let _ = fs::remove_file(&image);
        return plain(&format!("could not mount the btrfs store: {e}"));
    }
    fs::set_permissions(sandboxes_dir, fs::Permissions::from_mode(0o711))?;
    enable_quota(sandboxes_dir)?;
    Ok(Store::Btrfs)
}

/// Unmounts a store image from `sandboxes_dir` if one is mounted there: when the engine stops,
/// so the data dir can be deleted and no loop device outlives its use. Lazily: paused sandboxes
/// may still hold the filesystem, and the loop device (attached with autoclear) goes when the
/// last of them does; a later engine mounts that same device again.
pub fn release(sandboxes_dir: &Path) {
    if sandboxes_dir.with_extension("img").exists()
        && mounted_at(sandboxes_dir)
        && let Ok(c) = CString::new(sandboxes_dir.as_os_str().as_encoded_bytes())
    {
        // SAFETY: umount2 of a path we own; MNT_DETACH never blocks.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A made (not mounted) store image in a scratch dir, as `<dir>/sandboxes.img` beside an
    /// empty `<dir>/sandboxes`; `None` (a skip, a failure in CI) without root, btrfs or mkfs.
    fn scratch_image(test: &str) -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
        let mkfs = find_mkfs();
        if !nix::unistd::geteuid().is_root() || !kernel_has_btrfs() || mkfs.is_none() {
            assert!(
                std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
                "{test}: root, btrfs and mkfs.btrfs are required here"
            );
            eprintln!("SKIPPED {test}: needs root, btrfs and mkfs.btrfs (loop-mounted stores)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("sandboxes.img");
        let mount = dir.path().join("sandboxes");
        fs::create_dir(&mount).unwrap();
        fs::File::create(&image)
            .unwrap()
            .set_len(MIN_IMAGE / 8)
            .unwrap();
        run(Command::new(mkfs.unwrap()).arg("-q").arg("-f").arg(&image)).unwrap();
        Some((dir, image, mount))
    }

    /// Waits (up to 10 s) until no loop device is attached to `image`.
    fn wait_detached(image: &Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while HeldLoop::of(image).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "a loop device outlived its store's last user"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The race a new engine ran into when the previous one's last sandbox was still dying: the
    /// store's device, found attached, went with that sandbox before it was mounted, and the
    /// mount failed ("bad superblock"), so the engine did not start. Held open once found, the
    /// device stays attached to its image until mounted: the same filesystem, mounted.
    #[test]
    fn a_store_device_whose_last_user_goes_meanwhile_is_still_the_one_mounted() {
        let test = "a_store_device_whose_last_user_goes_meanwhile_is_still_the_one_mounted";
        let Some((_dir, image, mount)) = scratch_image(test) else {
            return;
        };
        mount_image(&image, &mount).unwrap();
        fs::write(mount.join("kept"), "the store's own file").unwrap();
        // A sandbox's process: in a mount namespace of its own, working in the store.
        let mut user = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "600"])
            .current_dir(&mount)
            .spawn()
            .unwrap();
        let comm = format!("/proc/{}/comm", user.id());
        while fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep" {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // The engine stops: its mount goes, the sandbox keeps the store and its device.
        release(&mount);
        assert!(!mounted_at(&mount));
        // The next engine finds the device; then the store's last user goes.
        let held = HeldLoop::of(&image).expect("the device of a store still in use");
        user.kill().unwrap();
        user.wait().unwrap();
        assert!(
            HeldLoop::of(&image).is_some(),
            "the device was detached while held"
        );
        run(Command::new("mount")
            .args(["-t", "btrfs", "-o", "noatime"])
            .arg(&held.path)
            .arg(&mount))
        .unwrap();
        drop(held);
        assert_eq!(
            fs::read_to_string(mount.join("kept")).unwrap(),
            "the store's own file"
        );
        // Let go, the device goes with its last user.
        release(&mount);
        wait_detached(&image);
    }

    /// A device attached to another image is never taken for this one's, however its sysfs name
    /// read a moment before: the open device's backing file is what counts.
    #[test]
    fn a_loop_device_of_another_image_is_never_taken_for_this_ones() {
        let test = "a_loop_device_of_another_image_is_never_taken_for_this_ones";
        let Some((_dir, image, mount)) = scratch_image(test) else {
            return;
        };
        let Some((_other_dir, other, other_mount)) = scratch_image(test) else {
            return;
        };
        mount_image(&other, &other_mount).unwrap();
        let device = HeldLoop::of(&other).expect("the other image's device");
        assert!(HeldLoop::of(&image).is_none());
        assert!(HeldLoop::open(&device.path, &fs::metadata(&image).unwrap()).is_none());
        assert!(HeldLoop::open(&device.path, &fs::metadata(&other).unwrap()).is_some());
        // Mounting this image attaches a device of its own, whatever the other holds.
        mount_image(&image, &mount).unwrap();
        let own = HeldLoop::of(&image).expect("this image's device");
        assert_ne!(own.path, device.path);
        drop((own, device));
        release(&mount);
        release(&other_mount);
        wait_detached(&image);
        wait_detached(&other);
    }
}
