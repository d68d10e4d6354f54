//! Creating sandboxes, and warm pools: a template with `warm: N` keeps N sandboxes started and
//! idle, so `create` hands one out at once and starts a replacement in the background. A pooled
//! sandbox has run nothing but one `true` (to warm its shell's lookups, see [`Pools::warm_up`])
//! and has its own id;
//! `create` gives it the request's name, labels, environment,
//! network rules, secrets and expiry, and it is then like any other. Pooled sandboxes belong to
//! an internal tenant no API key can name, so no listing shows them. They outlive the engine:
//! paused when it stops (a pod runs on), and handed out again by the next start when they are
//! still what their template's pool would start and their agents answer; the rest are killed.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_mcp_model::ids;
use sandbox_mcp_storage::templates::{Template, TemplateStatus};
use sandbox_mcp_sys::lock;
use tokio_util::sync::CancellationToken;

use super::Making;
use super::lifecycle::record_of;
use super::{CreateRequest, SandboxView};
use crate::error::EngineError;

/// How long after a handover its replacement starts.
const REFILL_DELAY: Duration = Duration::from_millis(200);

/// The tenant of pooled sandboxes.
pub(crate) const POOL_TENANT: &str = "\u{1}warm-pool";

/// The metadata key of a pooled sandbox naming the template it was made from, by
/// [`fingerprint`] (a create that takes it gives it the request's metadata instead).
const MADE_FROM: &str = "sandbox-mcp.pool.template";

/// What a pooled sandbox was made from: every field of its template but the pool's size (an
/// image template's description names its image), as a SHA-256 digest.
fn fingerprint(template: &Template) -> String {
    let file = sandbox_mcp_storage::templates::TemplateFile {
        warm: 0,
        ..template.file.clone()
    };
    let json = serde_json::to_vec(&file).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a tenant is one of the engine's own (builds, pools), never a caller's.
pub(crate) fn internal(tenant: &str) -> bool {
    tenant.starts_with('\u{1}')
}

/// One template's pool.
#[derive(Default)]
struct Pool {
    /// Started sandboxes waiting to be handed out.
    idle: Vec<String>,
    /// Sandboxes being started for the pool.
    starting: usize,
}

/// Creates sandboxes, from a template's pool when it has one.
pub struct Pools {
    pools: Mutex<HashMap<String, Pool>>,
    making: Making,
    /// Cancelled when the engine stops: refills end with it.
    stopping: CancellationToken,
}

impl Pools {
    pub(crate) fn new(making: Making, stopping: CancellationToken) -> Self {
        Self {
            pools: Mutex::new(HashMap::new()),
            making,
            stopping,
        }
    }

    /// Creates a sandbox for `req`: a pooled one when its template keeps a pool and the request
    /// asks for the template's shape, else a new one; to its end
    /// ([`super::lifecycle::Lifecycle::to_the_end`]: a handover cut short would take a pooled
    /// sandbox out of its pool without giving it to anyone).
    pub async fn create(self: &Arc<Self>, req: CreateRequest) -> Result<SandboxView, EngineError> {
        let this = self.clone();
        self.making
            .lifecycle
            .to_the_end(async move { this.create_now(req).await })
            .await
    }

    async fn create_now(self: &Arc<Self>, req: CreateRequest) -> Result<SandboxView, EngineError> {
        self.making.lifecycle.check_action(req.on_timeout)?;
        let template_name = req
            .template
            .clone()
            .unwrap_or_else(|| self.making.catalog.default_template());
        let template = self
            .making
            .catalog
            .ready_template(req.tenant.as_deref(), &template_name)?;
        let shape = req.shape.within(&template)?;
        // A pooled sandbox has the template's shape: only a request for that one takes it.
        if shape == template.shape
            && req.volumes.is_empty()
            && let Some(view) = self.take_warm(&template, &req).await?
        {
            return Ok(view);
        }
        self.making
            .lifecycle
            .create_from(req, &template, shape)
            .await
    }

    /// Hands out a pooled sandbox of `template`, adopted for `req`, and starts a replacement.
    async fn take_warm(
        self: &Arc<Self>,
        template: &Arc<Template>,
        req: &CreateRequest,
    ) -> Result<Option<SandboxView>, EngineError> {
        if template.file.warm == 0 {
            return Ok(None);
        }
        // Everything that can refuse the request is checked before a sandbox leaves the pool.
        let policy = self.making.networks.rules(&req.network)?;
        let secrets = self
            .making
            .secrets
            .bind_new(req.tenant.as_deref(), &req.secrets)?;
        let Some((id, entry)) = lock(&self.pools)
            .get_mut(&template.key)
            .and_then(|p| p.idle.pop())
            .and_then(|id| Some((id.clone(), self.making.registry.entry_any(&id).ok()?)))
        else {
            return Ok(None);
        };
        let now = ids::now_ms();
        let pooled = entry.record();
        let record = record_of(
            req,
            pooled.id,
            &pooled.template,
            pooled.shape,
            pooled.uid_slot,
            pooled.status,
            now,
            secrets,
        );
        // Adopted here, then where other replicas see it (the kubernetes driver's pod: until
        // then it is the pool's there, which no replica lists or adopts).
        let adopted = match self.making.records.adopt(&record).await {
            Ok(()) => (self.making.records.acknowledge(&record).await).map_err(EngineError::from),
            Err(e) => Err(e),
        };
        if let Err(e) = adopted {
            // Not adopted: the sandbox is the pool's no more; it goes, and the request fails.
            let _ = self.making.lifecycle.kill(&id, Some(POOL_TENANT)).await;
            self.refill(template);
            return Err(e);
        }
        entry.last_active.store(now, Ordering::Relaxed);
        self.making.lifecycle.rebind(&entry, record, policy);
        // The replacement starts a moment after the handover: starting a sandbox takes the
        // CPU for tens of milliseconds, which the first commands of this one would feel.
        self.refill_after(template, REFILL_DELAY);
        Ok(Some(self.making.registry.view(&entry)))
    }

    /// Runs `true` once in a pooled sandbox, so that the first command after the handover finds
    /// the shell, its loader and its libraries already looked up in the sandbox's own overlay
    /// (otherwise paid by that first command: 0.1–0.2 ms here, measured as a fresh sandbox's
    /// first exec against its second, each after the same idle pause). It writes nothing and
    /// leaves no process: the sandbox still holds nothing from before.
    async fn warm_up(&self, id: &str) {
        let spec = sandbox_mcp_protocol::ExecSpec {
            command: "true".into(),
            cwd: None,
            env: Vec::new(),
            timeout_ms: 10_000,
            max_output_bytes: 4096,
            stream: false,
        };
        if let Err(e) = self.making.agent.exec(id, Some(POOL_TENANT), spec).await {
            tracing::debug!(sandbox = %id, "warming a pooled sandbox failed: {e}");
        }
    }

    /// Starts sandboxes until the template's pool holds `warm` of them (in the background).
    pub(crate) fn refill(self: &Arc<Self>, template: &Arc<Template>) {
        self.refill_after(template, Duration::ZERO);
    }

    /// [`Self::refill`], the starts `delay` from now (counted as starting already, so other
    /// creates meanwhile do not start more).
    fn refill_after(self: &Arc<Self>, template: &Arc<Template>, delay: Duration) {
        if template.status() != TemplateStatus::Ready {
            return;
        }
        let want = template.file.warm as usize;
        let missing = {
            let mut pools = lock(&self.pools);
            let pool = pools.entry(template.key.clone()).or_default();
            let missing = want.saturating_sub(pool.idle.len() + pool.starting);
            pool.starting += missing;
            missing
        };
        for _ in 0..missing {
            let (this, template) = (self.clone(), template.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let start = this.making.lifecycle.create_from(
                    CreateRequest {
                        tenant: Some(POOL_TENANT.to_string()),
                        metadata: [(MADE_FROM.to_string(), fingerprint(&template))].into(),
                        ..Default::default()
                    },
                    &template,
                    template.shape,
                );
                let made = tokio::select! {
                    // The engine stops: no more sandboxes (one under way is finished and
                    // paused with the rest; the next start takes it back into the pool).
                    () = this.stopping.cancelled() => return,
                    made = start => made,
                };
                if let Ok(view) = &made {
                    this.warm_up(&view.record.id).await;
                }
                let mut pools = lock(&this.pools);
                let pool = pools.entry(template.key.clone()).or_default();
                pool.starting = pool.starting.saturating_sub(1);
                match made {
                    Ok(view) => pool.idle.push(view.record.id),
                    Err(e) => {
                        tracing::warn!(template = %template.name, "cannot start a warm sandbox: {e}")
                    }
                }
            });
        }
    }

    /// Kills the pooled sandboxes of the template `key` (it is being deleted).
    pub(crate) async fn drain(&self, key: &str) {
        let idle = lock(&self.pools)
            .remove(key)
            .map(|p| p.idle)
            .unwrap_or_default();
        for id in idle {
            let _ = self.making.lifecycle.kill(&id, Some(POOL_TENANT)).await;
        }
    }

    /// After a restart: the engine's pooled sandboxes of before are handed out again when they
    /// are still what the pool would start (see [`Self::still_fresh`]) and answer; the rest of
    /// its own (stale pooled ones, those of interrupted builds) are killed; every template's
    /// pool is then refilled. So a restart of the engine, or of a replica on the kubernetes
    /// driver, costs no pooled pod that still runs.
    /// Runs in the background: the engine serves meanwhile (creates start new sandboxes until
    /// the kept ones are back in their pools).
    pub(crate) fn restart_internal(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = this.stopping.cancelled() => {}
                () = this.take_back() => {}
            }
        });
    }

    async fn take_back(self: &Arc<Self>) {
        let templates: HashMap<String, Arc<Template>> = self
            .making
            .catalog
            .templates()
            .into_iter()
            .map(|t| (t.key.clone(), t))
            .collect();
        let mut kept: HashMap<String, Vec<String>> = HashMap::new();
        let mut checks = Vec::new();
        for (id, entry) in self.making.registry.entries() {
            if !entry.internal() {
                continue;
            }
            let record = entry.record();
            let template = (record.tenant.as_deref() == Some(POOL_TENANT))
                .then(|| templates.get(&record.template))
                .flatten()
                .filter(|t| still_fresh(&record, t));
            let room = template.is_some_and(|t| {
                let n = kept.entry(t.key.clone()).or_default();
                let room = n.len() < t.file.warm as usize;
                if room {
                    n.push(id.clone());
                }
                room
            });
            let this = self.clone();
            checks.push(async move {
                if room && this.answers(&id).await {
                    return None;
                }
                let _ = this
                    .making
                    .lifecycle
                    .kill(&id, entry.tenant().as_deref())
                    .await;
                Some(id)
            });
        }
        // Checked side by side: a pod's answer takes a round trip through the API server.
        let dropped: Vec<String> = futures::future::join_all(checks)
            .await
            .into_iter()
            .flatten()
            .collect();
        {
            let mut pools = lock(&self.pools);
            for (key, ids) in kept {
                let idle: Vec<String> =
                    ids.into_iter().filter(|id| !dropped.contains(id)).collect();
                tracing::info!(template = %key, kept = idle.len(), "warm pool kept across the restart");
                pools.entry(key).or_default().idle.extend(idle);
            }
        }
        for t in templates.values() {
            self.refill(t);
        }
    }

    /// Whether a pooled sandbox of before the restart runs (resumed, or started again if its
    /// agent died) and its agent answers.
    async fn answers(&self, id: &str) -> bool {
        let deadline = Duration::from_secs(10);
        let ping = self.making.agent.call(
            id,
            Some(POOL_TENANT),
            sandbox_mcp_protocol::Ping {},
            deadline,
        );
        match ping.await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(sandbox = %id, "a pooled sandbox of before does not answer: {e}");
                false
            }
        }
    }
}

/// Whether a pooled sandbox is what its template's pool would start now: made from the
/// template as it is (not an earlier one of the same name), in its shape, mounting nothing.
fn still_fresh(record: &sandbox_mcp_model::Record, template: &Template) -> bool {
    template.status() == TemplateStatus::Ready
        && record.metadata.get(MADE_FROM) == Some(&fingerprint(template))
        && record.shape == template.shape
        && record.volumes.is_empty()
        && record.env.is_empty()
        && record.secrets.is_empty()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sandbox_mcp_storage::templates::image_template;

    use super::fingerprint;

    #[test]
    fn a_pooled_sandbox_of_another_image_is_stale_but_not_one_of_another_pool_size() {
        let dir = Path::new("/nonexistent");
        let made_from = image_template(dir, dir, "base", "example/base:1");
        let mut resized = image_template(dir, dir, "base", "example/base:1");
        resized.file.warm = 4;
        let new_image = image_template(dir, dir, "base", "example/base:2");
        assert_eq!(fingerprint(&made_from), fingerprint(&resized));
        assert_ne!(fingerprint(&made_from), fingerprint(&new_image));
    }
}
