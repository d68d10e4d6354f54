//! Creates, and what makes every lifecycle transition run to its end: [`Lifecycle::to_the_end`].

use std::collections::BTreeMap;
use std::sync::Arc;

use sandbox_mcp_model::driver::Shape;
use sandbox_mcp_model::ids;
use sandbox_mcp_storage::templates::Template;

use super::Lifecycle;
use crate::error::EngineError;
use crate::services::registry::{Entry, Runtime};
use crate::services::{CreateRequest, SandboxView};
use crate::state::{Binding, Record, Status};

impl Lifecycle {
    /// Runs the lifecycle transition `op` (a create, fork, kill, pause, restore, merge) as a
    /// task of its own, to its end whatever becomes of its caller: a client that hung up, a call
    /// cancelled, a build or pool refill ended by the engine's shutdown. Cut short between two
    /// awaits it would leave what no entry accounts for: an agent running under an entry never
    /// committed, a sandbox frozen while its entry says running, children half made.
    /// [`Self::shutdown`] waits for those under way.
    pub(crate) async fn to_the_end<T, F>(&self, op: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        self.transitions.spawn(op).await?
    }

    /// Creates a sandbox from `template` (ready or, for a build sandbox, building), to its end
    /// ([`Self::to_the_end`]).
    pub(crate) async fn create_from(
        self: &Arc<Self>,
        req: CreateRequest,
        template: &Arc<Template>,
        shape: Shape,
    ) -> Result<SandboxView, EngineError> {
        let (this, template) = (self.clone(), template.clone());
        self.to_the_end(async move { this.create_now(req, &template, shape).await })
            .await
    }

    async fn create_now(
        &self,
        req: CreateRequest,
        template: &Template,
        shape: Shape,
    ) -> Result<SandboxView, EngineError> {
        let policy = self.networks.rules(&req.network)?;
        let now = ids::now_ms();
        let record = {
            let _guard = self.registry.adding().await;
            let (count, used_slots) = self.registry.slots();
            if count >= self.max_sandboxes {
                return Err(EngineError::QuotaExceeded(format!(
                    "the engine allows at most {} sandboxes and {count} exist",
                    self.max_sandboxes
                )));
            }
            let uid_slot = self.driver.claim_slot(used_slots).await?;
            let record = record_of(
                &req,
                ids::sandbox_id(),
                &template.key,
                shape,
                uid_slot,
                Status::Creating,
                now,
                self.secrets.bind_new(req.tenant.as_deref(), &req.secrets)?,
            );
            if let Err(e) = self.records.insert(&record).await {
                self.driver.release_slot(uid_slot).await;
                return Err(e);
            }
            let net = self.networks.new_net(&record, policy);
            self.registry.insert(
                record.id.clone(),
                Entry::new(record.clone(), Runtime::Stopped, false, net),
            );
            record
        };

        let spec = self.start_spec(&record)?;
        let entry = self.registry.entry_any(&record.id)?;
        let started = match self.driver.start(&spec).await {
            Ok(()) => match self.networks.attach(&record.id, &entry).await {
                Ok(()) => {
                    let mut acked = record.clone();
                    acked.status = Status::Running;
                    self.records.acknowledge(&acked).await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            entry.net.close();
            self.discard(&record.id, record.uid_slot).await;
            return Err(e.into());
        }
        self.records.set_status(&record.id, Status::Running).await?;
        entry.commit_running().await;
        Ok(self.registry.view(&entry))
    }
}

/// The record of a sandbox made for `req` (a new one, or a pooled one it adopts), with the
/// secret bindings already made for it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_of(
    req: &CreateRequest,
    id: String,
    template: &str,
    shape: Shape,
    uid_slot: u32,
    status: Status,
    now: i64,
    secrets: BTreeMap<String, Binding>,
) -> Record {
    Record {
        id,
        name: req.name.clone(),
        template: template.to_string(),
        status,
        metadata: req.metadata.clone(),
        env: req.env.clone(),
        shape,
        uid_slot,
        created_at: now,
        last_active_at: now,
        expires_at: req.timeout_seconds.map(|s| now + (s as i64) * 1000),
        tenant: req.tenant.clone(),
        network: req.network.clone(),
        secrets,
        desktop: req.desktop,
        volumes: req.volumes.clone(),
        on_timeout: req.on_timeout,
    }
}
