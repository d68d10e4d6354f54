//! Sandboxes' networks as the services see them: the policy a caller's rules make, a
//! sandbox's network state from its record, serving a started sandbox's egress sockets, and the
//! network log.

use std::sync::Arc;

use sandbox_mcp_model::driver::DriverError;
use sandbox_mcp_network::log as netlog;
use sandbox_mcp_network::policy::Policy;
use sandbox_mcp_network::{Bindings, Hub, SandboxNet};

use super::registry::Entry;
use super::{NetworkInfo, NetworkLogPage};
use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::state::{NetworkRules, Record};

pub struct Networks {
    hub: Arc<Hub>,
    driver: DriverHandle,
}

impl Networks {
    pub(crate) fn new(hub: Arc<Hub>, driver: DriverHandle) -> Self {
        Self { hub, driver }
    }

    /// The engine's descriptors that sandbox traffic (relayed connections, previews) may use.
    pub fn descriptors(&self) -> &Arc<sandbox_mcp_sys::budget::Descriptors> {
        self.hub.fds()
    }

    /// What the engine gives sandboxes' networks.
    pub fn info(&self) -> NetworkInfo {
        NetworkInfo {
            default: self.hub.config().egress,
            filtered: self.driver.capabilities().egress,
        }
    }

    /// The policy of egress rules a caller gave. Rules are refused on a driver whose sandboxes
    /// reach a network the engine does not filter: they could not be honoured.
    pub(crate) fn rules(&self, rules: &NetworkRules) -> Result<Policy, EngineError> {
        let capabilities = self.driver.capabilities();
        if capabilities.network_unfiltered
            && !(rules.allow_out.is_empty() && rules.deny_out.is_empty())
        {
            return Err(EngineError::InvalidArgument(format!(
                "the {} driver cannot apply egress rules: its sandboxes' egress is the cluster's NetworkPolicy; leave network rules out",
                capabilities.name
            )));
        }
        self.hub
            .policy(&rules.allow_out, &rules.deny_out)
            .map_err(EngineError::InvalidArgument)
    }

    /// A new sandbox's network state under `policy`.
    pub(crate) fn new_net(&self, record: &Record, policy: Policy) -> Arc<SandboxNet> {
        let net = SandboxNet::new(&record.id, policy);
        net.set_bindings(bindings(record));
        net
    }

    /// A sandbox's network state from its stored rules. Rules stored by an earlier engine that no
    /// longer parse (a changed default cannot make them, but a hand-edited database could) fall
    /// back to none, with a warning.
    pub(crate) fn sandbox_net(&self, record: &Record) -> Arc<SandboxNet> {
        let policy = self
            .hub
            .policy(&record.network.allow_out, &record.network.deny_out)
            .unwrap_or_else(|e| {
                tracing::warn!(sandbox = %record.id, "stored network rules ignored: {e}");
                self.hub.default_policy()
            });
        self.new_net(record, policy)
    }

    /// Opens the running sandbox's egress sockets and serves them.
    pub(crate) async fn attach(&self, id: &str, entry: &Arc<Entry>) -> Result<(), DriverError> {
        match self.driver.egress_sockets(id).await? {
            Some(sockets) => self
                .hub
                .attach(&entry.net, sockets)
                .map_err(DriverError::io("serve the sandbox's network")),
            None => {
                entry.net.set_loopback_only();
                Ok(())
            }
        }
    }

    /// [`Self::attach`] for a sandbox that already exists: a failure leaves it without a
    /// network (its connections fail), which the log says.
    pub(crate) async fn reattach(&self, id: &str, entry: &Arc<Entry>) {
        if let Err(e) = self.attach(id, entry).await {
            tracing::warn!(sandbox = %id, "the sandbox has no network: {e}");
        }
    }

    /// A page of sandbox `id`'s network log.
    pub(crate) async fn log_page(
        &self,
        id: &str,
        query: netlog::Query,
    ) -> Result<NetworkLogPage, EngineError> {
        let limit = query.limit;
        let entries = self.hub.log().read(id, query).await?;
        let next_cursor = if entries.len() == limit {
            entries.last().map(|e| e.id)
        } else {
            None
        };
        Ok(NetworkLogPage {
            entries,
            next_cursor,
        })
    }

    /// Drops a sandbox's log (it is gone).
    pub(crate) fn forget(&self, id: &str) {
        self.hub.log().forget(id);
    }

    /// Keeps only the logs of sandboxes `live` (after a restart).
    pub(crate) fn retain_logs(&self, live: Vec<String>) {
        self.hub.log().retain(live);
    }
}

/// What the egress path needs to know of a sandbox's secret bindings.
pub(crate) fn bindings(record: &Record) -> Bindings {
    Bindings {
        tenant: record.tenant.clone(),
        by_standin: record
            .secrets
            .iter()
            .map(|(env, b)| (b.standin.clone(), (env.clone(), b.secret.clone())))
            .collect(),
        hosts_when_bound: record
            .secrets
            .values()
            .map(|b| (b.secret.clone(), b.hosts.clone()))
            .collect(),
    }
}
