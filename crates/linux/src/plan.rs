//! The launch plan: everything the launcher needs to start one sandbox, computed without
//! touching the system so it can be unit-tested. The engine builds it and hands it to the
//! launcher process as JSON on stdin.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// First host uid/gid of sandbox uid ranges. Far above ordinary users and subuid ranges.
pub const UID_BASE: u32 = 10_000_000;
/// Host ids reserved for each sandbox: ids 0..65534 inside are mapped to the first 65 535, and
/// the last one is the agent's own, never mapped into the sandbox.
pub const UID_RANGE: u32 = 65_536;
/// Ids visible inside a sandbox (0..65534; 65534 is `nobody`).
pub const MAPPED_IDS: u32 = UID_RANGE - 1;

/// One line of a uid_map/gid_map.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// An overlay filesystem to mount inside the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Layer {
    /// Mount point inside the sandbox (`/` for the root).
    pub target: String,
    /// Read-only lower directories on the host, top first.
    pub lowers: Vec<PathBuf>,
    /// The sandbox's own upper and work directories on the host.
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Empty host directories where, as root, the id-mapped copy of each of `lowers` is
    /// attached inside the sandbox's mount namespace (the overlay then uses those paths).
    pub staging: Vec<PathBuf>,
    /// How many of `lowers`, the first ones, are the sandbox's own earlier files (layers a fork
    /// or snapshot froze): stored as its upper is, so id-mapped as its directory is, not as the
    /// template's layers are.
    #[serde(default)]
    pub stacked: usize,
}

/// A named volume bind-mounted into the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Bind {
    /// The volume's directory on the host.
    pub source: PathBuf,
    /// Empty host directory where, as root, its id-mapped copy is attached first.
    pub staging: PathBuf,
    /// Mount point inside the sandbox (absolute, normalized).
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchPlan {
    pub sandbox_id: String,
    pub hostname: String,
    pub uid_map: IdMap,
    pub gid_map: IdMap,
    /// Running as real root: lower layers get idmapped mounts, supplementary groups are
    /// cleared. Otherwise a single-id user namespace is used.
    pub privileged: bool,
    /// As root, the host uid and gid the agent runs as: the last id of the sandbox's range, which
    /// is not mapped into the sandbox. The sandbox's user namespace is created under this id, so
    /// the kernel charges the sandbox's per-user budgets (inotify, pending signals, …) to it and
    /// not to root; and no capability held inside the sandbox applies to a process or file whose
    /// owner has no id there, so sandbox code cannot signal, trace, prlimit or reconfigure the
    /// agent. `None` when unprivileged: only the caller's own id exists to map.
    pub agent_id: Option<u32>,
    /// `cgroup.procs` files the launcher joins before creating the sandbox.
    pub cgroup_procs: Vec<PathBuf>,
    /// Where the agent's listening socket is bound (on the host).
    pub socket_path: PathBuf,
    /// Empty host directory the root overlay is mounted on before pivot_root.
    pub rootfs: PathBuf,
    /// Root layer first, then layers mounted below it.
    pub layers: Vec<Layer>,
    /// Environment of the agent, and so of every command (the sandbox's `env_vars`).
    pub env: Vec<(String, String)>,
    /// Size of the /dev/shm tmpfs.
    pub shm_bytes: u64,
    /// Most ptys the sandbox's devpts instance hands out: every devpts instance but the host's
    /// shares `kernel.pty.max - kernel.pty.reserve`, so each sandbox gets its share of it.
    pub pty_max: u32,
    /// Mount the sandbox's /proc read-only. Unprivileged, the agent and sandbox code share one
    /// host uid, so file permissions cannot keep sandbox code from writing the agent's
    /// `/proc/1/oom_score_adj`; a read-only /proc can.
    pub proc_readonly: bool,
    /// Working directory of commands that name none (made if missing, as for an image's
    /// `WORKDIR`).
    #[serde(default)]
    pub workdir: Option<String>,
    /// uid and gid commands run as. Only as root: unprivileged, only root is mapped.
    #[serde(default)]
    pub user: Option<(u32, u32)>,
    /// As root, when the sandbox's directory stores its files under another range's host ids
    /// (a forked or merged sandbox keeps those of the one its files came from, so a fork never
    /// rewrites ownership file by file): the first of those ids. The launcher mounts the
    /// directory id-mapped from that range to this sandbox's before the overlays use it.
    #[serde(default)]
    pub disk_ids: Option<u32>,
    /// Named volumes, mounted after the overlays.
    #[serde(default)]
    pub volumes: Vec<Bind>,
    /// What the sandbox reads as `/proc/sys/kernel/random/boot_id` (a UUID and a newline): each
    /// sandbox has its own, new at each cold start, so the host's (which would tell tenants
    /// they share a machine) is never seen.
    #[serde(default)]
    pub boot_id: Option<String>,
}

/// What the engine knows about a sandbox when it launches it.
pub struct PlanInput<'a> {
    pub sandbox_id: &'a str,
    pub sandbox_dir: &'a Path,
    /// The template's overlays, the root's first.
    pub mounts: &'a [sandbox_mcp_model::driver::MountLayers],
    /// Slot of the sandbox's uid range (privileged mode).
    pub uid_slot: u32,
    /// Real uid/gid of the engine.
    pub host_uid: u32,
    pub host_gid: u32,
    pub cgroup_procs: Vec<PathBuf>,
    pub env: &'a [(String, String)],
    pub memory_bytes: u64,
    /// This sandbox's share of the host's ptys.
    pub pty_max: u32,
    pub workdir: Option<&'a str>,
    pub user: Option<(u32, u32)>,
    /// First host id the sandbox directory's files are stored under (see [`LaunchPlan::disk_ids`]).
    pub disk_ids: Option<u32>,
    /// Named volumes: the host directory, the mount point, read-only.
    pub volumes: &'a [(PathBuf, String, bool)],
    /// The layers the sandbox's own files stack on (see `driver::stack`), top first: each holds
    /// a directory per overlay, as the upper does.
    pub stacked: &'a [PathBuf],
    /// The sandbox's boot id (see [`LaunchPlan::boot_id`]).
    pub boot_id: &'a str,
    /// Where the agent's socket is bound (on the host).
    pub socket: &'a Path,
}

/// First host id of a slot's range. Never 0: a sandbox is never mapped to host root.
pub fn uid_base(slot: u32) -> u32 {
    UID_BASE + slot * UID_RANGE
}

/// The agent's host id in a slot's range: the one id of the range not mapped into the sandbox.
pub fn agent_id(slot: u32) -> u32 {
    uid_base(slot) + MAPPED_IDS
}

/// Highest slot whose range still fits in 32-bit ids.
pub const MAX_SLOT: u32 = (u32::MAX - UID_BASE) / UID_RANGE - 1;

/// The ptys every devpts instance but the host's may hold together: `kernel.pty.max -
/// kernel.pty.reserve` (the kernel's defaults when they cannot be read).
pub fn pty_pool() -> u32 {
    let read = |name: &str, default: u32| {
        std::fs::read_to_string(format!("/proc/sys/kernel/pty/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default)
    };
    read("max", 4096).saturating_sub(read("reserve", 1024))
}

/// The fewest sandboxes the host's ptys are shared out between, whatever an engine's
/// `--max-sandboxes`: an engine that allows two sandboxes must not give each half of the pool
/// that every engine on the host draws on (two such sandboxes would leave the others none).
pub const PTY_SHARES: usize = 100;

/// Each sandbox's share of the `pool` of ptys non-initial devpts instances may hold together
/// (`kernel.pty.max - kernel.pty.reserve`), when at most `sandboxes` exist at once: never more
/// than a [`PTY_SHARES`]th of it. As root, the uid range registry grants it only while the pool
/// lasts, across engines.
pub fn pty_share(pool: u32, sandboxes: usize) -> u32 {
    pool / (sandboxes.max(PTY_SHARES) as u32)
}

/// Where a sandbox's directories are, relative to its directory.
pub fn upper_dir(sandbox_dir: &Path, layer: &str) -> PathBuf {
    sandbox_dir.join("upper").join(layer_name(layer))
}

pub fn work_dir(sandbox_dir: &Path, layer: &str) -> PathBuf {
    sandbox_dir.join("work").join(layer_name(layer))
}

/// Where the `index`th named volume is attached (as root) before it is mounted in place.
pub fn volume_staging(sandbox_dir: &Path, index: usize) -> PathBuf {
    sandbox_dir.join("vol").join(index.to_string())
}

/// Where the `index`th lower directory of the overlay at `layer` is attached (as root).
pub fn staging_dir(sandbox_dir: &Path, layer: &str, index: usize) -> PathBuf {
    let name = layer_name(layer);
    // The first keeps the name sandboxes made before templates had layers used.
    let name = if index == 0 {
        name
    } else {
        format!("{name}.{index}")
    };
    sandbox_dir.join("lower").join(name)
}

pub use sandbox_mcp_sys::layers::layer_name;

pub fn build(input: &PlanInput<'_>) -> LaunchPlan {
    let privileged = input.host_uid == 0;
    let (uid_map, gid_map) = if privileged {
        let base = uid_base(input.uid_slot);
        let map = IdMap {
            inside: 0,
            outside: base,
            count: MAPPED_IDS,
        };
        (map, map)
    } else {
        (
            IdMap {
                inside: 0,
                outside: input.host_uid,
                count: 1,
            },
            IdMap {
                inside: 0,
                outside: input.host_gid,
                count: 1,
            },
        )
    };
    let layers = input
        .mounts
        .iter()
        .map(|m| {
            let lowers: Vec<PathBuf> = input
                .stacked
                .iter()
                .map(|layer| layer.join(layer_name(&m.target)))
                .chain(m.lowers.iter().cloned())
                .collect();
            Layer {
                target: m.target.clone(),
                upper: upper_dir(input.sandbox_dir, &m.target),
                work: work_dir(input.sandbox_dir, &m.target),
                staging: (0..lowers.len())
                    .map(|i| staging_dir(input.sandbox_dir, &m.target, i))
                    .collect(),
                lowers,
                stacked: input.stacked.len(),
            }
        })
        .collect();
    LaunchPlan {
        sandbox_id: input.sandbox_id.to_string(),
        hostname: "sandbox".into(),
        uid_map,
        gid_map,
        privileged,
        agent_id: privileged.then(|| agent_id(input.uid_slot)),
        cgroup_procs: input.cgroup_procs.clone(),
        socket_path: input.socket.to_path_buf(),
        rootfs: input.sandbox_dir.join("rootfs"),
        layers,
        env: input.env.to_vec(),
        // /dev/shm counts against the sandbox's memory; a quarter of it, at most 256 MiB.
        shm_bytes: (input.memory_bytes / 4).clamp(1 << 20, 256 << 20),
        pty_max: input.pty_max,
        proc_readonly: !privileged,
        workdir: input.workdir.map(str::to_string),
        user: input.user.filter(|_| privileged),
        disk_ids: input
            .disk_ids
            .filter(|&ids| privileged && ids != uid_base(input.uid_slot)),
        volumes: input
            .volumes
            .iter()
            .enumerate()
            .map(|(i, (source, target, read_only))| Bind {
                source: source.clone(),
                staging: volume_staging(input.sandbox_dir, i),
                target: target.clone(),
                read_only: *read_only,
            })
            .collect(),
        boot_id: Some(input.boot_id.to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    use sandbox_mcp_model::driver::MountLayers;

    fn mounts(host_dirs: &[&str]) -> Vec<MountLayers> {
        let mut out = vec![MountLayers {
            target: "/".into(),
            lowers: vec![
                PathBuf::from("/data/layers/ab/root"),
                PathBuf::from("/data/templates/base/rootfs"),
            ],
        }];
        out.extend(host_dirs.iter().map(|d| MountLayers {
            target: d.to_string(),
            lowers: vec![PathBuf::from(d)],
        }));
        out
    }

    fn input<'a>(
        uid: u32,
        mounts: &'a [MountLayers],
        env: &'a [(String, String)],
    ) -> PlanInput<'a> {
        PlanInput {
            sandbox_id: "sbx_a",
            sandbox_dir: Path::new("/data/sandboxes/sbx_a"),
            mounts,
            uid_slot: 3,
            host_uid: uid,
            host_gid: uid,
            cgroup_procs: vec![],
            env,
            memory_bytes: 512 << 20,
            pty_max: 30,
            workdir: None,
            user: None,
            disk_ids: None,
            volumes: &[],
            stacked: &[],
            boot_id: "00000000-0000-4000-8000-000000000000\n",
            socket: Path::new("/data/agents/sbx_x.sock"),
        }
    }

    #[test]
    fn root_maps_to_an_unprivileged_range_never_zero() {
        let dirs = mounts(&["/usr"]);
        let plan = build(&input(0, &dirs, &[]));
        assert!(plan.privileged);
        assert_eq!(plan.uid_map.inside, 0);
        assert_eq!(plan.uid_map.outside, UID_BASE + 3 * UID_RANGE);
        assert_ne!(plan.uid_map.outside, 0);
        assert_eq!(plan.uid_map.count, UID_RANGE - 1);
        // The agent's id is the range's last: inside the slot, outside what the sandbox sees.
        let agent = plan.agent_id.unwrap();
        assert_eq!(agent, UID_BASE + 4 * UID_RANGE - 1);
        assert!(agent >= plan.uid_map.outside + plan.uid_map.count);
        assert!(!plan.proc_readonly);
        assert_eq!(plan.layers.len(), 2);
        assert_eq!(plan.layers[0].target, "/");
        assert_eq!(
            plan.layers[0].upper,
            PathBuf::from("/data/sandboxes/sbx_a/upper/root")
        );
        assert_eq!(plan.layers[1].lowers, [PathBuf::from("/usr")]);
        // One staging directory per lower, the first under the name older sandboxes used.
        assert_eq!(
            plan.layers[0].staging,
            [
                PathBuf::from("/data/sandboxes/sbx_a/lower/root"),
                PathBuf::from("/data/sandboxes/sbx_a/lower/root.1")
            ]
        );
        assert_eq!(
            plan.layers[1].work,
            PathBuf::from("/data/sandboxes/sbx_a/work/usr")
        );
        assert_eq!(plan.shm_bytes, 128 << 20);
    }

    #[test]
    fn stacked_layers_go_between_the_upper_and_the_templates_layers_in_every_overlay() {
        let dirs = mounts(&["/usr"]);
        let stacked = [
            PathBuf::from("/data/sandboxes/.layers/b"),
            PathBuf::from("/data/sandboxes/.layers/a"),
        ];
        let plan = build(&PlanInput {
            stacked: &stacked,
            ..input(0, &dirs, &[])
        });
        assert_eq!(
            plan.layers[0].lowers,
            [
                PathBuf::from("/data/sandboxes/.layers/b/root"),
                PathBuf::from("/data/sandboxes/.layers/a/root"),
                PathBuf::from("/data/layers/ab/root"),
                PathBuf::from("/data/templates/base/rootfs"),
            ]
        );
        assert_eq!(
            plan.layers[1].lowers,
            [
                PathBuf::from("/data/sandboxes/.layers/b/usr"),
                PathBuf::from("/data/sandboxes/.layers/a/usr"),
                PathBuf::from("/usr"),
            ]
        );
        assert!(plan.layers.iter().all(|l| l.stacked == 2));
        assert!(
            plan.layers
                .iter()
                .all(|l| l.staging.len() == l.lowers.len())
        );
    }

    #[test]
    fn unprivileged_maps_only_the_callers_id() {
        let plan = build(&input(1000, &mounts(&[]), &[]));
        assert!(!plan.privileged);
        assert_eq!(plan.agent_id, None);
        assert!(plan.proc_readonly);
        assert_eq!(
            plan.uid_map,
            IdMap {
                inside: 0,
                outside: 1000,
                count: 1
            }
        );
    }

    #[test]
    fn ranges_of_neighbouring_slots_never_overlap() {
        for slot in [1, 2, 1000, MAX_SLOT - 1] {
            assert!(agent_id(slot) < uid_base(slot + 1));
            assert!(uid_base(slot) > 0);
        }
        assert!(u64::from(agent_id(MAX_SLOT)) <= u64::from(u32::MAX));
    }

    #[test]
    fn ptys_are_partitioned_between_sandboxes() {
        assert_eq!(pty_share(3072, 100), 30);
        assert!(pty_share(3072, 100) * 100 <= 3072);
        assert_eq!(pty_share(3072, 1000), 3);
        // An engine allowing few sandboxes gets no larger shares: before, `--max-sandboxes 2`
        // gave each of its sandboxes half of the host's pool.
        assert_eq!(pty_share(3072, 2), 30);
        assert_eq!(pty_share(3072, 0), 30);
        assert_eq!(pty_share(0, 10), 0);
    }
}
