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
//! keep the ids): across engine restarts and reboots. Claims of a data dir that no longer exists
//! are reclaimed, but only once no process runs with an id of that range.

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

/// The registry, as seen by one engine (one data dir).
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    path: PathBuf,
    owner: String,
}

impl Registry {
    /// The registry at `path`, for the engine on `data_dir`.
    pub(crate) fn new(path: PathBuf, data_dir: &Path) -> io::Result<Self> {
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
    pub(crate) fn claim(&self, ptys: u32, pool: u32) -> io::Result<u32> {
        Ok(self.claim_many(ptys, pool, 1)?[0])
    }

    /// Claims the `count` lowest free slots at once (a fork's children), each as [`Self::claim`]
    /// would: all or none, under one lock and one write of the file.
    pub(crate) fn claim_many(&self, ptys: u32, pool: u32, count: usize) -> io::Result<Vec<u32>> {
        self.locked(|claims| {
            reclaim_abandoned(claims);
            let slots: Vec<u32> = (1..=MAX_SLOT)
                .filter(|s| !claims.iter().any(|c| c.slot == *s))
                .take(count)
                .collect();
            if slots.is_empty() && count > 0 {
                return Err(io::Error::other("every uid range on this host is in use"));
            }
            if slots.len() < count {
                return Err(io::Error::other(format!(
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
    pub(crate) fn ptys(&self, slot: u32) -> io::Result<Option<u32>> {
        self.locked(|claims| {
            claims
                .iter()
                .find(|c| c.slot == slot && c.owner == self.owner)
                .and_then(|c| c.ptys)
        })
    }

    /// Gives a slot back (its sandbox is gone).
    pub(crate) fn release(&self, slot: u32) -> io::Result<()> {
        self.locked(|claims| claims.retain(|c| !(c.slot == slot && c.owner == self.owner)))
    }

    /// Makes the registry agree with the slots this engine's sandboxes hold: this data dir's
    /// claims that no sandbox holds are released, held slots missing from the registry are
    /// claimed again (with up to `ptys` of the `pool`). Returns the held slots that another data
    /// dir has claimed meanwhile.
    pub(crate) fn reconcile(&self, held: &[u32], ptys: u32, pool: u32) -> io::Result<Vec<u32>> {
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
        let _lock = crate::durable::lock(&self.path.with_extension("lock"))?;
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let before = parse(&text);
        let mut claims = before.clone();
        let out = f(&mut claims);
        if claims != before {
            crate::durable::write_atomically(&self.path, render(&claims).as_bytes(), 0o644)?;
        }
        Ok(out)
    }
}

/// Up to `want` ptys of what the `pool` has left after every claim's grant.
fn grant(claims: &[Claim], want: u32, pool: u32) -> u32 {
    let granted: u32 = claims.iter().filter_map(|c| c.ptys).sum();
    want.min(pool.saturating_sub(granted))
}

/// Drops claims whose data dir is gone, once no process holds an id of their range.
fn reclaim_abandoned(claims: &mut Vec<Claim>) {
    let gone: Vec<u32> = claims
        .iter()
        .filter(|c| !Path::new(&c.owner).is_dir())
        .map(|c| c.slot)
        .collect();
    if gone.is_empty() {
        return;
    }
    let live = live_uids();
    claims.retain(|c| {
        if !gone.contains(&c.slot) {
            return true;
        }
        let range = uid_base(c.slot)..uid_base(c.slot) + UID_RANGE;
        live.iter().any(|uid| range.contains(uid))
    });
}

/// Every uid some process runs with (real, effective, saved or filesystem).
fn live_uids() -> Vec<u32> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut uids = Vec::new();
    for entry in procs.flatten() {
        if !entry.file_name().as_encoded_bytes()[0].is_ascii_digit() {
            continue;
        }
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) {
            uids.extend(
                line.split_whitespace()
                    .skip(1)
                    .filter_map(|u| u.parse::<u32>().ok()),
            );
        }
    }
    uids.sort_unstable();
    uids.dedup();
    uids
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
    fn claims_of_a_vanished_data_dir_are_reclaimed_unless_a_process_holds_the_range() {
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
        // A process still running with an id of `held`'s range (as root, start one).
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
        if let Some(c) = child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
            assert_eq!(slots, vec![held, 7], "a live process keeps the range");
        } else {
            assert_eq!(slots, vec![7]);
        }
    }

    #[test]
    fn ptys_are_granted_from_one_pool_across_data_dirs() {
        let (_dir, ra, rb) = two_engines("uid-ranges");
        // Each engine would give 40 of a pool of 100 (say, two sandboxes each at most): the
        // third claim gets what is left, the fourth none, so together they never hold more.
        let s1 = ra.claim(40, 100).unwrap();
        let s2 = rb.claim(40, 100).unwrap();
        let s3 = ra.claim(40, 100).unwrap();
        let s4 = rb.claim(40, 100).unwrap();
        let got: Vec<_> = [s1, s2, s3, s4]
            .iter()
            .map(|s| {
                let r = if *s == s1 || *s == s3 { &ra } else { &rb };
                r.ptys(*s).unwrap().unwrap()
            })
            .collect();
        assert_eq!(got, vec![40, 40, 20, 0]);
        // Another data dir's slot is not this one's to look up.
        assert_eq!(ra.ptys(s2).unwrap(), None);
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
