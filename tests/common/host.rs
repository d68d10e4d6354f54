//! This machine: whether it can run real sandboxes (and the macros that skip a test when it
//! cannot), the host tools the tests need inside sandboxes, and what engines leave on it (loop
//! devices, mounts, sandboxes after a `kill -9`).

use std::path::PathBuf;
use std::sync::OnceLock;

use sandbox_mcp_model::config::EngineConfig;

use super::BIN;
use super::TestEngine;

/// Whether this machine can run real sandboxes; the reason when it cannot.
///
/// Probed once by creating a sandbox. Tests that need sandboxes call [`require_sandboxes!`],
/// which skips with this reason printed, or fails when `SANDBOX_MCP_REQUIRE_SANDBOX=1` (CI sets
/// it, so a broken sandbox never passes as a skip there).
pub fn sandbox_support() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            ensure_host_tools();
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let engine = TestEngine::start().await;
                    let result = engine
                        .client()
                        .create_sandbox()
                        .body(sandbox_mcp_api::types::CreateSandboxRequest::default())
                        .send()
                        .await;
                    match result {
                        Ok(_) => Ok(()),
                        Err(e) => Err(format!(
                            "needs Linux user, mount, pid and network namespaces with overlayfs (and root for cgroups): {e}"
                        )),
                    }
                })
            })
            .join()
            .unwrap_or_else(|_| Err("the sandbox probe panicked".into()))
        })
        .clone()
}

/// The base template shows the host's /usr, and the tests run python3 and node inside sandboxes;
/// disk limits need mkfs.btrfs; the test network (`testnet`) needs `ip` and `openssl`. On a fresh
/// machine that lacks them, install them (as root, with apt) so `cargo test` works with no other
/// step; say so on stderr. Once per process: concurrent apt-get runs would fight over its lock.
pub fn ensure_host_tools() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(install_host_tools);
}

fn install_host_tools() {
    let missing: Vec<&str> = [
        ("python3", "/usr/bin/python3"),
        ("nodejs", "/usr/bin/node"),
        ("btrfs-progs", "/usr/sbin/mkfs.btrfs"),
        ("iproute2", "/usr/sbin/ip"),
        ("openssl", "/usr/bin/openssl"),
        // pip inside a sandbox, for the package-index test.
        ("python3-pip", "/usr/lib/python3/dist-packages/pip"),
        // Clients that must trust the secrets CA inside a sandbox.
        (
            "python3-requests",
            "/usr/lib/python3/dist-packages/requests",
        ),
        ("git", "/usr/bin/git"),
        // OCI images the template tests build (a static busybox userland).
        ("busybox-static", "/bin/busybox"),
        // …and a musl userland (an Alpine-like image): musl's loader and compiler.
        ("musl-tools", "/usr/bin/musl-gcc"),
        // Desktops (computer use): the virtual display, a window manager, and fonts.
        ("xvfb", "/usr/bin/Xvfb"),
        ("xfonts-base", "/usr/share/fonts/X11/misc"),
        (
            "matchbox-window-manager",
            "/usr/bin/matchbox-window-manager",
        ),
        ("fonts-dejavu-core", "/usr/share/fonts/truetype/dejavu"),
    ]
    .into_iter()
    .filter(|(_, path)| !std::path::Path::new(path).exists())
    .map(|(pkg, _)| pkg)
    .chain(
        // The desktop tests' app is Tk; its module's path names the Python version. Debian's
        // python3 (the one sandboxes see), not whichever python3 comes first on PATH.
        (!std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import tkinter"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success()))
        .then_some("python3-tk"),
    )
    .collect();
    if missing.is_empty()
        || !nix::unistd::geteuid().is_root()
        || !std::path::Path::new("/usr/bin/apt-get").exists()
    {
        return;
    }
    eprintln!(
        "tests: installing {} (needed inside sandboxes) with apt-get",
        missing.join(" ")
    );
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&missing);
    let installed = apt(&install) || (apt(&["update"]) && apt(&install));
    if !installed {
        eprintln!(
            "tests: apt-get could not install {}; tests that use them will fail",
            missing.join(" ")
        );
    }
}

#[macro_export]
macro_rules! require_sandboxes {
    () => {
        if let Err(reason) = $crate::common::sandbox_support() {
            if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                panic!("sandboxes are required here but unavailable: {reason}");
            }
            eprintln!("SKIPPED {}: {reason}", module_path!());
            return;
        }
    };
}

/// Whether cgroup limits are enforced here (root with cgroups).
pub fn cgroups_enforced() -> bool {
    !matches!(
        sandbox_mcp_linux::cgroups::Layout::detect(),
        sandbox_mcp_linux::cgroups::Layout::None
    )
}

#[macro_export]
macro_rules! require_cgroups {
    () => {
        $crate::require_sandboxes!();
        if !$crate::common::cgroups_enforced() {
            if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                panic!("cgroups are required here but unavailable");
            }
            eprintln!(
                "SKIPPED {}: needs writable cgroups (run as root)",
                module_path!()
            );
            return;
        }
    };
}

/// Loop devices whose backing file is `image` (a deleted one included).
pub fn loop_devices_of(image: &std::path::Path) -> Vec<String> {
    let image = image.display().to_string();
    std::fs::read_dir("/sys/block")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let backing =
                        std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
                    backing
                        .trim_end()
                        .trim_end_matches(" (deleted)")
                        .eq(&image)
                        .then(|| e.file_name().to_string_lossy().into_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether something is mounted at `path` in this mount namespace.
pub fn mounted(path: &std::path::Path) -> bool {
    let path = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_str()))
}

/// The sandboxes kept on data dir `data` while no engine runs on it, as `id status`: their
/// records. (Not the store's directories, which are unmounted when the engine stops.)
pub fn sandbox_records(data: &std::path::Path) -> Vec<String> {
    let path = data.join("state.db");
    if !path.exists() {
        return Vec::new();
    }
    let db = rusqlite::Connection::open(path).unwrap();
    let mut query = db.prepare("SELECT id, status FROM sandboxes").unwrap();
    query
        .query_map([], |r| {
            Ok(format!(
                "{} {}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Kills and deletes every sandbox an engine process left on `data` (after `kill -9`, say), and
/// lets go of its store.
pub fn kill_left_behind(data: &std::path::Path) {
    left_behind(data, |driver, id| {
        let _ = sandbox_mcp_model::driver::Isolation::destroy(driver, id);
    });
}

/// Kills the processes of every sandbox an engine process left on `data`, keeping their files
/// (as a crash of the whole machine would).
pub fn stop_left_behind(data: &std::path::Path) {
    left_behind(data, |driver, id| {
        let _ = sandbox_mcp_model::driver::Isolation::stop(driver, id);
    });
}

fn left_behind(data: &std::path::Path, each: impl Fn(&sandbox_mcp_linux::NamespacesDriver, &str)) {
    let config = EngineConfig::new(data.to_path_buf());
    let Ok(driver) = sandbox_mcp_linux::NamespacesDriver::new(sandbox_mcp_linux::driver::Options {
        sandboxes_dir: config.sandboxes_dir(),
        exe: PathBuf::from(BIN),
        disk_limits: config.disk_limits,
        max_sandboxes: config.max_sandboxes,
        uid_registry: config.uid_registry.clone(),
        favordynmods: false,
        criu: sandbox_mcp_model::config::CriuSetting::Off,
    }) else {
        return;
    };
    if let Ok(entries) = std::fs::read_dir(config.sandboxes_dir()) {
        for e in entries.flatten() {
            each(&driver, &e.file_name().to_string_lossy());
        }
    }
    sandbox_mcp_model::driver::Isolation::close(&driver);
}
