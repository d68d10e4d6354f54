//! What a sandbox's timeout does to it when it is not a kill, and the stop (processes gone,
//! files kept) that E2B calls a filesystem-only pause.

use std::sync::Arc;

use sandbox_mcp_model::driver::DriverError;
use sandbox_mcp_model::ids;
use sandbox_mcp_sys::lock;

use super::{Lifecycle, hibernate};
use crate::error::EngineError;
use crate::services::SandboxView;
use crate::services::registry::{Entry, Runtime};
use crate::state::OnTimeout;

impl Lifecycle {
    /// Stops one of `tenant`'s sandboxes' processes and keeps its files: resuming it (or its
    /// next call) starts it afresh, a new boot. What E2B calls a filesystem-only pause.
    /// To its end ([`Self::to_the_end`]).
    pub async fn stop(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<SandboxView, EngineError> {
        let (this, id, tenant) = (self.clone(), id.to_string(), tenant.map(str::to_string));
        self.to_the_end(async move {
            let entry = this.registry.lookup(&id, tenant.as_deref()).await?;
            this.check_action(OnTimeout::Stop)?;
            this.stop_entry(&id, &entry).await?;
            Ok(this.registry.view(&entry))
        })
        .await
    }

    /// Refuses a timeout action (or a stop) this driver cannot carry out.
    pub(crate) fn check_action(&self, action: OnTimeout) -> Result<(), EngineError> {
        if action == OnTimeout::Kill || self.driver.capabilities().restarts_stopped {
            return Ok(());
        }
        Err(EngineError::from(DriverError::Unsupported(format!(
            "a sandbox cannot be {} here and started again with its files (a pod can be neither frozen nor restarted): kill it instead",
            if action == OnTimeout::Pause {
                "paused"
            } else {
                "stopped"
            }
        ))))
    }

    /// Stops a sandbox's processes, running or paused, and keeps its files; a hibernated
    /// sandbox's memory is dropped.
    pub(crate) async fn stop_entry(&self, id: &str, entry: &Arc<Entry>) -> Result<(), EngineError> {
        let mut rt = entry.lifecycle.lock().await;
        match *rt {
            Runtime::Killed => return Err(EngineError::sandbox_not_found(id)),
            Runtime::Stopped => {}
            Runtime::Running | Runtime::Frozen => {
                self.stop_for_files(id, entry, &mut rt).await?;
            }
        }
        self.driver
            .drop_checkpoint(&hibernate::checkpoint_of(id))
            .await;
        drop(rt);
        self.flush_active(id, entry).await;
        Ok(())
    }

    /// Does at once what one of `tenant`'s sandboxes' timeout does, if it has passed (the timers
    /// would within a tick): for an API that must never show a sandbox past its end.
    pub async fn expire(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<(), EngineError> {
        let entry = self.registry.lookup(id, tenant).await?;
        let record = entry.record();
        if record.timed_out(ids::now_ms()) {
            self.at_timeout(id, &entry, record.on_timeout).await?;
        }
        Ok(())
    }

    /// What a sandbox's timeout does, to its end ([`Self::to_the_end`]): a kill, or a pause or
    /// stop, after which it has no timeout until one is set again.
    pub(crate) async fn at_timeout(
        self: &Arc<Self>,
        id: &str,
        entry: &Arc<Entry>,
        action: OnTimeout,
    ) -> Result<(), EngineError> {
        let (this, id, entry) = (self.clone(), id.to_string(), entry.clone());
        self.to_the_end(async move { this.at_timeout_now(&id, &entry, action).await })
            .await
    }

    async fn at_timeout_now(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        action: OnTimeout,
    ) -> Result<(), EngineError> {
        match action {
            OnTimeout::Kill => return self.kill_now(id, None).await,
            OnTimeout::Pause => self.pause_entry(id, entry).await?,
            OnTimeout::Stop => self.stop_entry(id, entry).await?,
        }
        self.records.set_expiry(id, None).await?;
        lock(&entry.record).expires_at = None;
        Ok(self.records.acknowledge(&entry.record()).await?)
    }
}
