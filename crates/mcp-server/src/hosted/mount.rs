//! Hosted servers mounted into our own endpoint (`--mount-servers a,b` or `all`): their tools
//! join ours in `tools/list`, namespaced `a__search`, with their annotations and schemas; their
//! prompts likewise, their resources under their own URIs. Each MCP session of ours gets its own
//! instance of each mounted server, started on first use and ended with the session.
//!
//! What a mounted server sends on its own goes to our client: notifications as they are, and its
//! requests (sampling, elicitation, roots) when our client declared the capability; otherwise the
//! server gets an error at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolResult, GetPromptResult, Prompt, ReadResourceResult, Resource, ServerNotification,
    ServerRequest, Tool,
};
use rmcp::{Peer, RoleServer};
use serde_json::{Value, json};

use super::http::lookup;
use super::relay::{Instance, error_response};
use super::sessions::Sessions;
use sandbox_mcp_sys::lock;

/// Separates a mounted server's name from its tool's or prompt's.
pub const SEPARATOR: &str = "__";
/// How long a mounted call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(600);

/// Which hosted servers are mounted.
#[derive(Debug, Clone, PartialEq)]
pub enum MountSet {
    All,
    Names(Vec<String>),
}

impl MountSet {
    /// From `--mount-servers`: `all`, or names separated by commas.
    pub fn parse(names: &[String]) -> Option<Self> {
        if names.is_empty() {
            return None;
        }
        if names.iter().any(|n| n == "all") {
            return Some(Self::All);
        }
        Some(Self::Names(names.to_vec()))
    }
}

/// One MCP session's mounted servers.
pub struct Mounted {
    sessions: Sessions,
    set: MountSet,
    instances: tokio::sync::Mutex<HashMap<String, Arc<Instance>>>,
    peer: Mutex<Option<Peer<RoleServer>>>,
    /// Resource URI → the server that listed it.
    resources: Mutex<HashMap<String, String>>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let instances: Vec<Arc<Instance>> = match self.instances.try_lock() {
            Ok(mut map) => map.drain().map(|(_, i)| i).collect(),
            Err(_) => Vec::new(),
        };
        if instances.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                futures::future::join_all(instances.iter().map(|i| i.kill())).await;
            });
        }
    }
}

fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
}

fn failure(message: String) -> rmcp::ErrorData {
    rmcp::ErrorData::internal_error(message, None)
}

impl Mounted {
    pub fn new(sessions: Sessions, set: MountSet) -> Self {
        Self {
            sessions,
            set,
            instances: tokio::sync::Mutex::new(HashMap::new()),
            peer: Mutex::new(None),
            resources: Mutex::new(HashMap::new()),
        }
    }

    /// Ends this session's instances.
    pub async fn end(&self) {
        let instances: Vec<Arc<Instance>> = self
            .instances
            .lock()
            .await
            .drain()
            .map(|(_, i)| i)
            .collect();
        futures::future::join_all(instances.iter().map(|i| i.kill())).await;
    }

    /// Remembers our client, for what mounted servers send it.
    pub fn seen(&self, peer: &Peer<RoleServer>) {
        let mut slot = lock(&self.peer);
        if slot.is_none() {
            *slot = Some(peer.clone());
        }
    }

    /// The mounted servers' names `tenant` may use.
    async fn names(&self, tenant: Option<&str>) -> Vec<String> {
        match &self.set {
            MountSet::Names(names) => names.clone(),
            MountSet::All => {
                let Ok(handle) = self.sessions.backend().client(tenant).await else {
                    return Vec::new();
                };
                match handle.client.list_servers().send().await {
                    Ok(list) => list
                        .into_inner()
                        .servers
                        .into_iter()
                        .map(|s| s.name.to_string())
                        .collect(),
                    Err(_) => Vec::new(),
                }
            }
        }
    }

    fn mounted(&self, name: &str) -> bool {
        match &self.set {
            MountSet::All => true,
            MountSet::Names(names) => names.iter().any(|n| n == name),
        }
    }

    /// This session's instance of `name`, started (and initialized) on first use.
    async fn instance(&self, tenant: Option<&str>, name: &str) -> Result<Arc<Instance>, String> {
        {
            let mut instances = self.instances.lock().await;
            if let Some(i) = instances.get(name) {
                if i.ended().is_none() {
                    return Ok(i.clone());
                }
                // It exited: the next use starts a fresh one.
                instances.remove(name);
            }
        }
        // Started without the lock held: one slow server does not hold up the others.
        let server = lookup(&self.sessions, tenant, name).await?;
        let instance = self.sessions.one_off(tenant, &server).await?;
        let mut instances = self.instances.lock().await;
        if let Some(other) = instances.get(name).filter(|i| i.ended().is_none()) {
            // Another call started one meanwhile: keep that one (ours goes when dropped).
            return Ok(other.clone());
        }
        self.pump(&instance);
        instances.insert(name.to_string(), instance.clone());
        Ok(instance)
    }

    /// Relays what `instance` sends on its own to our client.
    fn pump(&self, instance: &Arc<Instance>) {
        let Some(peer) = lock(&self.peer).clone() else {
            return;
        };
        let weak = Arc::downgrade(instance);
        tokio::spawn(async move {
            loop {
                let Some(instance) = weak.upgrade() else {
                    return;
                };
                let Some(message) = instance.next_event().await else {
                    return;
                };
                relay_to_client(&peer, &instance, message).await;
            }
        });
    }

    async fn request(
        &self,
        tenant: Option<&str>,
        server: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, String> {
        let instance = self.instance(tenant, server).await?;
        let id = json!(format!("mount-{}", next_id()));
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let raw = instance.request(&message, CALL_DEADLINE).await?;
        let response: Value = serde_json::from_str(&raw)
            .map_err(|e| format!("server {server} answered with something else: {e}"))?;
        if let Some(error) = response.get("error") {
            return Err(format!(
                "server {server}: {}",
                error["message"].as_str().unwrap_or("failed")
            ));
        }
        Ok(response["result"].clone())
    }

    /// Every page of a list (`tools/list` and the like) of one server.
    async fn list_all(
        &self,
        tenant: Option<&str>,
        server: &str,
        method: &str,
        field: &str,
    ) -> Result<Vec<Value>, String> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..100 {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let result = self.request(tenant, server, method, params).await?;
            items.extend(result[field].as_array().cloned().unwrap_or_default());
            cursor = result["nextCursor"].as_str().map(String::from);
            if cursor.is_none() {
                break;
            }
        }
        Ok(items)
    }

    /// The mounted servers' tools, namespaced. A server that cannot start is left out (and
    /// logged): the rest of the list still works.
    pub async fn tools(&self, tenant: Option<&str>) -> Vec<Tool> {
        let mut out = Vec::new();
        for name in self.names(tenant).await {
            match self.list_all(tenant, &name, "tools/list", "tools").await {
                Ok(tools) => {
                    for mut t in tools {
                        let Some(own) = t["name"].as_str().map(String::from) else {
                            continue;
                        };
                        t["name"] = json!(format!("{name}{SEPARATOR}{own}"));
                        match serde_json::from_value::<Tool>(t) {
                            Ok(tool) => out.push(tool),
                            Err(e) => {
                                tracing::warn!(server = %name, "a tool that does not parse: {e}")
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(server = %name, "mounted server unavailable: {e}"),
            }
        }
        out
    }

    /// Calls a namespaced tool of a mounted server; `None` when `name` is not one.
    pub async fn call(
        &self,
        tenant: Option<&str>,
        name: &str,
        arguments: Option<Value>,
        meta: Option<Value>,
    ) -> Option<Result<CallToolResult, rmcp::ErrorData>> {
        let (server, tool) = split(name)?;
        if !self.mounted(server) {
            return None;
        }
        let mut params = json!({"name": tool, "arguments": arguments.unwrap_or_else(|| json!({}))});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        let result = match self.request(tenant, server, "tools/call", params).await {
            Ok(r) => r,
            Err(e) => {
                return Some(Ok(CallToolResult::error(vec![
                    rmcp::model::ContentBlock::text(e),
                ])));
            }
        };
        Some(serde_json::from_value(result).map_err(|e| {
            failure(format!(
                "server {server} answered a tool call with something else: {e}"
            ))
        }))
    }

    pub async fn prompts(&self, tenant: Option<&str>) -> Vec<Prompt> {
        let mut out = Vec::new();
        for name in self.names(tenant).await {
            let Ok(prompts) = self
                .list_all(tenant, &name, "prompts/list", "prompts")
                .await
            else {
                continue;
            };
            for mut p in prompts {
                let Some(own) = p["name"].as_str().map(String::from) else {
                    continue;
                };
                p["name"] = json!(format!("{name}{SEPARATOR}{own}"));
                if let Ok(prompt) = serde_json::from_value(p) {
                    out.push(prompt);
                }
            }
        }
        out
    }

    pub async fn get_prompt(
        &self,
        tenant: Option<&str>,
        name: &str,
        arguments: Option<Value>,
    ) -> Result<GetPromptResult, rmcp::ErrorData> {
        let Some((server, prompt)) = split(name).filter(|(s, _)| self.mounted(s)) else {
            return Err(rmcp::ErrorData::invalid_params(
                format!("no prompt named {name}"),
                None,
            ));
        };
        let mut params = json!({"name": prompt});
        if let Some(a) = arguments {
            params["arguments"] = a;
        }
        let result = self
            .request(tenant, server, "prompts/get", params)
            .await
            .map_err(failure)?;
        serde_json::from_value(result).map_err(|e| failure(e.to_string()))
    }

    pub async fn resources(&self, tenant: Option<&str>) -> Vec<Resource> {
        let mut out = Vec::new();
        for name in self.names(tenant).await {
            let Ok(resources) = self
                .list_all(tenant, &name, "resources/list", "resources")
                .await
            else {
                continue;
            };
            for r in resources {
                if let Some(uri) = r["uri"].as_str() {
                    lock(&self.resources).insert(uri.to_string(), name.clone());
                }
                if let Ok(resource) = serde_json::from_value(r) {
                    out.push(resource);
                }
            }
        }
        out
    }

    pub async fn read_resource(
        &self,
        tenant: Option<&str>,
        uri: &str,
    ) -> Result<ReadResourceResult, rmcp::ErrorData> {
        let server = lock(&self.resources).get(uri).cloned();
        let Some(server) = server else {
            return Err(rmcp::ErrorData::resource_not_found(
                format!("no mounted server listed {uri}; list the resources first"),
                None,
            ));
        };
        let result = self
            .request(tenant, &server, "resources/read", json!({"uri": uri}))
            .await
            .map_err(failure)?;
        serde_json::from_value(result).map_err(|e| failure(e.to_string()))
    }
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One message a mounted server sent on its own, to our client (or refused back to the server).
async fn relay_to_client(peer: &Peer<RoleServer>, instance: &Instance, message: String) {
    let Ok(message) = serde_json::from_str::<Value>(&message) else {
        return;
    };
    let id = message.get("id").cloned();
    let method = message["method"].as_str().unwrap_or("").to_string();
    let mut call = json!({"method": method});
    if let Some(p) = message.get("params") {
        call["params"] = p.clone();
    }
    match id {
        None => match serde_json::from_value::<ServerNotification>(call) {
            Ok(n) => {
                let _ = peer.send_notification(n).await;
            }
            Err(e) => {
                tracing::debug!(server = %instance.name, "a notification we cannot pass on: {e}")
            }
        },
        Some(id) => {
            let declared = peer
                .peer_info()
                .map(|info| serde_json::to_value(&info.capabilities).unwrap_or_default());
            let needed = match method.as_str() {
                "sampling/createMessage" => Some("sampling"),
                "elicitation/create" => Some("elicitation"),
                "roots/list" => Some("roots"),
                _ => None,
            };
            if let Some(cap) = needed
                && declared
                    .as_ref()
                    .is_none_or(|d| d.get(cap).is_none_or(Value::is_null))
            {
                let refusal = error_response(
                    &id,
                    -32601,
                    &format!(
                        "the client did not declare the `{cap}` capability, so `{method}` cannot reach it"
                    ),
                );
                let _ = instance.send(&refusal).await;
                return;
            }
            let answer = match serde_json::from_value::<ServerRequest>(call) {
                Ok(request) => match peer.send_request(request).await {
                    Ok(result) => {
                        json!({"jsonrpc": "2.0", "id": id, "result": serde_json::to_value(result).unwrap_or_default()})
                    }
                    Err(e) => {
                        error_response(&id, -32603, &format!("the client failed the request: {e}"))
                    }
                },
                Err(e) => {
                    error_response(&id, -32601, &format!("`{method}` cannot be passed on: {e}"))
                }
            };
            let _ = instance.send(&answer).await;
        }
    }
}
