//! The sandbox records as the services use them: every call async (SQLite runs on the blocking
//! pool here and nowhere else), and one place that knows where records live beyond this
//! engine's own state — nowhere, for a driver whose sandboxes belong to one engine; with the
//! sandboxes, for a driver whose engine replicas share them (the kubernetes driver's pod
//! annotations). The rest of the engine asks what other replicas did, and an engine whose
//! sandboxes are its own answers "nothing" at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use sandbox_mcp_model::driver::{DriverError, Shared, SharedRecords};
use sandbox_mcp_model::{Binding, NetworkRules, Preview, Record, Snapshot, Status};

use crate::driver::blocking;
use crate::error::EngineError;
use crate::state::{ServerRow, Store, VolumeRow};

pub(crate) struct Records {
    local: Arc<Store>,
    shared: Option<Arc<dyn SharedRecords>>,
}

impl Records {
    pub(crate) fn new(local: Arc<Store>, shared: Option<Arc<dyn SharedRecords>>) -> Self {
        Self { local, shared }
    }

    /// Runs `f` on this engine's store, on the blocking pool.
    async fn local<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, EngineError> {
        let store = self.local.clone();
        Ok(blocking(move || f(&store)).await??)
    }

    pub(crate) async fn all(&self) -> Result<Vec<Record>, EngineError> {
        self.local(|s| s.all()).await
    }

    pub(crate) async fn insert(&self, record: &Record) -> Result<(), EngineError> {
        let r = record.clone();
        self.local(move |s| s.insert(&r)).await
    }

    /// Inserts every record in one transaction.
    pub(crate) async fn insert_all(&self, records: &[Record]) -> Result<(), EngineError> {
        let rs = records.to_vec();
        self.local(move |s| s.insert_all(&rs)).await
    }

    /// Gives a pooled sandbox's record its new owner's request.
    pub(crate) async fn adopt(&self, record: &Record) -> Result<(), EngineError> {
        let r = record.clone();
        self.local(move |s| s.adopt(&r)).await
    }

    /// Deletes a sandbox's record with its previews' and snapshots' rows.
    pub(crate) async fn delete(&self, id: &str) -> Result<(), EngineError> {
        let id = id.to_string();
        self.local(move |s| s.delete(&id)).await
    }

    pub(crate) async fn set_status(&self, id: &str, status: Status) -> Result<(), EngineError> {
        let id = id.to_string();
        self.local(move |s| s.set_status(&id, status)).await
    }

    /// Sets the status of every sandbox named, in one transaction.
    pub(crate) async fn set_status_all(
        &self,
        ids: Vec<String>,
        status: Status,
    ) -> Result<(), EngineError> {
        self.local(move |s| s.set_status_all(&ids, status)).await
    }

    /// Replaces what is given of the metadata and the network rules, whole or not at all.
    pub(crate) async fn update(
        &self,
        id: &str,
        metadata: Option<BTreeMap<String, String>>,
        network: Option<NetworkRules>,
    ) -> Result<(), EngineError> {
        let id = id.to_string();
        self.local(move |s| s.update(&id, metadata.as_ref(), network.as_ref()))
            .await
    }

    pub(crate) async fn set_secrets(
        &self,
        id: &str,
        secrets: BTreeMap<String, Binding>,
    ) -> Result<(), EngineError> {
        let id = id.to_string();
        self.local(move |s| s.set_secrets(&id, &secrets)).await
    }

    pub(crate) async fn set_expiry(&self, id: &str, at: Option<i64>) -> Result<(), EngineError> {
        let id = id.to_string();
        self.local(move |s| s.set_expiry(&id, at)).await
    }

    pub(crate) async fn set_last_active(&self, id: &str, at: i64) -> Result<(), EngineError> {
        let id = id.to_string();
        self.local(move |s| s.set_last_active(&id, at)).await
    }

    /// The snapshots of sandbox `id` (of every sandbox: `None`), ready or not.
    pub(crate) async fn snapshots(&self, id: Option<&str>) -> Result<Vec<Snapshot>, EngineError> {
        let id = id.map(str::to_string);
        self.local(move |s| s.snapshots(id.as_deref())).await
    }

    pub(crate) async fn put_snapshot(&self, snap: &Snapshot) -> Result<(), EngineError> {
        let snap = snap.clone();
        self.local(move |s| s.put_snapshot(&snap)).await
    }

    pub(crate) async fn delete_snapshot(&self, snap: &str) -> Result<(), EngineError> {
        let snap = snap.to_string();
        self.local(move |s| s.delete_snapshot(&snap)).await
    }

    /// Every stored preview, with its sandbox's id.
    pub(crate) async fn previews(&self) -> Result<Vec<(String, Preview)>, EngineError> {
        self.local(|s| s.previews()).await
    }

    pub(crate) async fn put_preview(&self, id: &str, preview: &Preview) -> Result<(), EngineError> {
        let (id, p) = (id.to_string(), preview.clone());
        self.local(move |s| s.put_preview(&id, &p)).await
    }

    /// Deletes a stored preview; whether there was one.
    pub(crate) async fn delete_preview(&self, id: &str, port: u16) -> Result<bool, EngineError> {
        let id = id.to_string();
        self.local(move |s| s.delete_preview(&id, port)).await
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

    /// Registers a server unless refused (see `Store::put_server_checked`).
    pub(crate) async fn put_server(
        &self,
        tenant: Option<&str>,
        name: &str,
        settings: String,
        now: i64,
        max: u64,
    ) -> Result<Result<ServerRow, crate::state::PutRefused>, EngineError> {
        let (tenant, name) = (tenant.map(String::from), name.to_string());
        self.local(move |s| s.put_server_checked(tenant.as_deref(), &name, &settings, now, max))
            .await
    }

    pub(crate) async fn server(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Option<ServerRow>, EngineError> {
        let (tenant, name) = (tenant.map(String::from), name.to_string());
        self.local(move |s| s.server(tenant.as_deref(), &name))
            .await
    }

    pub(crate) async fn servers(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<ServerRow>, EngineError> {
        let tenant = tenant.map(String::from);
        self.local(move |s| s.servers(tenant.as_deref())).await
    }

    pub(crate) async fn delete_server(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<bool, EngineError> {
        let (tenant, name) = (tenant.map(String::from), name.to_string());
        self.local(move |s| s.delete_server(tenant.as_deref(), &name))
            .await
    }

    /// Adds a volume's row: `Ok(None)` when the owner has one of that name, `Ok(Some(false))`
    /// when it has `max` already.
    pub(crate) async fn insert_volume(
        &self,
        row: &VolumeRow,
        max: u64,
    ) -> Result<Option<bool>, EngineError> {
        let row = row.clone();
        self.local(move |s| s.insert_volume(&row, max)).await
    }

    pub(crate) async fn volume(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Option<VolumeRow>, EngineError> {
        let (tenant, name) = (tenant.map(str::to_string), name.to_string());
        self.local(move |s| s.volume(tenant.as_deref(), &name))
            .await
    }

    pub(crate) async fn volumes(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<VolumeRow>, EngineError> {
        let tenant = tenant.map(str::to_string);
        self.local(move |s| s.volumes(tenant.as_deref())).await
    }

    pub(crate) async fn delete_volume(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<(), EngineError> {
        let (tenant, name) = (tenant.map(str::to_string), name.to_string());
        self.local(move |s| s.delete_volume(tenant.as_deref(), &name))
            .await
    }
}
