//! Previews of sandbox ports: kept with their sandbox (in memory and in the state database),
//! found by the preview proxy (`sandbox_mcp_engine_http::preview`) without a tenant — the token
//! is the credential there — and reached through the sandbox's network namespace.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use super::lifecycle::Lifecycle;
use super::registry::{Entry, InFlight, Registry};
use crate::driver::DriverHandle;
use crate::error::EngineError;
use crate::records::Records;
use crate::state::Preview;
use sandbox_mcp_model::ids;
use sandbox_mcp_sys::lock;

/// The query parameter a private preview's URL carries its token in (the proxy trades it for a
/// cookie).
pub const TOKEN_PARAM: &str = "preview_token";

/// Most previews one sandbox may have.
pub(crate) const MAX_PREVIEWS: usize = 32;

/// A preview in memory: its record, and what closes the connections made through it.
pub struct Live {
    pub(crate) preview: Preview,
    pub(crate) closed: CancellationToken,
}

/// A preview as the API reports it.
#[derive(Debug, Clone)]
pub struct PreviewView {
    pub preview: Preview,
    pub url: String,
    pub path_url: String,
}

/// Why the proxy cannot reach a preview's port. The first two are the visitor's to know; the
/// others are the engine's failures, for its log.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The sandbox or the preview is gone.
    #[error("the sandbox or the preview is gone")]
    Gone,
    /// Nothing listens on the port.
    #[error("nothing listens on the port")]
    NotListening,
    /// The sandbox could not be resumed or restarted.
    #[error("resume the sandbox")]
    Resume(#[source] EngineError),
    /// Connecting inside the sandbox's network namespace failed.
    #[error("connect inside the sandbox")]
    Connect(#[source] std::io::Error),
}

/// How the engine writes its previews' URLs.
#[derive(Debug, Clone)]
pub struct Urls {
    pub domain: String,
    pub port: u16,
}

impl Urls {
    /// `http://{port}-{id}.{domain}:{listen port}/`.
    pub(crate) fn host_url(&self, id: &str, port: u16) -> String {
        format!(
            "http://{port}-{}.{}:{}/",
            id.replace('_', "-"),
            self.domain,
            self.port
        )
    }

    /// `http://{domain}:{listen port}/preview/{id}/{port}/`.
    pub(crate) fn path_url(&self, id: &str, port: u16) -> String {
        format!("http://{}:{}/preview/{id}/{port}/", self.domain, self.port)
    }
}

/// Keeps a sandbox active (not idle-paused) while a preview connection is open.
pub struct Activity(#[allow(dead_code)] InFlight);

/// Previews of sandboxes' ports.
pub struct Previews {
    /// The domain preview URLs are written with.
    domain: String,
    /// How preview URLs are written, once the preview listener is bound.
    urls: OnceLock<Urls>,
    driver: DriverHandle,
    records: Arc<Records>,
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
}

impl Previews {
    pub(crate) fn new(
        domain: String,
        driver: DriverHandle,
        records: Arc<Records>,
        registry: Arc<Registry>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        Self {
            domain,
            urls: OnceLock::new(),
            driver,
            records,
            registry,
            lifecycle,
        }
    }

    /// Sets where previews are served (once the listener is bound).
    pub fn set_port(&self, port: u16) {
        let _ = self.urls.set(Urls {
            domain: self.domain.clone(),
            port,
        });
    }

    /// How preview URLs are written; `None` when previews are off.
    pub fn urls(&self) -> Option<&Urls> {
        self.urls.get()
    }

    fn view_preview(&self, id: &str, preview: &Preview, urls: &Urls) -> PreviewView {
        let url = urls.host_url(id, preview.port);
        PreviewView {
            url: if preview.public {
                url
            } else {
                format!("{url}?{TOKEN_PARAM}={}", preview.token)
            },
            path_url: urls.path_url(id, preview.port),
            preview: preview.clone(),
        }
    }

    fn urls_or_refuse(&self) -> Result<&Urls, EngineError> {
        self.urls().ok_or_else(|| {
            EngineError::Conflict(
                "previews are off on this engine (its operator set --preview-listen off)".into(),
            )
        })
    }

    /// Creates (or, for a port that has one, updates) a preview. An existing preview keeps its
    /// token, so URLs already handed out keep working.
    pub async fn preview_create(
        &self,
        id: &str,
        tenant: Option<&str>,
        port: u16,
        public: bool,
        expires_in: Option<u64>,
    ) -> Result<PreviewView, EngineError> {
        let urls = self.urls_or_refuse()?;
        if !self.driver.capabilities().serves_ports {
            return Err(EngineError::Conflict(format!(
                "the {} driver cannot serve a sandbox's ports as preview URLs; use sandbox_exec (curl localhost:{port}) to reach the port from inside",
                self.driver.capabilities().name
            )));
        }
        let entry = self.registry.entry(id, tenant)?;
        let now = ids::now_ms();
        let preview = {
            let previews = lock(&entry.previews);
            if !previews.contains_key(&port) && previews.len() >= MAX_PREVIEWS {
                return Err(EngineError::QuotaExceeded(format!(
                    "sandbox {id} has {MAX_PREVIEWS} previews, the most it may have; delete one with sandbox_preview_delete"
                )));
            }
            let old = previews.get(&port).map(|l| &l.preview);
            Preview {
                port,
                token: old.map_or_else(ids::preview_token, |p| p.token.clone()),
                public,
                created_at: old.map_or(now, |p| p.created_at),
                expires_at: expires_in.map(|s| now + (s as i64) * 1000),
            }
        };
        self.records.put_preview(id, &preview).await?;
        let mut previews = lock(&entry.previews);
        match previews.get_mut(&port) {
            Some(live) => live.preview = preview.clone(),
            None => {
                previews.insert(
                    port,
                    Live {
                        preview: preview.clone(),
                        closed: entry.net.closed().child_token(),
                    },
                );
            }
        }
        Ok(self.view_preview(id, &preview, urls))
    }

    /// The sandbox's previews, by port.
    pub fn previews(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<PreviewView>, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let Some(urls) = self.urls() else {
            return Ok(Vec::new());
        };
        Ok(lock(&entry.previews)
            .values()
            .map(|l| self.view_preview(id, &l.preview, urls))
            .collect())
    }

    /// Deletes a preview and closes its connections; whether there was one.
    pub async fn preview_delete(
        &self,
        id: &str,
        tenant: Option<&str>,
        port: u16,
    ) -> Result<bool, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let existed = self.records.delete_preview(id, port).await?;
        if let Some(live) = lock(&entry.previews).remove(&port) {
            live.closed.cancel();
            return Ok(true);
        }
        Ok(existed)
    }

    /// The preview of `port` in sandbox `id`, whoever asks (the proxy checks its token).
    pub fn preview_find(&self, id: &str, port: u16) -> Option<(Preview, CancellationToken)> {
        let entry = self.registry.entry(id, None).ok()?;
        let previews = lock(&entry.previews);
        let live = previews.get(&port)?;
        Some((live.preview.clone(), live.closed.clone()))
    }

    /// Connects to `port` inside the sandbox, resuming it first if it is paused.
    pub async fn preview_connect(
        &self,
        id: &str,
        port: u16,
    ) -> Result<(tokio::net::TcpStream, Activity), PreviewError> {
        let entry = self
            .registry
            .entry(id, None)
            .map_err(|_| PreviewError::Gone)?;
        let activity = Activity(InFlight::new(entry.clone()));
        self.lifecycle
            .ensure_running(id, &entry)
            .await
            .map_err(|e| match e {
                EngineError::NotFound(_) => PreviewError::Gone,
                other => PreviewError::Resume(other),
            })?;
        // As root the engine enters the sandbox's namespace itself; unprivileged it cannot, and
        // the agent connects for it.
        let connected = if entry.net.can_enter() {
            entry.net.connect_inside(port).await
        } else {
            self.driver.connect_port(id, port).await
        };
        match connected {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                Ok((stream, activity))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Err(PreviewError::NotListening)
            }
            Err(e) => Err(PreviewError::Connect(e)),
        }
    }

    /// Loads the previews stored for sandboxes that came back after a restart.
    pub(crate) async fn recover(&self) -> Result<(), EngineError> {
        for (id, preview) in self.records.previews().await? {
            if let Ok(entry) = self.registry.entry_any(&id) {
                insert_live(&entry, preview);
            }
        }
        Ok(())
    }
}

fn insert_live(entry: &Arc<Entry>, preview: Preview) {
    let closed = entry.net.closed().child_token();
    lock(&entry.previews).insert(preview.port, Live { preview, closed });
}
