//! Secrets bound to sandboxes: each binding gives one environment variable a stand-in, and the
//! egress path (`network::intercept`) swaps the stand-in for the value on its way to the secret's
//! hosts. Values never pass through here: only names, hosts and stand-ins.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::SandboxView;
use super::networks::bindings;
use super::registry::{Entry, Registry};
use crate::driver::{DriverHandle, blocking};
use crate::error::EngineError;
use crate::records::Records;
use crate::state::Binding;
use sandbox_mcp_network::secrets::{self, NewSecret, SecretError, SecretMeta, SecretStore};
use sandbox_mcp_sys::lock;

/// Most secrets bound to one sandbox.
pub(crate) const MAX_BINDINGS: usize = 32;

/// A secret as `list_secrets` reports it.
#[derive(Debug, Clone)]
pub struct SecretView {
    pub meta: SecretMeta,
    /// The caller's sandboxes that bind it.
    pub used_by: Vec<String>,
}

/// The variables a sandbox's bindings set: each to its stand-in.
fn standins(secrets: &BTreeMap<String, Binding>) -> impl Iterator<Item = (String, String)> + '_ {
    secrets
        .iter()
        .map(|(env, b)| (env.clone(), b.standin.clone()))
}

/// What every command started in the sandbox gets ahead of its own environment.
pub(crate) fn bound_env(entry: &Entry) -> Vec<(String, String)> {
    let record = lock(&entry.record);
    // The sandbox's own variables too: a sandbox handed out from a warm pool was started
    // before they were known (for others they are already in the agent's environment).
    record
        .env
        .iter()
        .cloned()
        .chain(standins(&record.secrets))
        .collect()
}

/// Refuses a binding's variable that is no environment variable name.
pub fn check_binding_name(env: &str) -> Result<(), EngineError> {
    if valid_env(env) {
        return Ok(());
    }
    Err(EngineError::InvalidArgument(format!(
        "{env:?} is not an environment variable name: letters, digits and `_`, not starting with a digit (e.g. OPENAI_API_KEY)"
    )))
}

fn valid_env(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl From<SecretError> for EngineError {
    fn from(e: SecretError) -> Self {
        match e {
            SecretError::Invalid(m) => EngineError::InvalidArgument(m),
            SecretError::NotFound(name) => EngineError::NotFound(format!(
                "secret {name} does not exist; secret_list shows the ones you may bind"
            )),
            e @ SecretError::Key { .. } => EngineError::Unavailable {
                what: "the engine's secrets key cannot be used",
                source: e.into(),
            },
            SecretError::Db(db) => EngineError::State(db),
        }
    }
}

/// Secrets and their bindings to sandboxes.
pub struct Secrets {
    store: Arc<SecretStore>,
    registry: Arc<Registry>,
    records: Arc<Records>,
    driver: DriverHandle,
}

impl Secrets {
    pub(crate) fn new(
        store: Arc<SecretStore>,
        registry: Arc<Registry>,
        records: Arc<Records>,
        driver: DriverHandle,
    ) -> Self {
        Self {
            store,
            registry,
            records,
            driver,
        }
    }

    /// Checks bindings for a new sandbox and gives each a stand-in.
    pub(crate) fn bind_new(
        &self,
        tenant: Option<&str>,
        wanted: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, Binding>, EngineError> {
        if wanted.len() > MAX_BINDINGS {
            return Err(EngineError::InvalidArgument(format!(
                "at most {MAX_BINDINGS} secrets per sandbox"
            )));
        }
        wanted
            .iter()
            .map(|(env, secret)| Ok((env.clone(), self.binding(tenant, env, secret)?)))
            .collect()
    }

    /// A new binding of `secret` (which must be the tenant's) to `env`.
    fn binding(
        &self,
        tenant: Option<&str>,
        env: &str,
        secret: &str,
    ) -> Result<Binding, EngineError> {
        if self.driver.capabilities().network_unfiltered {
            return Err(EngineError::InvalidArgument(format!(
                "the {} driver cannot broker secrets: its sandboxes' traffic does not pass through the engine; pass the value another way",
                self.driver.capabilities().name
            )));
        }
        check_binding_name(env)?;
        secrets::check_name(secret)?;
        // Another tenant's secret answers exactly like one that does not exist.
        // (An argument that names nothing, like a bad name: 400, so that the sandbox's own
        // not-found message is not borrowed for it.)
        let Some(meta) = self.store.meta(tenant, secret)? else {
            return Err(EngineError::InvalidArgument(format!(
                "secret {secret} does not exist; secret_list shows the ones you may bind"
            )));
        };
        Ok(Binding {
            secret: secret.to_string(),
            standin: secrets::standin(),
            hosts: meta.hosts,
        })
    }

    async fn store_bindings(
        &self,
        id: &str,
        entry: &Arc<Entry>,
        secrets: BTreeMap<String, Binding>,
    ) -> Result<(), EngineError> {
        self.records.set_secrets(id, secrets.clone()).await?;
        let mut record = lock(&entry.record);
        record.secrets = secrets;
        entry.net.set_bindings(bindings(&record));
        Ok(())
    }

    /// Binds `secret` to `env` in a sandbox (replacing what `env` had).
    pub async fn attach_secret(
        &self,
        id: &str,
        tenant: Option<&str>,
        env: &str,
        secret: &str,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let binding = self.binding(tenant, env, secret)?;
        let mut secrets = lock(&entry.record).secrets.clone();
        if !secrets.contains_key(env) && secrets.len() >= MAX_BINDINGS {
            return Err(EngineError::InvalidArgument(format!(
                "sandbox {id} binds {MAX_BINDINGS} secrets, the most it may; detach one first"
            )));
        }
        secrets.insert(env.to_string(), binding);
        self.store_bindings(id, &entry, secrets).await?;
        Ok(self.registry.view(&entry))
    }

    /// Unbinds `env`: its stand-in stops working at once.
    pub async fn detach_secret(
        &self,
        id: &str,
        tenant: Option<&str>,
        env: &str,
    ) -> Result<SandboxView, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let mut secrets = lock(&entry.record).secrets.clone();
        if secrets.remove(env).is_none() {
            return Err(EngineError::NotFound(format!(
                "no secret is bound to {env} in sandbox {id}; sandbox_info lists its bindings"
            )));
        }
        self.store_bindings(id, &entry, secrets).await?;
        Ok(self.registry.view(&entry))
    }

    /// The tenant's secrets, with the tenant's sandboxes that bind each.
    pub async fn secret_list(&self, tenant: Option<&str>) -> Result<Vec<SecretView>, EngineError> {
        let store = self.store.clone();
        let t = tenant.map(str::to_string);
        let metas = blocking(move || store.list(t.as_deref())).await??;
        let sandboxes: Vec<(String, Vec<String>)> = self
            .registry
            .records()
            .into_iter()
            .filter(|r| r.tenant.as_deref() == tenant)
            .map(|r| (r.id, r.secrets.into_values().map(|b| b.secret).collect()))
            .collect();
        Ok(metas
            .into_iter()
            .map(|meta| {
                let mut used_by: Vec<String> = sandboxes
                    .iter()
                    .filter(|(_, names)| names.contains(&meta.name))
                    .map(|(id, _)| id.clone())
                    .collect();
                used_by.sort();
                SecretView { meta, used_by }
            })
            .collect())
    }

    /// Creates or replaces a secret of the tenant.
    pub async fn secret_set(
        &self,
        tenant: Option<&str>,
        new: NewSecret,
        value: String,
    ) -> Result<SecretView, EngineError> {
        let store = self.store.clone();
        let t = tenant.map(str::to_string);
        let meta = blocking(move || {
            let value = secrets::Value::from(value);
            store.set(t.as_deref(), &new, value.as_bytes())
        })
        .await??;
        let used_by = self
            .secret_list(tenant)
            .await?
            .into_iter()
            .find(|v| v.meta.name == meta.name)
            .map(|v| v.used_by)
            .unwrap_or_default();
        Ok(SecretView { meta, used_by })
    }

    /// Deletes a secret of the tenant; whether it existed.
    pub async fn secret_delete(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<bool, EngineError> {
        secrets::check_name(name)?;
        let store = self.store.clone();
        let (t, n) = (tenant.map(str::to_string), name.to_string());
        Ok(blocking(move || store.remove(t.as_deref(), &n)).await??)
    }
}
