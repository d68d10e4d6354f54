//! Where sandbox records are kept beyond this engine's own state (SQLite): nowhere, for a driver
//! whose sandboxes belong to one engine; with the sandboxes, for a driver whose engine replicas
//! share them (the kubernetes driver's pod annotations). This is the one place that knows which:
//! the rest of the engine asks what other replicas did, and an engine whose sandboxes are its own
//! answers "nothing" at once.

use std::sync::Arc;

use sandbox_mcp_model::Record;
use sandbox_mcp_model::driver::{DriverError, Shared, SharedRecords};

pub(crate) struct Records {
    shared: Option<Arc<dyn SharedRecords>>,
}

impl Records {
    pub(crate) fn new(shared: Option<Arc<dyn SharedRecords>>) -> Self {
        Self { shared }
    }

    /// Whether every sandbox record lives in this engine's state alone, so that what it does not
    /// know does not exist.
    pub(crate) fn local_only(&self) -> bool {
        self.shared.is_none()
    }

    /// Marks `record` acknowledged where other replicas see it (after a create, an update).
    pub(crate) async fn acknowledge(&self, record: &Record) -> Result<(), DriverError> {
        match &self.shared {
            Some(shared) => shared.acknowledge(record).await,
            None => Ok(()),
        }
    }

    /// Sandbox `id` as other replicas left it, when this engine does not know it.
    pub(crate) async fn find_elsewhere(&self, id: &str) -> Result<Option<Shared>, DriverError> {
        match &self.shared {
            Some(shared) => shared.find(id).await,
            None => Ok(None),
        }
    }

    /// Every acknowledged record other replicas see, to bring this engine's cache in line;
    /// `None` when there are no other replicas.
    pub(crate) async fn all_elsewhere(&self) -> Result<Option<Vec<Record>>, DriverError> {
        match &self.shared {
            Some(shared) => shared.all().await.map(Some),
            None => Ok(None),
        }
    }
}
