//! Session-scoped sandboxes (`--session-sandbox`, the `session` tool profile): each MCP session
//! gets one sandbox, created on its first tool call and killed when the session ends — DELETE on
//! the HTTP transport, stdin EOF or SIGTERM on stdio, or the transport's idle timeout. Tools then
//! take no `sandbox_id`; the server fills it in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::Backend;
use crate::call::{CallFailure, respond};
use sandbox_mcp_api::types;

/// Every live session sandbox of a server, so shutdown can kill those whose sessions are still
/// open.
#[derive(Clone, Default)]
pub struct SessionSandboxes {
    live: Arc<Mutex<HashMap<String, Option<String>>>>,
    /// Kills started by sessions that ended (dropped), which shutdown waits for: a server that
    /// stops ends its sessions, and exiting before their kills ran left those sandboxes running.
    ending: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl SessionSandboxes {
    fn insert(&self, id: &str, tenant: Option<String>) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), tenant);
    }

    fn remove(&self, id: &str) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
            .is_some()
    }

    /// Kills every session sandbox still alive, and waits for the kills that ended sessions
    /// started (server shutdown).
    pub(crate) async fn kill_all(&self, backend: &Backend) {
        let live: Vec<(String, Option<String>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        for (id, tenant) in live {
            kill(backend, &id, tenant.as_deref()).await;
        }
        let ending = std::mem::take(&mut *self.ending.lock().unwrap_or_else(|p| p.into_inner()));
        for kill in ending {
            let _ = kill.await;
        }
    }

    /// Kills `id` in a task of its own (a session ended where nothing can wait), kept for
    /// [`Self::kill_all`] to wait for.
    fn kill_later(&self, backend: Backend, id: String, tenant: Option<String>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = rt.spawn(async move { kill(&backend, &id, tenant.as_deref()).await });
        let mut ending = self.ending.lock().unwrap_or_else(|p| p.into_inner());
        ending.retain(|t| !t.is_finished());
        ending.push(task);
    }
}

async fn kill(backend: &Backend, id: &str, tenant: Option<&str>) {
    if let Ok(handle) = backend.client(tenant).await {
        match handle
            .client
            .kill_sandbox()
            .sandbox_id(id.to_string())
            .send()
            .await
        {
            Ok(_) => tracing::info!(sandbox = id, "session ended; its sandbox was killed"),
            Err(e) => tracing::warn!(sandbox = id, "could not kill the session's sandbox: {e}"),
        }
    }
}

/// The sandbox of one session.
pub(crate) struct SessionSandbox {
    backend: Backend,
    registry: SessionSandboxes,
    /// The sandbox id and the tenant that owns it, once made. A mutex rather than a once-cell:
    /// if the sandbox dies (killed, or its own timeout), the next call makes a fresh one.
    id: Mutex<Option<(String, Option<String>)>>,
    /// Serializes creation so concurrent first calls share one sandbox.
    creating: tokio::sync::Mutex<()>,
}

impl SessionSandbox {
    pub(crate) fn new(backend: Backend, registry: SessionSandboxes) -> Self {
        Self {
            backend,
            registry,
            id: Mutex::new(None),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    /// The session's sandbox id, creating the sandbox on first use.
    pub(crate) async fn id(&self, tenant: Option<&str>) -> Result<String, CallFailure> {
        let _creating = self.creating.lock().await;
        if let Some((id, owner)) = self.current() {
            if owner.as_deref() != tenant {
                // A session belongs to one tenant; the HTTP layer enforces it, this is a backstop.
                return Err(CallFailure::InvalidArgs(
                    "this session belongs to another tenant".into(),
                ));
            }
            return Ok(id);
        }
        let handle = self.backend.client(tenant).await?;
        let body: types::CreateSandboxRequest =
            serde_json::from_value(serde_json::json!({"metadata": {"mcp-session": "true"}}))
                .map_err(|e| CallFailure::InvalidArgs(e.to_string()))?;
        let sandbox = respond(handle.client.create_sandbox().body(body).send().await)?;
        let id = sandbox["id"].as_str().unwrap_or_default().to_string();
        self.registry.insert(&id, tenant.map(String::from));
        tracing::info!(sandbox = %id, "created the session's sandbox");
        *self.id.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((id.clone(), tenant.map(String::from)));
        Ok(id)
    }

    fn current(&self) -> Option<(String, Option<String>)> {
        self.id.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After a call on `id` failed with not-found: whether the session's sandbox itself is gone
    /// (rather than, say, a file). If so it is forgotten, and the next call makes a new one.
    pub(crate) async fn forget_if_gone(&self, id: &str, tenant: Option<&str>) -> bool {
        let Ok(handle) = self.backend.client(tenant).await else {
            return false;
        };
        let gone = matches!(
            handle.client.get_sandbox().sandbox_id(id.to_string()).send().await,
            Err(progenitor_client::Error::ErrorResponse(r)) if r.status().as_u16() == 404
        );
        if gone {
            let mut slot = self.id.lock().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_some_and(|(current, _)| current == id) {
                *slot = None;
                self.registry.remove(id);
            }
        }
        gone
    }

    /// Kills the sandbox now (stdio EOF or SIGTERM, where nothing runs after the server).
    pub(crate) async fn end(&self) {
        if let Some((id, tenant)) = self.current()
            && self.registry.remove(&id)
        {
            kill(&self.backend, &id, tenant.as_deref()).await;
        }
    }
}

impl Drop for SessionSandbox {
    fn drop(&mut self) {
        // The HTTP transport drops a session's server when the session ends (DELETE or idle).
        let Some((id, tenant)) = self.current() else {
            return;
        };
        if !self.registry.remove(&id) {
            return;
        }
        self.registry.kill_later(self.backend.clone(), id, tenant);
    }
}
