//! Per-sandbox cgroups on cgroup v2, v1 ("hybrid": v1 controllers plus an empty v2 mount, as on
//! these machines), or none (unprivileged without delegation: limits are reported as not enforced).
//!
//! Limits come from the template shape: memory (no swap), pids, CPU quota. Pausing prefers the v2
//! `cgroup.freeze` (also present on a hybrid host's v2 mount, and faster than the v1 freezer);
//! the v1 freezer is the fallback. Killing prefers `cgroup.kill`; without it every process is
//! killed while frozen, so nothing can fork away in between.
//!
//! This file finds the hierarchies (`Layout`); `sandbox` is one sandbox's cgroups (create with
//! limits, freeze, kill, remove, usage); `remount` turns on `favordynmods` for the host.

mod remount;
mod sandbox;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sandbox_mcp_sys::mounts::mounts;

/// Name of the parent cgroup every sandbox cgroup lives under.
pub const PARENT: &str = "sandbox-mcp";

/// Where the cgroup hierarchies are mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Pure cgroup v2 at this mount point.
    V2 { root: PathBuf },
    /// v1 controllers (memory, pids, cpu, cpuacct, freezer) plus, maybe, a v2 mount with no
    /// controllers (used for `cgroup.freeze`, `cgroup.kill` and `cpu.stat`).
    Hybrid {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
        freezer: Option<PathBuf>,
        unified: Option<PathBuf>,
    },
    /// No usable cgroups.
    None,
}

/// Resource limits for one sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub max_pids: u64,
    pub vcpus: f64,
}

/// How to freeze one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeMethod {
    /// `cgroup.freeze` on a v2 (or hybrid unified) cgroup.
    V2,
    /// `freezer.state` on the v1 freezer controller.
    V1,
}

/// The cgroup directories of one sandbox (they may not exist yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    layout: Layout,
    id: String,
    freeze: FreezeMethod,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn read_u64(path: &Path) -> Option<u64> {
    parse_u64(&read_small(fs::File::open(path).ok()?)?)
}

fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return Some(u64::MAX);
    }
    text.parse().ok()
}

/// `key value` lines (cpu.stat, memory.events, memory.oom_control).
fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    parse_keyed(&read_small(fs::File::open(path).ok()?)?, key)
}

fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key)).then(|| parts.next()?.parse().ok())?
    })
}

/// A cgroup file's text: one `read` where it fits in 4 KiB, as cgroup files do (a kernfs file
/// hands over all it holds that fits), so no `statx` for a size and no read of the end
/// (`read_to_string` makes both: 5 system calls a file, 3 here). Usage figures are read on every
/// `sandbox_info`.
fn read_small(mut file: fs::File) -> Option<String> {
    use std::io::Read;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..]).ok()?;
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

/// A sandbox's cgroup directory, open, for reading several of its files by name (one path walk
/// for all of them rather than one each).
struct OpenDir(std::os::fd::OwnedFd);

impl OpenDir {
    fn open(dir: &Path) -> Option<Self> {
        use nix::fcntl::{OFlag, open};
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        open(dir, flags, nix::sys::stat::Mode::empty())
            .ok()
            .map(Self)
    }

    fn read(&self, name: &str) -> Option<String> {
        use nix::fcntl::{OFlag, openat};
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let fd = openat(&self.0, name, flags, nix::sys::stat::Mode::empty()).ok()?;
        read_small(fs::File::from(fd))
    }

    fn u64(&self, name: &str) -> Option<u64> {
        parse_u64(&self.read(name)?)
    }

    fn keyed(&self, name: &str, key: &str) -> Option<u64> {
        parse_keyed(&self.read(name)?, key)
    }
}

impl Layout {
    /// Reads the cgroup mounts from /proc/self/mountinfo and checks that sandbox cgroups can be
    /// created under them.
    pub fn detect() -> Layout {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
            return Layout::None;
        };
        let layout = Self::parse_mountinfo(&info);
        if layout.prepare().is_ok() {
            layout
        } else {
            Layout::None
        }
    }

    /// Parses mountinfo; pure, for tests.
    pub fn parse_mountinfo(info: &str) -> Layout {
        let mut v2 = None;
        let (mut memory, mut pids, mut cpu, mut cpuacct, mut freezer) =
            (None, None, None, None, None);
        let mut any_v1 = false;
        for mount in mounts(info) {
            let mount_point = PathBuf::from(mount.point);
            match mount.fstype {
                "cgroup2" => v2 = Some(mount_point),
                "cgroup" => {
                    any_v1 = true;
                    for opt in mount.super_options.split(',') {
                        match opt {
                            "memory" => memory = Some(mount_point.clone()),
                            "pids" => pids = Some(mount_point.clone()),
                            "cpu" => cpu = Some(mount_point.clone()),
                            "cpuacct" => cpuacct = Some(mount_point.clone()),
                            "freezer" => freezer = Some(mount_point.clone()),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        match (any_v1, v2) {
            (false, Some(root)) => Layout::V2 { root },
            (true, unified) => Layout::Hybrid {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
                unified,
            },
            (false, None) => Layout::None,
        }
    }

    /// Creates the parent cgroups (and, on v2, enables the controllers sandboxes need), and checks
    /// that this process may create sandbox cgroups under them.
    fn prepare(&self) -> io::Result<()> {
        self.create_parents()?;
        for dir in self.parent_dirs() {
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK)
                .map_err(|e| io::Error::other(format!("{}: {e}", dir.display())))?;
        }
        Ok(())
    }

    fn create_parents(&self) -> io::Result<()> {
        match self {
            Layout::None => Err(io::Error::other("no cgroups")),
            Layout::V2 { root } => {
                let parent = root.join(PARENT);
                fs::create_dir_all(&parent)?;
                // Controllers must be enabled at every level down to the sandbox cgroups.
                let _ = write(&root.join("cgroup.subtree_control"), "+cpu +memory +pids");
                write(&parent.join("cgroup.subtree_control"), "+cpu +memory +pids")
            }
            Layout::Hybrid { memory, pids, .. } => {
                if memory.is_none() || pids.is_none() {
                    return Err(io::Error::other(
                        "the memory and pids controllers are required",
                    ));
                }
                for dir in self.parent_dirs() {
                    fs::create_dir_all(dir)?;
                }
                Ok(())
            }
        }
    }

    fn parent_dirs(&self) -> Vec<PathBuf> {
        match self {
            Layout::None => Vec::new(),
            Layout::V2 { root } => vec![root.join(PARENT)],
            Layout::Hybrid {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
                unified,
            } => [memory, pids, cpu, cpuacct, freezer, unified]
                .into_iter()
                .flatten()
                .map(|p| p.join(PARENT))
                .collect(),
        }
    }

    pub fn enforced(&self) -> bool {
        !matches!(self, Layout::None)
    }

    /// Default freeze method on this layout.
    pub fn freeze_method(&self) -> FreezeMethod {
        match self {
            Layout::Hybrid {
                unified: Some(u), ..
            } if u.join("cgroup.freeze").exists()
                || u.join(PARENT).join("cgroup.freeze").exists() =>
            {
                FreezeMethod::V2
            }
            Layout::Hybrid { .. } => FreezeMethod::V1,
            _ => FreezeMethod::V2,
        }
    }

    pub fn sandbox(&self, id: &str) -> Cgroups {
        self.sandbox_with(id, self.freeze_method())
    }

    pub fn sandbox_with(&self, id: &str, freeze: FreezeMethod) -> Cgroups {
        Cgroups {
            layout: self.clone(),
            id: id.to_string(),
            freeze,
        }
    }
}

pub use remount::{Remount, favor_dynamic_moves, favordynmods_remount};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_take_whole_files_of_any_size_and_parse_cgroup_values() {
        let dir = tempfile::tempdir().unwrap();
        for size in [0usize, 5, 4095, 4096, 4097, 20_000] {
            let text: String = (0..size).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            let path = dir.path().join(format!("f{size}"));
            fs::write(&path, &text).unwrap();
            assert_eq!(read_small(fs::File::open(&path).unwrap()).unwrap(), text);
        }
        fs::write(dir.path().join("pids.max"), "max\n").unwrap();
        fs::write(dir.path().join("memory.current"), "123\n").unwrap();
        fs::write(
            dir.path().join("memory.events"),
            "low 0\noom 2\noom_kill 1\n",
        )
        .unwrap();
        let d = OpenDir::open(dir.path()).unwrap();
        assert_eq!(d.u64("pids.max"), Some(u64::MAX));
        assert_eq!(d.u64("memory.current"), Some(123));
        assert_eq!(d.keyed("memory.events", "oom_kill"), Some(1));
        assert_eq!(d.u64("absent"), None);
        assert_eq!(read_u64(&dir.path().join("memory.current")), Some(123));
    }

    pub(crate) const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
35 30 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_hybrid_layout() {
        let layout = Layout::parse_mountinfo(HYBRID);
        let Layout::Hybrid {
            memory,
            unified,
            cpuacct,
            ..
        } = &layout
        else {
            panic!("expected hybrid, got {layout:?}");
        };
        assert_eq!(memory.as_deref(), Some(Path::new("/sys/fs/cgroup/memory")));
        assert_eq!(
            cpuacct.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        assert_eq!(
            unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        let cg = layout.sandbox("sbx_x");
        assert!(cg.procs_files().contains(&PathBuf::from(
            "/sys/fs/cgroup/memory/sandbox-mcp/sbx_x/cgroup.procs"
        )));
    }

    #[test]
    fn parses_pure_v2() {
        let info = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            Layout::parse_mountinfo(info),
            Layout::V2 {
                root: PathBuf::from("/sys/fs/cgroup")
            }
        );
        assert_eq!(Layout::parse_mountinfo(""), Layout::None);
    }
}
