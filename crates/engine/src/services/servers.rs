//! Hosted MCP servers' registrations, per tenant: a tenant sees its own and the operator's (shared
//! with every tenant); another tenant's answers as if it did not exist. A tenant cannot take a
//! name the operator shares, nor remove the operator's. The settings are the API's JSON, checked
//! by the API layer; the MCP layer runs them.

use std::sync::Arc;

use crate::error::EngineError;
use crate::records::Records;
use crate::state::{PutRefused, ServerRow};

/// Most servers one tenant (or the operator) registers: the engine's database is a budget.
pub const MAX_SERVERS: u64 = 256;

pub struct Servers {
    records: Arc<Records>,
}

/// A registration as its caller sees it.
#[derive(Debug, Clone)]
pub struct ServerView {
    pub row: ServerRow,
    /// The operator's, served to every tenant.
    pub shared: bool,
    /// The caller registered it (and may see its environment).
    pub owned: bool,
}

fn not_found(name: &str) -> EngineError {
    EngineError::NotFound(format!(
        "no hosted server named {name}; list_servers (or `sandbox-mcp servers list`) shows them"
    ))
}

fn view(row: ServerRow, tenant: Option<&str>) -> ServerView {
    ServerView {
        shared: row.tenant.is_none(),
        owned: row.tenant.as_deref() == tenant,
        row,
    }
}

impl Servers {
    pub(crate) fn new(records: Arc<Records>) -> Self {
        Self { records }
    }

    pub async fn put(
        &self,
        tenant: Option<&str>,
        name: &str,
        settings: String,
    ) -> Result<ServerView, EngineError> {
        let now = sandbox_mcp_sys::now_ms();
        match self
            .records
            .put_server(tenant, name, settings, now, MAX_SERVERS)
            .await?
        {
            Ok(row) => Ok(view(row, tenant)),
            Err(PutRefused::OperatorsName) => Err(EngineError::Conflict(format!(
                "the operator shares a server named {name} with every tenant; pick another name"
            ))),
            Err(PutRefused::Full) => Err(EngineError::QuotaExceeded(format!(
                "{MAX_SERVERS} servers are registered already; remove some first"
            ))),
        }
    }

    /// The caller's own server of that name, else the operator's.
    pub async fn get(&self, tenant: Option<&str>, name: &str) -> Result<ServerView, EngineError> {
        if let Some(row) = self.records.server(tenant, name).await? {
            return Ok(view(row, tenant));
        }
        if tenant.is_some()
            && let Some(row) = self.records.server(None, name).await?
        {
            return Ok(view(row, tenant));
        }
        Err(not_found(name))
    }

    pub async fn list(&self, tenant: Option<&str>) -> Result<Vec<ServerView>, EngineError> {
        let rows = self.records.servers(tenant).await?;
        Ok(rows.into_iter().map(|r| view(r, tenant)).collect())
    }

    /// Whether there was one to remove.
    pub async fn delete(&self, tenant: Option<&str>, name: &str) -> Result<bool, EngineError> {
        if self.records.delete_server(tenant, name).await? {
            return Ok(true);
        }
        if tenant.is_some() && self.records.server(None, name).await?.is_some() {
            return Err(EngineError::PermissionDenied(format!(
                "{name} is the operator's, shared with every tenant; only the operator removes it"
            )));
        }
        Ok(false)
    }
}
