//! The launch plan: everything the launcher needs to start one sandbox, computed without
//! touching the system so it can be unit-tested. The engine builds it and hands it to the
//! launcher process as JSON on stdin.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// First host uid/gid of sandbox uid ranges. Far above ordinary users and subuid ranges.
pub const UID_BASE: u32 = 10_000_000;
/// Ids each sandbox gets (0..65535 inside).
pub const UID_RANGE: u32 = 65_536;

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
    /// Read-only lower directory on the host.
    pub lower: PathBuf,
    /// The sandbox's own upper and work directories on the host.
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Empty host directory where, as root, the id-mapped copy of `lower` is attached inside the
    /// sandbox's mount namespace (the overlay then uses that path as its lower layer).
    pub staging: PathBuf,
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
}

/// What the engine knows about a sandbox when it launches it.
pub struct PlanInput<'a> {
    pub sandbox_id: &'a str,
    pub sandbox_dir: &'a Path,
    /// The template's root filesystem (lower of the root overlay).
    pub template_rootfs: &'a Path,
    /// Host directories overlaid read-only at the same path (e.g. /usr).
    pub host_dirs: &'a [PathBuf],
    /// Slot of the sandbox's uid range (privileged mode).
    pub uid_slot: u32,
    /// Real uid/gid of the engine.
    pub host_uid: u32,
    pub host_gid: u32,
    pub cgroup_procs: Vec<PathBuf>,
    pub env: &'a [(String, String)],
    pub memory_bytes: u64,
}

/// First host id of a slot's range. Never 0: a sandbox is never mapped to host root.
pub fn uid_base(slot: u32) -> u32 {
    UID_BASE + slot * UID_RANGE
}

/// Where a sandbox's directories are, relative to its directory.
pub fn upper_dir(sandbox_dir: &Path, layer: &str) -> PathBuf {
    sandbox_dir.join("upper").join(layer_name(layer))
}

pub fn work_dir(sandbox_dir: &Path, layer: &str) -> PathBuf {
    sandbox_dir.join("work").join(layer_name(layer))
}

pub fn staging_dir(sandbox_dir: &Path, layer: &str) -> PathBuf {
    sandbox_dir.join("lower").join(layer_name(layer))
}

fn layer_name(target: &str) -> String {
    let trimmed = target.trim_matches('/');
    if trimmed.is_empty() {
        "root".into()
    } else {
        trimmed.replace('/', "_")
    }
}

pub fn build(input: &PlanInput<'_>) -> LaunchPlan {
    let privileged = input.host_uid == 0;
    let (uid_map, gid_map) = if privileged {
        let base = uid_base(input.uid_slot);
        let map = IdMap {
            inside: 0,
            outside: base,
            count: UID_RANGE,
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
    let mut layers = vec![Layer {
        target: "/".into(),
        lower: input.template_rootfs.to_path_buf(),
        upper: upper_dir(input.sandbox_dir, "/"),
        work: work_dir(input.sandbox_dir, "/"),
        staging: staging_dir(input.sandbox_dir, "/"),
    }];
    for dir in input.host_dirs {
        let target = dir.display().to_string();
        layers.push(Layer {
            upper: upper_dir(input.sandbox_dir, &target),
            work: work_dir(input.sandbox_dir, &target),
            staging: staging_dir(input.sandbox_dir, &target),
            lower: dir.clone(),
            target,
        });
    }
    LaunchPlan {
        sandbox_id: input.sandbox_id.to_string(),
        hostname: "sandbox".into(),
        uid_map,
        gid_map,
        privileged,
        cgroup_procs: input.cgroup_procs.clone(),
        socket_path: input.sandbox_dir.join("agent.sock"),
        rootfs: input.sandbox_dir.join("rootfs"),
        layers,
        env: input.env.to_vec(),
        // /dev/shm counts against the sandbox's memory; a quarter of it, at most 256 MiB.
        shm_bytes: (input.memory_bytes / 4).clamp(1 << 20, 256 << 20),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn input<'a>(uid: u32, dirs: &'a [PathBuf], env: &'a [(String, String)]) -> PlanInput<'a> {
        PlanInput {
            sandbox_id: "sbx_a",
            sandbox_dir: Path::new("/data/sandboxes/sbx_a"),
            template_rootfs: Path::new("/data/templates/base/rootfs"),
            host_dirs: dirs,
            uid_slot: 3,
            host_uid: uid,
            host_gid: uid,
            cgroup_procs: vec![],
            env,
            memory_bytes: 512 << 20,
        }
    }

    #[test]
    fn root_maps_to_an_unprivileged_range_never_zero() {
        let dirs = [PathBuf::from("/usr")];
        let plan = build(&input(0, &dirs, &[]));
        assert!(plan.privileged);
        assert_eq!(plan.uid_map.inside, 0);
        assert_eq!(plan.uid_map.outside, UID_BASE + 3 * UID_RANGE);
        assert_ne!(plan.uid_map.outside, 0);
        assert_eq!(plan.uid_map.count, UID_RANGE);
        assert_eq!(plan.layers.len(), 2);
        assert_eq!(plan.layers[0].target, "/");
        assert_eq!(
            plan.layers[0].upper,
            PathBuf::from("/data/sandboxes/sbx_a/upper/root")
        );
        assert_eq!(plan.layers[1].lower, PathBuf::from("/usr"));
        assert_eq!(
            plan.layers[1].work,
            PathBuf::from("/data/sandboxes/sbx_a/work/usr")
        );
        assert_eq!(plan.shm_bytes, 128 << 20);
    }

    #[test]
    fn unprivileged_maps_only_the_callers_id() {
        let plan = build(&input(1000, &[], &[]));
        assert!(!plan.privileged);
        assert_eq!(
            plan.uid_map,
            IdMap {
                inside: 0,
                outside: 1000,
                count: 1
            }
        );
    }
}
