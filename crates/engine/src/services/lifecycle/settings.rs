//! What a sandbox's owner changes of it while it lives: its metadata and egress rules, and when
//! it is killed.

use std::collections::BTreeMap;

use sandbox_mcp_model::driver::DriverError;
use sandbox_mcp_model::ids;
use sandbox_mcp_sys::lock;

use super::Lifecycle;
use crate::error::EngineError;
use crate::services::SandboxView;
use crate::state::NetworkRules;

impl Lifecycle {
    /// Replaces what is given of the metadata and the egress rules. New rules apply to the next
    /// connection and DNS query (connections already open are not cut).
    pub async fn update(
        &self,
        id: &str,
        tenant: Option<&str>,
        metadata: Option<BTreeMap<String, String>>,
        network: Option<NetworkRules>,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        let policy = network
            .as_ref()
            .map(|n| self.networks.rules(n))
            .transpose()?;
        self.records
            .update(id, metadata.clone(), network.clone())
            .await?;
        {
            let mut record = lock(&entry.record);
            if let Some(m) = metadata {
                record.metadata = m;
            }
            if let (Some(n), Some(policy)) = (network, policy) {
                record.network = n;
                entry.net.set_policy(policy);
            }
        }
        // Other replicas read the change from where the driver keeps the record.
        self.records.acknowledge(&entry.record()).await?;
        Ok(self.registry.view(&entry))
    }

    /// Whether a sandbox's timeout can be moved later (see [`Capabilities::timeouts_extend`]).
    ///
    /// [`Capabilities::timeouts_extend`]: sandbox_mcp_model::driver::Capabilities
    pub fn timeouts_extend(&self) -> bool {
        self.driver.capabilities().timeouts_extend
    }

    /// Sets when the sandbox's timeout comes: `seconds` from now (at most 30 days), or never.
    pub async fn set_timeout(
        &self,
        id: &str,
        tenant: Option<&str>,
        seconds: Option<u64>,
    ) -> Result<SandboxView, EngineError> {
        const MAX_SECONDS: u64 = 30 * 24 * 3600;
        if seconds.is_some_and(|s| s > MAX_SECONDS) {
            return Err(EngineError::InvalidArgument(format!(
                "a timeout is at most {MAX_SECONDS} seconds (30 days)"
            )));
        }
        let entry = self.registry.lookup(id, tenant).await?;
        let at = seconds.map(|s| ids::now_ms() + (s as i64) * 1000);
        let now = entry.record().expires_at;
        if !self.timeouts_extend()
            && let Some(now) = now
            && at.is_none_or(|at| at > now)
        {
            return Err(EngineError::from(DriverError::Unsupported(format!(
                "sandbox {id}'s timeout, once set, can be shortened here but not moved later ({}s from now at most): a pod's deadline, which the kubelet enforces even with no engine running, can never be raised",
                ((now - ids::now_ms()) / 1000).max(0)
            ))));
        }
        self.records.set_expiry(id, at).await?;
        lock(&entry.record).expires_at = at;
        self.records.acknowledge(&entry.record()).await?;
        Ok(self.registry.view(&entry))
    }
}
