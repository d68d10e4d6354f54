//! Finding CRIU and checking it works here, and where it keeps what it learns of the kernel.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
/// restore probed the kernel anew (about 7 ms of each run here), and so did every dump on a host
/// whose `/run` is no tmpfs (most containers, this one), starting `iptables`, `ip6tables` and
/// `nft` to learn what it can lock, before it seizes anything (30 ms of a 200 MB dump run by
/// hand). Where root lacks CAP_SYS_RESOURCE, dumps run `--unprivileged` too
/// (see `dump`) and use the first directory.
/// Each directory is made 0700; one that is not a directory of this uid's alone (made by another
/// user first, a symlink) is not used, and CRIU probes as before.
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
/// that namespace reaches the host (and an unmount on the host, of a mount it shares, still
/// reaches it). Where the
/// namespace cannot be made (no CAP_SYS_ADMIN), CRIU runs as before and probes the kernel.
pub(super) fn with_own_run(cmd: &mut Command, dir: &Path) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
}
