//! How the namespaces driver isolates sandboxes: uid slots, launching the agent, reaching it,
//! freezing, stopping and destroying, and the egress sockets the engine serves.

use super::*;

impl Isolation for NamespacesDriver {
    fn checkpoint<'a>(
        &'a self,
        id: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<sandbox_mcp_model::driver::LiveReport, DriverError>> {
        Box::pin(self.live_checkpoint(id, name))
    }

    fn continue_processes(&self, id: &str) {
        self.live_continue(id)
    }

    fn restore_checkpoint<'a>(
        &'a self,
        id: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<sandbox_mcp_model::driver::LiveReport, DriverError>> {
        Box::pin(self.live_restore(id, name))
    }

    fn drop_checkpoint(&self, name: &str) {
        self.live_drop(name)
    }

    fn checkpoint_bytes(&self, name: &str) -> Option<u64> {
        self.live_bytes(name)
    }

    fn copy_checkpoint(&self, from: &str, to: &str) -> Result<(), DriverError> {
        self.live_copy(from, to)
    }

    fn open_connections(&self, id: &str) -> Option<u64> {
        self.live_connections(id)
    }

    fn no_live_state(&self) -> String {
        match &self.criu {
            Ok(_) => String::new(),
            Err(why) => why.clone(),
        }
    }

    fn egress_sockets<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<EgressSockets>, DriverError>> {
        Box::pin(async move {
            if self.uid != 0 {
                return self.handed_egress_sockets(id).await;
            }
            let pid = self
                .agent_pid(id)
                .ok_or_else(|| DriverError::Agent("the sandbox's agent is not running".into()))?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            // A thread of its own: entering a network namespace changes the calling thread for
            // good, and no pooled thread may be left in a sandbox's namespace.
            std::thread::Builder::new()
                .name("egress-sockets".into())
                .spawn(move || {
                    let _ = tx.send(crate::netns::sockets_in(pid));
                })
                .map_err(DriverError::io("start a thread"))?;
            let sockets = rx
                .await
                .map_err(|_| DriverError::Agent("the egress socket thread died".into()))?
                .map_err(DriverError::io("open the sandbox's egress sockets"))?;
            Ok(Some(sockets))
        })
    }

    fn connect_port<'a>(
        &'a self,
        id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, io::Result<tokio::net::TcpStream>> {
        Box::pin(async move {
            use sandbox_mcp_protocol::ConnectPort;
            let (fds, reply) = tokio::time::timeout(
                Duration::from_secs(10),
                self.ask_for_fds(id, ConnectPort { port }),
            )
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the agent did not connect within 10 s",
                )
            })??;
            if reply.refused {
                return Err(io::ErrorKind::ConnectionRefused.into());
            }
            if let Some(e) = reply.error {
                return Err(io::Error::other(e));
            }
            let fd = fds
                .into_iter()
                .next()
                .ok_or_else(|| io::Error::other("the agent passed no socket"))?;
            // Whatever the agent passed must be a connected TCP socket.
            let kind = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SockType)
                .map_err(io::Error::from)?;
            if kind != nix::sys::socket::SockType::Stream
                || nix::sys::socket::getpeername::<nix::sys::socket::SockaddrIn>(fd.as_raw_fd())
                    .is_err()
            {
                return Err(io::Error::other(
                    "the agent passed something else than a TCP connection",
                ));
            }
            let stream = std::net::TcpStream::from(fd);
            stream.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(stream)
        })
    }

    fn claim_slots(&self, taken: &[u32], count: usize) -> Result<Vec<u32>, DriverError> {
        match &self.registry {
            Some(registry) => registry
                .claim_many(self.pty_max, self.pty_pool, count)
                .map_err(|e| match e {
                    uids::ClaimError::Exhausted(why) => DriverError::Exhausted(why),
                    uids::ClaimError::Io(e) => DriverError::io("claim a uid range")(e),
                }),
            // One id to map, whatever the slot: slots only tell sandboxes apart.
            None => Ok((1u32..)
                .filter(|s| !taken.contains(s))
                .take(count)
                .collect()),
        }
    }

    fn release_slot(&self, slot: u32) {
        if let Some(registry) = &self.registry
            && let Err(e) = registry.release(slot)
        {
            tracing::warn!(slot, "cannot release a uid range: {e}");
        }
    }

    fn close(&self) {
        if self.store.enforced() {
            disk::release(&self.sandboxes_dir);
        }
    }

    fn reconcile_slots(&self, held: &[u32]) {
        let Some(registry) = &self.registry else {
            return;
        };
        match registry.reconcile(held, self.pty_max, self.pty_pool) {
            Ok(conflicts) if conflicts.is_empty() => {}
            Ok(conflicts) => tracing::error!(
                ?conflicts,
                "another data dir's engine claimed uid ranges this one's sandboxes hold; their sandboxes share host ids"
            ),
            Err(e) => tracing::warn!("cannot check the uid range registry: {e}"),
        }
    }

    fn start<'a>(&'a self, spec: &'a StartSpec) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            self.prepare_dirs(spec).map_err(|e| {
                DriverError::Launch(format!("cannot create the sandbox's directories: {e}"))
            })?;
            self.launch(spec).await.map(|_| ())
        })
    }

    fn connect<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<AgentConn, DriverError>> {
        Box::pin(async move {
            let path = self.agent_socket(id);
            let stream = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::net::UnixStream::connect(&path),
            )
            .await
            .map_err(|_| {
                DriverError::Agent(
                    "the sandbox's agent did not accept a connection within 5 s".into(),
                )
            })?
            .map_err(|e| DriverError::Agent(format!("cannot reach the sandbox's agent: {e}")))?;
            Ok(Box::new(stream) as AgentConn)
        })
    }

    fn liveness<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Liveness> {
        Box::pin(async move {
            if self.layout.enforced()
                && self.cgroups(id).is_frozen()
                && !self.cgroups(id).pids().is_empty()
            {
                return Liveness::Frozen;
            }
            let path = self.agent_socket(id);
            match tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::UnixStream::connect(&path),
            )
            .await
            {
                Ok(Ok(_)) => Liveness::Running,
                _ => Liveness::Stopped,
            }
        })
    }

    fn freeze(&self, id: &str) -> Result<(), DriverError> {
        if !self.layout.enforced() {
            return Err(DriverError::Unsupported(
                "pausing needs cgroups, which this engine cannot use (run it as root, or with a delegated cgroup)".into(),
            ));
        }
        self.cgroups(id).freeze().map_err(DriverError::io("freeze"))
    }

    fn thaw(&self, id: &str) -> Result<(), DriverError> {
        if !self.layout.enforced() {
            return Ok(());
        }
        self.cgroups(id).thaw().map_err(DriverError::io("thaw"))
    }

    fn stop(&self, id: &str) -> Result<(), DriverError> {
        if self.layout.enforced() {
            self.cgroups(id)
                .kill_all()
                .map_err(DriverError::io("kill the sandbox's processes"))?;
        }
        // Killing the sandbox's init takes every process in its pid namespace with it.
        if let Some(pid) = self.agent_pid(id) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        let _ = fs::remove_file(self.agent_file(id, "pid"));
        let _ = fs::remove_file(self.dir(id).join("agent.pid"));
        Ok(())
    }

    fn destroy(&self, id: &str) -> Result<(), DriverError> {
        self.stop(id)?;
        if self.layout.enforced() {
            // The cgroups empty out asynchronously after the last process dies.
            let cg = self.cgroups(id);
            let mut last = Ok(());
            for _ in 0..100 {
                last = cg.remove();
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            last.map_err(DriverError::io("remove the sandbox's cgroups"))?;
        }
        // A restore or merge cut short by a crash may have left its new tree beside.
        let _ = disk::remove_dir(
            &self.store,
            &self.sandboxes_dir,
            &format!("{id}{NEW_SUFFIX}"),
        );
        disk::remove_dir(&self.store, &self.sandboxes_dir, id)
            .map_err(DriverError::io("delete the sandbox's files"))?;
        self.drop_agent_files(id);
        self.collect_layers();
        Ok(())
    }

    fn usage(&self, id: &str) -> Usage {
        self.cgroups(id).usage()
    }

    fn usage_brief(&self, id: &str) -> Usage {
        self.cgroups(id).usage_brief()
    }

    fn processes(&self, id: &str) -> u64 {
        // cgroup.procs lists live processes; pids.current also counts threads, and killed
        // agents until the host's init reaps them.
        self.cgroups(id).pids().len() as u64
    }

    fn oom_kills(&self, id: &str) -> u64 {
        self.cgroups(id).oom_kills()
    }
}
