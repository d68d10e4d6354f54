//! Carrying a running sandbox's processes into another sandbox with CRIU (see [`crate::criu`]):
//! which trees the agent has, dumping each while the rest of the sandbox is stopped, and
//! restoring them into a target whose agent made their new pipes and then takes them over.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sandbox_mcp_model::driver::LiveReport;
use sandbox_mcp_protocol::{Adopt, ListTrees, MakePipes, Tree};

use super::*;
use crate::criu::{self, Criu};

/// Where checkpoints live: beside the sandboxes, readable by the engine only.
const LIVE_DIR: &str = "live";
/// A tree's description beside its dump.
const TREE_FILE: &str = "tree.json";

impl NamespacesDriver {
    fn criu(&self) -> Result<&Criu, DriverError> {
        self.criu
            .as_ref()
            .map_err(|why| DriverError::Unsupported(why.clone()))
    }

    fn live_dir(&self, name: &str) -> PathBuf {
        let base = self.sandboxes_dir.parent().unwrap_or(&self.sandboxes_dir);
        base.join(LIVE_DIR).join(name)
    }

    fn running_agent(&self, id: &str) -> Result<i32, DriverError> {
        self.agent_pid(id)
            .ok_or_else(|| DriverError::Agent("the sandbox's agent is not running".into()))
    }

    pub(super) async fn live_checkpoint(
        &self,
        id: &str,
        name: &str,
    ) -> Result<LiveReport, DriverError> {
        let criu = self.criu()?.clone();
        let agent = self.running_agent(id)?;
        let list = self
            .ask(id, ListTrees {})
            .await
            .map_err(|e| DriverError::Agent(format!("cannot list the sandbox's processes: {e}")))?;
        let dir = self.live_dir(name);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(DriverError::io("create the checkpoint directory"))?;
        let mut report = LiveReport {
            carried: Vec::new(),
            skipped: list.skipped,
        };
        // Every process of the trees the agent named: any other (a command running now, one a
        // job left behind) is not carried, and is said to be.
        let mut accounted: HashSet<i32> = HashSet::from([agent]);
        let pids = self.cgroups(id).pids();
        let roots: Vec<Option<i32>> = list
            .trees
            .iter()
            .map(|tree| {
                pids.iter()
                    .copied()
                    .find(|p| *p != agent && criu::inner_pid(*p) == Some(tree.pid))
            })
            .collect();
        for (i, tree) in list.trees.into_iter().enumerate() {
            let what = tree.kind.describe();
            let Some(root) = roots[i] else {
                report.skipped.push(format!("{what} (its process is gone)"));
                continue;
            };
            // The tree runs (stopped for an earlier tree's dump, it is continued for its own);
            // the rest of the sandbox is stopped once CRIU has frozen it.
            for p in criu::tree_pids(root) {
                let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
            }
            let next = roots[i + 1..].iter().flatten().next().copied();
            let sub = dir.join(format!("tree-{i}"));
            let cgroups = self.cgroups(id);
            let dumped = dump_one(&criu, cgroups, agent, (root, next), &tree, &sub).await;
            // Dumped, the tree is stopped: its processes are all there.
            accounted.extend(criu::tree_pids(root));
            match dumped {
                Ok(()) => report.carried.push(what),
                Err(e) => {
                    let _ = fs::remove_dir_all(&sub);
                    report.skipped.push(format!("{what} ({e})"));
                }
            }
        }
        let outside = self
            .cgroups(id)
            .pids()
            .into_iter()
            .filter(|p| !accounted.contains(p))
            .count();
        if outside > 0 {
            report.skipped.push(format!(
                "{outside} process(es) outside every job and code context (a command running now, or one a job left behind)"
            ));
        }
        Ok(report)
    }

    pub(super) fn live_continue(&self, id: &str) {
        let agent = self.agent_pid(id);
        for p in self.cgroups(id).pids() {
            if Some(p) != agent {
                let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
            }
        }
    }

    pub(super) async fn live_restore(
        &self,
        id: &str,
        name: &str,
    ) -> Result<LiveReport, DriverError> {
        let criu = self.criu()?.clone();
        let agent = self.running_agent(id)?;
        let dir = self.live_dir(name);
        let mut subs: Vec<PathBuf> = fs::read_dir(&dir)
            .map_err(DriverError::io("read the checkpoint"))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join(TREE_FILE).is_file())
            .collect();
        subs.sort();
        let procs = if self.layout.enforced() {
            self.cgroups(id).procs_files()
        } else {
            Vec::new()
        };
        let mut report = LiveReport::default();
        for (i, sub) in subs.iter().enumerate() {
            let tree: Tree = match fs::read(sub.join(TREE_FILE))
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(t) => t,
                Err(e) => {
                    report.skipped.push(format!("a process tree ({e})"));
                    continue;
                }
            };
            let what = tree.kind.describe();
            match self
                .restore_one(&criu, id, agent, &procs, sub, &tree, i)
                .await
            {
                Ok(()) => report.carried.push(what),
                Err(e) => report.skipped.push(format!("{what} ({e})")),
            }
        }
        // Each tree came back stopped: one restored before another must not run yet, since a
        // process it starts takes the lowest free pid of the namespace, which may be one a tree
        // restored after it needs back. Now every one runs (the sandbox, just started, has no
        // other process but its agent).
        self.live_continue(id);
        Ok(report)
    }

    #[allow(clippy::too_many_arguments)]
    async fn restore_one(
        &self,
        criu: &Criu,
        id: &str,
        agent: i32,
        procs: &[PathBuf],
        sub: &Path,
        tree: &Tree,
        i: usize,
    ) -> io::Result<()> {
        let key = format!("restore-{i}");
        let roles = tree.pipes.iter().map(|p| p.role).collect::<Vec<_>>();
        let (fds, _) = self
            .ask_for_fds(
                id,
                MakePipes {
                    key: key.clone(),
                    roles: roles.clone(),
                },
            )
            .await?;
        if fds.len() != roles.len() {
            return Err(io::Error::other("the agent made the wrong pipes"));
        }
        let pipes = tree.pipes.iter().map(|p| p.inode).zip(fds).collect();
        let (criu, sub, procs, root_pid) =
            (criu.clone(), sub.to_path_buf(), procs.to_vec(), tree.pid);
        let restored = tokio::task::spawn_blocking(move || {
            criu::restore(
                &criu,
                criu::Restore {
                    agent,
                    cgroup_procs: &procs,
                    dir: &sub,
                    root_pid,
                    pipes,
                },
            )
        })
        .await
        .map_err(io::Error::other)
        .and_then(|r| r);
        let pid = restored.is_ok().then_some(tree.pid);
        let adopted = self
            .ask(
                id,
                Adopt {
                    key,
                    tree: tree.clone(),
                    pid,
                },
            )
            .await;
        restored?;
        adopted.map(|_| ())
    }

    pub(super) fn live_bytes(&self, name: &str) -> Option<u64> {
        if name.is_empty() || name.contains('/') {
            return None;
        }
        let dir = self.live_dir(name);
        let trees = fs::read_dir(&dir).ok()?;
        let mut total = 0;
        for tree in trees.flatten() {
            for file in fs::read_dir(tree.path()).into_iter().flatten().flatten() {
                total += file.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        Some(total)
    }

    pub(super) fn live_copy(&self, from: &str, to: &str) -> Result<(), DriverError> {
        let named = |n: &str| !n.is_empty() && !n.contains('/');
        if !named(from) || !named(to) {
            return Err(DriverError::io("copy a checkpoint")(io::Error::other(
                "not a checkpoint's name",
            )));
        }
        let (src, dst) = (self.live_dir(from), self.live_dir(to));
        let copied = link_tree(&src, &dst);
        if copied.is_err() {
            let _ = fs::remove_dir_all(&dst);
        }
        copied.map_err(DriverError::io("copy a checkpoint"))
    }

    /// TCP sockets of the sandbox's network namespace that are neither listening nor closed.
    /// A table is read only when the namespace's own count of its TCP sockets
    /// (`/proc/<agent>/net/sockstat{,6}`: listening, or connected in any state but TIME_WAIT) is
    /// not 0: the kernel lists a table by walking the host's whole hash of connections, every
    /// namespace's, a few milliseconds however few the sandbox has.
    pub(super) fn live_connections(&self, id: &str) -> Option<u64> {
        let agent = self.agent_pid(id)?;
        let mut open = 0;
        for (table, stat, label) in [("tcp", "sockstat", "TCP:"), ("tcp6", "sockstat6", "TCP6:")] {
            match fs::read_to_string(format!("/proc/{agent}/net/{stat}")) {
                Ok(text) if sockets_in_use(&text, label) == Some(0) => continue,
                Ok(_) => {}
                Err(e) if table == "tcp6" && e.kind() == io::ErrorKind::NotFound => continue,
                Err(_) => return None,
            }
            let text = match fs::read_to_string(format!("/proc/{agent}/net/{table}")) {
                Ok(text) => text,
                // A kernel without IPv6 has no tcp6 table, and no such connection.
                Err(e) if table == "tcp6" && e.kind() == io::ErrorKind::NotFound => continue,
                Err(_) => return None,
            };
            open += text
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(3))
                // 0A listening, 07 closed, 06 TIME_WAIT (no process holds it).
                .filter(|st| !matches!(*st, "0A" | "07" | "06"))
                .count() as u64;
        }
        Some(open)
    }

    pub(super) fn live_drop(&self, name: &str) {
        if !name.is_empty() && !name.contains('/') {
            let _ = fs::remove_dir_all(self.live_dir(name));
        }
    }
}

/// The `inuse` count of a `/proc/net/sockstat{,6}` line starting with `label` (`TCP:`,
/// `TCP6:`).
fn sockets_in_use(sockstat: &str, label: &str) -> Option<u64> {
    let mut fields = sockstat
        .lines()
        .find_map(|l| l.strip_prefix(label))?
        .split_whitespace();
    while let Some(name) = fields.next() {
        let value = fields.next()?;
        if name == "inuse" {
            return value.parse().ok();
        }
    }
    None
}

/// Stops every process of the sandbox but the agent and the tree of `root` (SIGSTOP, repeated
/// until no new process appears), so nothing else runs while CRIU's code is inside a dumped
/// process. Whether a process is the tree's is asked of each one as it is about to be stopped:
/// a child the tree forked is the tree's, and one stopped here would be dumped stopped and come
/// back stopped, its parent waiting on it for ever.
fn stop_others(cgroups: &Cgroups, agent: i32, root: i32) {
    let mut stopped = HashSet::new();
    for _ in 0..16 {
        let fresh: Vec<i32> = cgroups
            .pids()
            .into_iter()
            .filter(|p| *p != agent && *p != root && !stopped.contains(p))
            .filter(|p| !criu::descends_from(*p, root))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for p in fresh {
            let _ = kill(Pid::from_raw(p), Signal::SIGSTOP);
            stopped.insert(p);
        }
    }
}

/// Dumps one tree into `sub` (made here) and records what it is beside the images. The rest of
/// the sandbox is stopped once CRIU has frozen the tree, before its code enters it (or after a
/// dump that failed before that), and stays so, but for the tree to dump `next`: it runs again
/// as soon as CRIU's code has left this one.
async fn dump_one(
    criu: &Criu,
    cgroups: Cgroups,
    agent: i32,
    (root, next): (i32, Option<i32>),
    tree: &Tree,
    sub: &Path,
) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o700).create(sub)?;
    fs::write(
        sub.join(TREE_FILE),
        serde_json::to_vec(tree).map_err(io::Error::other)?,
    )?;
    let pipes: Vec<u64> = tree.pipes.iter().map(|p| p.inode).collect();
    let (criu, sub, root_pid) = (criu.clone(), sub.to_path_buf(), tree.pid);
    tokio::task::spawn_blocking(move || {
        let dumped = criu::dump(
            &criu,
            &criu::Dump {
                agent,
                root,
                pipes: &pipes,
                dir: &sub,
            },
            criu::Moments {
                frozen: &mut || stop_others(&cgroups, agent, root),
                cured: &mut || {
                    for p in next.map(criu::tree_pids).unwrap_or_default() {
                        let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
                    }
                },
            },
        );
        // A dump that succeeded was frozen (and the rest stopped then); one that failed may
        // have ended before, and the rest is stopped now all the same.
        if dumped.is_err() {
            stop_others(&cgroups, agent, root);
        }
        dumped?;
        criu::images::join_target_namespaces(&sub, root_pid)?;
        // The restore reads the images once it is in the target's user namespace, as the
        // target's root, through the directory's descriptor: readable by all, the directory
        // itself unreachable (its parent is the engine's alone).
        for entry in fs::read_dir(&sub)?.flatten() {
            fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o644))?;
        }
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o755))
    })
    .await
    .map_err(io::Error::other)?
}

/// A checkpoint's directory again at `dst` (new), its images hard-linked (a restore only reads
/// them), each directory with its mode and owner.
fn link_tree(src: &Path, dst: &Path) -> io::Result<()> {
    let meta = fs::metadata(src)?;
    fs::DirBuilder::new()
        .mode(meta.permissions().mode() & 0o7777)
        .create(dst)?;
    std::os::unix::fs::chown(dst, Some(meta.uid()), Some(meta.gid()))?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let to = dst.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            link_tree(&entry.path(), &to)?;
        } else {
            fs::hard_link(entry.path(), &to)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sockets_in_use;

    #[test]
    fn the_sockets_in_use_of_a_namespace_are_read_from_its_sockstat() {
        let v4 = "sockets: used 219\nTCP: inuse 1 orphan 0 tw 149 alloc 195 mem 123\nUDP: inuse 2 mem 120\n";
        assert_eq!(sockets_in_use(v4, "TCP:"), Some(1));
        assert_eq!(sockets_in_use(v4, "UDP:"), Some(2));
        let v6 = "TCP6: inuse 0\nUDP6: inuse 0\n";
        assert_eq!(sockets_in_use(v6, "TCP6:"), Some(0));
        // Anything else is unknown, never 0: the table is read then.
        assert_eq!(sockets_in_use(v6, "TCP:"), None);
        assert_eq!(sockets_in_use("TCP: orphan 0", "TCP:"), None);
        assert_eq!(sockets_in_use("TCP: inuse x", "TCP:"), None);
    }
}
