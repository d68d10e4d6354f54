//! Host-wide allocation of sandbox uid ranges.
//!
//! As root, each sandbox runs as its own range of host ids ([`super::plan::uid_base`]). The kernel
//! counts per-user budgets — pending signals, inotify instances, descriptors in flight over unix
//! sockets, processes — per host id, so two live sandboxes must never share a range, not even
//! when they belong to two engines with different data dirs. The registry is one small file for
//! the whole host, changed under an exclusive lock; each line claims one slot for one data dir.
//!
//! The same registry shares out the host's ptys. Every devpts instance but the host's own draws
//! on one pool (`kernel.pty.max - kernel.pty.reserve`), and a devpts instance's `max=` is fixed
//! when it is mounted, so each claim records the ptys its sandbox may hold, granted from what
//! the other claims left: sandboxes of all engines together never hold more than the pool.
//!
//! A claim lasts as long as its sandbox exists (its files and, when paused, its frozen processes
//! keep the ids): across engine restarts and reboots. A claim whose data dir no longer exists
//! belongs to a sandbox nothing can ever reach again (its engine's state went with the dir), so
//! the next claim on the host reaps it: every process running with an id of its range is killed
//! (its cgroups, frozen or not, first), and the claim, its range and its ptys go back to the pool.
//! A new claim that would get no ptys at all (other engines' live sandboxes hold the whole pool)
//! is refused with the reason, never granted a sandbox without them.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::plan::{MAX_SLOT, UID_RANGE, uid_base};

/// One claimed slot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    slot: u32,
    /// Ptys granted to the slot's sandbox (`None` in lines written before ptys were recorded).
    ptys: Option<u32>,
    /// The data dir of the engine whose sandbox holds the slot (canonical path).
    owner: String,
}

/// Why a claim was not granted.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The host has no range, or no pty, left for another sandbox: says what frees one.
    #[error("{0}")]
    Exhausted(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The registry, as seen by one engine (one data dir).
#[derive(Debug, Clone)]
pub struct Registry {
    path: PathBuf,
    owner: String,
}

impl Registry {
    /// The registry at `path`, for the engine on `data_dir`.
    pub fn new(path: PathBuf, data_dir: &Path) -> io::Result<Self> {
        let owner = fs::canonicalize(data_dir)?.to_string_lossy().into_owned();
        if owner.contains('\n') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the data dir path contains a newline",
            ));
        }
        Ok(Self { path, owner })
    }

    /// Claims the lowest free slot for a new sandbox, with up to `ptys` of the `pool` of ptys
    /// (fewer when other claims hold the rest).
    #[cfg(test)]
    pub fn claim(&self, ptys: u32, pool: u32) -> Result<u32, ClaimError> {
        Ok(self.claim_many(ptys, pool, 1)?[0])
    }

    /// Claims the `count` lowest free slots at once (a fork's children), each as [`Self::claim`]
    /// would: all or none, under one lock and one write of the file.
    pub fn claim_many(&self, ptys: u32, pool: u32, count: usize) -> Result<Vec<u32>, ClaimError> {
        self.locked(|claims| {
            reclaim_abandoned(claims);
            let granted: u32 = claims.iter().filter_map(|c| c.ptys).sum();
            if ptys > 0 && pool.saturating_sub(granted) == 0 {
                return Err(ClaimError::Exhausted(format!(
                    "the host's {pool} ptys are all held by the live sandboxes of the engines on this host; kill sandboxes (of any engine) or give the engines a smaller --max-sandboxes, so each sandbox's share of the ptys is smaller"
                )));
            }
            let slots: Vec<u32> = (1..=MAX_SLOT)
                .filter(|s| !claims.iter().any(|c| c.slot == *s))
                .take(count)
                .collect();
            if slots.is_empty() && count > 0 {
                return Err(ClaimError::Exhausted(
                    "every uid range on this host is in use; kill sandboxes (of any engine) first".into(),
                ));
            }
            if slots.len() < count {
                return Err(ClaimError::Exhausted(format!(
                    "only {} of the {count} uid ranges asked for are free on this host",
                    slots.len()
                )));
            }
            for &slot in &slots {
                let ptys = grant(claims, ptys, pool);
                claims.push(Claim {
                    slot,
                    ptys: Some(ptys),
                    owner: self.owner.clone(),
                });
            }
            Ok(slots)
        })?
    }

    /// The ptys granted to this engine's `slot` (`None` if it has no recorded grant).
    pub fn ptys(&self, slot: u32) -> io::Result<Option<u32>> {
        self.locked(|claims| {
            claims
                .iter()
                .find(|c| c.slot == slot && c.owner == self.owner)
                .and_then(|c| c.ptys)
        })
    }

    /// Gives a slot back (its sandbox is gone).
    pub fn release(&self, slot: u32) -> io::Result<()> {
        self.locked(|claims| claims.retain(|c| !(c.slot == slot && c.owner == self.owner)))
    }

    /// Makes the registry agree with the slots this engine's sandboxes hold: this data dir's
    /// claims that no sandbox holds are released, held slots missing from the registry are
    /// claimed again (with up to `ptys` of the `pool`). Returns the held slots that another data
    /// dir has claimed meanwhile.
    pub fn reconcile(&self, held: &[u32], ptys: u32, pool: u32) -> io::Result<Vec<u32>> {
        self.locked(|claims| {
            claims.retain(|c| c.owner != self.owner || held.contains(&c.slot));
            let mut conflicts = Vec::new();
            for slot in held {
                match claims.iter().find(|c| c.slot == *slot) {
                    Some(c) if c.owner == self.owner => {}
                    Some(_) => conflicts.push(*slot),
                    None => {
                        let ptys = grant(claims, ptys, pool);
                        claims.push(Claim {
                            slot: *slot,
                            ptys: Some(ptys),
                            owner: self.owner.clone(),
                        })
                    }
                }
            }
            conflicts
        })
    }

    /// Runs `f` on the claims under the registry's lock and writes them back if it changed them.
    fn locked<T>(&self, f: impl FnOnce(&mut Vec<Claim>) -> T) -> io::Result<T> {
        if let Some(parent) = self.path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        let _lock = sandbox_mcp_sys::durable::lock(&self.path.with_extension("lock"))?;
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let before = parse(&text);
        let mut claims = before.clone();
        let out = f(&mut claims);
        if claims != before {
            sandbox_mcp_sys::durable::write_atomically(
                &self.path,
                render(&claims).as_bytes(),
                0o644,
            )?;
        }
        Ok(out)
    }
}

/// Up to `want` ptys of what the `pool` has left after every claim's grant.
fn grant(claims: &[Claim], want: u32, pool: u32) -> u32 {
    let granted: u32 = claims.iter().filter_map(|c| c.ptys).sum();
    want.min(pool.saturating_sub(granted))
}

/// Reaps the claims whose data dir is gone: kills what still runs with their ids, and drops
/// each claim once nothing does.
fn reclaim_abandoned(claims: &mut Vec<Claim>) {
    let gone: Vec<std::ops::Range<u32>> = claims
        .iter()
        .filter(|c| !Path::new(&c.owner).is_dir())
        .map(|c| uid_base(c.slot)..uid_base(c.slot) + UID_RANGE)
        .collect();
    if gone.is_empty() {
        return;
    }
    let orphans: Vec<Proc> = processes()
        .into_iter()
        .filter(|p| p.uids.iter().any(|u| gone.iter().any(|r| r.contains(u))))
        .collect();
    if !orphans.is_empty() {
        reap(&orphans);
    }
    let live: Vec<u32> = processes().into_iter().flat_map(|p| p.uids).collect();
    claims.retain(|c| {
        let range = uid_base(c.slot)..uid_base(c.slot) + UID_RANGE;
        Path::new(&c.owner).is_dir() || live.iter().any(|uid| range.contains(uid))
    });
}

/// A process: its pid, the uids it runs with (real, effective, saved, filesystem) and its
/// sandbox's id, when its cgroup is a sandbox's.
struct Proc {
    pid: i32,
    uids: Vec<u32>,
    sandbox: Option<String>,
}

/// Every process on the host.
fn processes() -> Vec<Proc> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        // A zombie holds nothing but its pid until its parent reaps it.
        if status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains("Z (zombie)"))
        {
            continue;
        }
        let uids = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .map(|line| {
                line.split_whitespace()
                    .skip(1)
                    .filter_map(|u| u.parse::<u32>().ok())
                    .collect()
            })
            .unwrap_or_default();
        let sandbox = fs::read_to_string(entry.path().join("cgroup"))
            .ok()
            .and_then(|c| sandbox_of_cgroup(&c));
        out.push(Proc { pid, uids, sandbox });
    }
    out
}

/// The sandbox whose cgroup a `/proc/<pid>/cgroup` names (`…/sandbox-mcp/<id>`), if any.
fn sandbox_of_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let (_, rest) = path.split_once(&format!("/{}/", super::cgroups::PARENT))?;
        let id = rest.split('/').next()?;
        sandbox_mcp_model::ids::is_sandbox_id(id).then(|| id.to_string())
    })
}

/// Kills orphaned sandboxes: through their cgroups (which thaws a frozen one's processes and
/// leaves nothing a fork could save), then any process of theirs left outside one; the emptied
/// cgroups are removed.
fn reap(orphans: &[Proc]) {
    let layout = super::cgroups::Layout::detect();
    let mut sandboxes: Vec<&str> = orphans
        .iter()
        .filter_map(|p| p.sandbox.as_deref())
        .collect();
    sandboxes.sort_unstable();
    sandboxes.dedup();
    for id in &sandboxes {
        let cg = layout.sandbox(id);
        // A paused sandbox's processes take no signal until thawed (the v1 freezer).
        let _ = cg.thaw();
        if let Err(e) = cg.kill_all() {
            tracing::warn!(sandbox = %id, "cannot kill an orphaned sandbox: {e}");
        }
        let _ = cg.remove();
    }
    for p in orphans {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), nix::sys::signal::SIGKILL);
    }
    tracing::warn!(
        sandboxes = ?sandboxes,
        processes = orphans.len(),
        "reaped sandboxes whose engine's data dir is gone"
    );
    // Their pid namespaces' inits are gone; the kernel ends the rest. Wait a little for the
    // ids to be free (the claim is kept until they are).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let alive = |pid: i32| {
        fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains("Z (zombie)"))
        })
    };
    while std::time::Instant::now() < deadline && orphans.iter().any(|p| alive(p.pid)) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Lines are `slot ptys owner`; the owner is an absolute path, so an older line (`slot owner`)
/// is told apart by its second field.
fn parse(text: &str) -> Vec<Claim> {
    text.lines()
        .filter_map(|line| {
            let (slot, rest) = line.split_once(' ')?;
            let (ptys, owner) = match rest.split_once(' ') {
                Some((ptys, owner)) if !rest.starts_with('/') => (Some(ptys.parse().ok()?), owner),
                _ => (None, rest),
            };
            Some(Claim {
                slot: slot.parse().ok()?,
                ptys,
                owner: owner.to_string(),
            })
        })
        .collect()
}

fn render(claims: &[Claim]) -> String {
    claims
        .iter()
        .map(|c| match c.ptys {
            Some(p) => format!("{} {p} {}\n", c.slot, c.owner),
            None => format!("{} {}\n", c.slot, c.owner),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The registry at `<temp>/<registry>`, as seen by the engines of two data dirs.
    fn two_engines(registry: &str) -> (tempfile::TempDir, Registry, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let path = dir.path().join(registry);
        let ra = Registry::new(path.clone(), &a).unwrap();
        let rb = Registry::new(path, &b).unwrap();
        (dir, ra, rb)
    }

    #[test]
    fn two_data_dirs_get_disjoint_slots_and_release_them() {
        let (_dir, ra, rb) = two_engines("reg/uid-ranges");
        let s1 = ra.claim(10, 1000).unwrap();
        let s2 = rb.claim(10, 1000).unwrap();
        let s3 = ra.claim(10, 1000).unwrap();
        assert_eq!((s1, s2, s3), (1, 2, 3));
        rb.release(s2).unwrap();
        // Another data dir cannot release a slot it does not own.
        rb.release(s1).unwrap();
        assert_eq!(rb.claim(10, 1000).unwrap(), 2);
        assert_eq!(ra.claim(10, 1000).unwrap(), 4);
    }

    #[test]
    fn many_slots_are_claimed_at_once_into_the_gaps_or_none_are() {
        let (_dir, ra, rb) = two_engines("uid-ranges");
        assert_eq!(ra.claim_many(10, 1000, 3).unwrap(), vec![1, 2, 3]);
        ra.release(2).unwrap();
        assert_eq!(rb.claim_many(10, 1000, 2).unwrap(), vec![2, 4]);
        // Every grant is counted against the pool, as one claim after another would be.
        assert_eq!(ra.ptys(3).unwrap(), Some(10));
        let text = fs::read_to_string(&ra.path).unwrap();
        let before = parse(&text);
        let too_many = MAX_SLOT as usize;
        let err = ra.claim_many(10, 1000, too_many).unwrap_err();
        assert!(err.to_string().contains("uid ranges asked for"), "{err}");
        assert_eq!(
            parse(&fs::read_to_string(&ra.path).unwrap()),
            before,
            "a claim that cannot be met in full takes nothing"
        );
    }

    #[test]
    fn reconcile_releases_unheld_claims_and_reports_conflicts() {
        let (_dir, ra, rb) = two_engines("uid-ranges");
        assert_eq!(ra.claim(10, 1000).unwrap(), 1);
        assert_eq!(ra.claim(10, 1000).unwrap(), 2);
        assert_eq!(rb.claim(10, 1000).unwrap(), 3);
        // `a` only holds slot 2 now, and believes it holds 3 as well.
        assert_eq!(ra.reconcile(&[2, 3], 10, 1000).unwrap(), vec![3]);
        assert_eq!(rb.claim(10, 1000).unwrap(), 1, "slot 1 was released");
    }

    #[test]
    fn claims_of_a_vanished_data_dir_are_reaped_with_their_processes() {
        // Slots far above anything a real engine hands out, so the host's own sandboxes (whose
        // processes run in the low ranges) cannot interfere.
        let (free, held) = (MAX_SLOT - 1, MAX_SLOT - 2);
        let mut claims = vec![
            Claim {
                slot: free,
                ptys: None,
                owner: "/nonexistent/data".into(),
            },
            Claim {
                slot: held,
                ptys: None,
                owner: "/nonexistent/data".into(),
            },
            Claim {
                slot: 7,
                ptys: Some(1),
                owner: "/".into(),
            },
        ];
        // A process still running with an id of `held`'s range (as root, start one): an
        // orphan of the vanished engine, which no engine can reach any more.
        let mut child = nix::unistd::geteuid().is_root().then(|| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sleep")
                .arg("30")
                .uid(uid_base(held) + 1000)
                .spawn()
                .unwrap()
        });
        reclaim_abandoned(&mut claims);
        let slots: Vec<u32> = claims.iter().map(|c| c.slot).collect();
        assert_eq!(
            slots,
            vec![7],
            "both ranges are reclaimed; a live data dir's stays"
        );
        if let Some(c) = child.as_mut() {
            use std::os::unix::process::ExitStatusExt;
            let status = c.wait().unwrap();
            assert_eq!(status.signal(), Some(9), "the orphan was killed");
        }
    }

    #[test]
    fn sandbox_ids_are_read_from_cgroup_paths() {
        let id = sandbox_mcp_model::ids::sandbox_id();
        let v1 = format!("12:freezer:/sandbox-mcp/{id}\n11:memory:/sandbox-mcp/{id}\n0::/\n");
        assert_eq!(sandbox_of_cgroup(&v1).as_deref(), Some(id.as_str()));
        let v2 = format!("0::/system.slice/x.service/sandbox-mcp/{id}\n");
        assert_eq!(sandbox_of_cgroup(&v2).as_deref(), Some(id.as_str()));
        assert_eq!(sandbox_of_cgroup("0::/user.slice\n"), None);
        assert_eq!(sandbox_of_cgroup("0::/sandbox-mcp/not-an-id\n"), None);
    }

    #[test]
    fn ptys_are_granted_from_one_pool_across_data_dirs() {
        let (_dir, ra, rb) = two_engines("uid-ranges");
        // Each engine would give 40 of a pool of 100 (say, two sandboxes each at most): the
        // third claim gets what is left, so together they never hold more.
        let s1 = ra.claim(40, 100).unwrap();
        let s2 = rb.claim(40, 100).unwrap();
        let s3 = ra.claim(40, 100).unwrap();
        let got: Vec<_> = [(&ra, s1), (&rb, s2), (&ra, s3)]
            .iter()
            .map(|(r, s)| r.ptys(*s).unwrap().unwrap())
            .collect();
        assert_eq!(got, vec![40, 40, 20]);
        // Another data dir's slot is not this one's to look up.
        assert_eq!(ra.ptys(s2).unwrap(), None);
        // With the pool spent, a new claim is refused with the reason, never granted no ptys.
        for r in [&ra, &rb] {
            let e = r.claim(40, 100).unwrap_err().to_string();
            assert!(e.contains("ptys are all held"), "{e}");
        }
        // A released grant goes back to the pool.
        ra.release(s1).unwrap();
        let s5 = rb.claim(40, 100).unwrap();
        assert_eq!(rb.ptys(s5).unwrap(), Some(40));
    }

    #[test]
    fn older_lines_without_ptys_still_parse() {
        let claims = parse("3 /var/lib/data dir\n4 12 /srv/x\n");
        assert_eq!(
            claims,
            vec![
                Claim {
                    slot: 3,
                    ptys: None,
                    owner: "/var/lib/data dir".into()
                },
                Claim {
                    slot: 4,
                    ptys: Some(12),
                    owner: "/srv/x".into()
                },
            ]
        );
        assert_eq!(parse(&render(&claims)), claims);
    }
}
