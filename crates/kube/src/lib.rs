//! The `kubernetes` driver: each sandbox is a pod, placed by the cluster's scheduler.
//!
//! - **The agent** is the pod's PID 1, copied into the pod by an init container from the agent
//!   image (a static binary), so any image a template names works.
//! - **Reaching it**: the engine talks to the API server only. Each replica keeps one exec per
//!   pod running the bridge (`__agent-mux`) and multiplexes its agent connections over it
//!   ([`mux`]): a new exec costs 50-90 ms, a new stream nothing.
//! - **State** lives on the pods ([`pod`]): labels and a record annotation. Replicas keep a
//!   local cache only, and find sandboxes another replica made through the API server.
//! - **Failures** are the pod status's words ([`status`]): the container, its exit code, reason
//!   and last log lines, so that a pod deleted after a failed start still says why it failed.
//! - **Not supported**, said as such: pause (a pod cannot be frozen through the API),
//!   snapshots and forks, capture, egress rules and secrets (no egress path: sandboxes get the
//!   namespace's NetworkPolicy), desktops.

mod deadline;
pub mod mux;
pub mod pod;
pub mod status;
mod volumes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use mux::Mux;
use pod::{PodOptions, PodRecord, PodState};
use sandbox_mcp_model::Record;
use sandbox_mcp_model::driver::{
    AgentConn, Capabilities, Driver, DriverError, Isolation, Liveness, NoStorage, Shared,
    SharedRecords, StartSpec, Usage,
};
use sandbox_mcp_protocol::Ping;
use sandbox_mcp_protocol::mux::AGENT_DIR;
use sandbox_mcp_sys::lock;

/// How long a pod may take to run (an image pull included) before the create fails.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A sandbox's multiplexer, once opened.
type MuxSlot = Arc<tokio::sync::Mutex<Option<Arc<Mux>>>>;

pub struct KubernetesDriver {
    pods: Api<Pod>,
    opts: PodOptions,
    /// One multiplexed exec per sandbox, opened on first use; the lock per sandbox keeps
    /// concurrent first calls from opening several.
    muxes: Mutex<HashMap<String, MuxSlot>>,
    /// For the trait's synchronous methods, which run on blocking threads.
    runtime: tokio::runtime::Handle,
}

/// A client for the cluster `KUBECONFIG` (or `~/.kube/config`, or the pod's service account)
/// names: the layers kube's own client has (base URI, credentials, extra headers; not its
/// tracing, nor its read timeout, which would cut a quiet exec stream), over a connector with
/// Nagle's algorithm off. Over an exec stream each agent call is a few small writes (a stream's
/// open, its request, the previous stream's close); with Nagle on, one waits for the API
/// server's delayed ACK, 40 ms per call (measured: 44 ms warm exec round trips, against 3 ms
/// without). Behind a proxy, kube's client as it comes.
async fn client() -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt;
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https),
        );
    Ok(kube::Client::new(service, config.default_namespace))
}

/// A kube error in words, with what to check for the common ones.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "the API server refused: {} (the engine's service account needs the verbs in deploy/kubernetes/rbac.yaml)",
            s.message
        ),
        kube::Error::Api(s) => format!("the API server answered {}: {}", s.code, s.message),
        other => format!("cannot reach the API server: {other}"),
    }
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn gone(id: &str) -> DriverError {
    DriverError::Gone(format!(
        "sandbox {id} is gone: its pod no longer exists (deleted outside the engine, or by its timeout); create a new sandbox"
    ))
}

impl KubernetesDriver {
    /// Connects with `KUBECONFIG` (or `~/.kube/config`, or in-cluster credentials) and checks
    /// that the namespace's pods can be listed.
    pub async fn new(opts: PodOptions) -> Result<Self, DriverError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = client().await.map_err(|e| {
            DriverError::Unsupported(format!(
                "cannot load Kubernetes credentials ({e}); set KUBECONFIG, or run the engine in a pod with a service account"
            ))
        })?;
        let pods: Api<Pod> = Api::namespaced(client, &opts.namespace);
        pods.list_metadata(&ListParams::default().limit(1))
            .await
            .map_err(|e| {
                DriverError::Unsupported(format!(
                    "cannot list pods in namespace {}: {}",
                    opts.namespace,
                    describe(&e)
                ))
            })?;
        Ok(KubernetesDriver {
            pods,
            opts,
            muxes: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    fn selector() -> String {
        format!("{}={}", pod::MANAGED_BY.0, pod::MANAGED_BY.1)
    }

    /// Waits until the pod runs, or fails with why it cannot.
    async fn wait_running(&self, name: &str) -> Result<(), DriverError> {
        let params = kube::api::WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(START_TIMEOUT.as_secs() as u32);
        let check = |p: &Pod| -> Option<Result<(), DriverError>> {
            if let Some(why) = status::start_failure(p) {
                return Some(Err(DriverError::Launch(why)));
            }
            // Being deleted (by another replica's sweep, or from outside).
            if let PodState::Gone(why) = pod::state(p) {
                return Some(Err(DriverError::Launch(why)));
            }
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            (phase == Some("Running")).then_some(Ok(()))
        };
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            // The pod as it is now (it may already run), then its changes from that version.
            let current = self.pods.get(name).await.map_err(|e| {
                DriverError::Launch(format!("cannot read the sandbox's pod: {}", describe(&e)))
            })?;
            if let Some(done) = check(&current) {
                return done;
            }
            let version = current.metadata.resource_version.unwrap_or_default();
            let mut events = self
                .pods
                .watch(&params, &version)
                .await
                .map_err(|e| DriverError::Launch(describe(&e)))?
                .boxed();
            loop {
                let next = tokio::time::timeout_at(deadline, events.next()).await;
                match next {
                    Err(_) => {
                        return Err(DriverError::Launch(format!(
                            "the sandbox's pod did not run within {} s (is the cluster short of the resources its shape asks for?)",
                            START_TIMEOUT.as_secs()
                        )));
                    }
                    Ok(Some(Ok(
                        kube::api::WatchEvent::Added(p) | kube::api::WatchEvent::Modified(p),
                    ))) => {
                        if let Some(done) = check(&p) {
                            return done;
                        }
                    }
                    Ok(Some(Ok(kube::api::WatchEvent::Deleted(_)))) => {
                        return Err(DriverError::Launch(
                            "the sandbox's pod was deleted while it started".into(),
                        ));
                    }
                    // A bookmark, an error event or the watch's end: watch again from a
                    // fresh read.
                    Ok(_) => break,
                }
            }
        }
    }

    /// Why the pod of a start will not run, when its status says.
    async fn start_failure(&self, name: &str) -> Option<String> {
        let pod = self.pods.get(name).await.ok()?;
        status::start_failure(&pod)
    }

    /// Opens a new bridge exec in the pod.
    async fn open_mux(&self, id: &str) -> Result<Arc<Mux>, DriverError> {
        let name = pod::pod_name(id);
        let params = AttachParams::default()
            .container(pod::CONTAINER)
            .stdin(true)
            .stdout(true)
            .stderr(false);
        let command = [
            format!("{AGENT_DIR}/sandbox-mcp"),
            "__agent-mux".to_string(),
        ];
        match self.pods.exec(&name, command, &params).await {
            Ok(mut process) => {
                let (Some(input), Some(output)) = (process.stdout(), process.stdin()) else {
                    return Err(DriverError::Agent(
                        "the exec into the pod has no stdio".into(),
                    ));
                };
                Ok(Mux::start(input, output, process))
            }
            Err(e) if not_found(&e) => Err(gone(id)),
            Err(e) => {
                // The pod may have ended: say so rather than how the exec failed.
                match self.pods.get(&name).await {
                    Err(e) if not_found(&e) => Err(gone(id)),
                    Ok(p) => match pod::state(&p) {
                        PodState::Gone(why) => Err(DriverError::Gone(why)),
                        _ => Err(DriverError::Agent(format!(
                            "cannot reach the sandbox's agent: {}",
                            describe(&e)
                        ))),
                    },
                    Err(_) => Err(DriverError::Agent(format!(
                        "cannot reach the sandbox's agent: {}",
                        describe(&e)
                    ))),
                }
            }
        }
    }

    async fn stream(&self, id: &str) -> Result<AgentConn, DriverError> {
        let slot = lock(&self.muxes).entry(id.to_string()).or_default().clone();
        let mut held = slot.lock().await;
        if let Some(m) = held.as_ref().filter(|m| !m.is_dead())
            && let Ok(s) = m.open().await
        {
            return Ok(Box::new(s));
        }
        let m = self.open_mux(id).await?;
        *held = Some(m.clone());
        let s = m
            .open()
            .await
            .map_err(|e| DriverError::Agent(format!("the pod's bridge ended at once: {e}")))?;
        Ok(Box::new(s))
    }

    /// Whether the agent answers a ping on a new stream.
    async fn ping(&self, id: &str) -> Result<(), DriverError> {
        let mut conn = self.stream(id).await?;
        sandbox_mcp_protocol::exchange(&mut conn, Ping {})
            .await
            .map_err(|e| DriverError::Agent(e.to_string()))?
            .map(|_| ())
            .map_err(|e| DriverError::Agent(e.message))
    }

    async fn delete(&self, id: &str) -> Result<(), DriverError> {
        lock(&self.muxes).remove(id);
        match self
            .pods
            .delete(&pod::pod_name(id), &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(DriverError::Io {
                what: "delete the sandbox's pod",
                source: std::io::Error::other(describe(&e)),
            }),
        }
    }

    fn unsupported(what: &str) -> DriverError {
        DriverError::Unsupported(format!("the kubernetes driver cannot {what}"))
    }
}

impl KubernetesDriver {
    /// The driver as the engine holds it. Its capabilities: limits are the pod's (enforced;
    /// `ephemeral-storage` makes the kubelet evict a pod over its disk size, a kill rather than a
    /// full disk, so disk limits are not reported as enforced); the pod network is the cluster's,
    /// which the engine does not filter; pods are reached through exec streams only (no fd
    /// passing: no preview connections); a stopped sandbox's pod is deleted with its files; the
    /// templates are the configured images. Its files stay in the pods (no storage the engine can
    /// reach), and its records live on the pods, shared by every engine replica.
    pub fn into_driver(self) -> Driver {
        let capabilities = Capabilities {
            name: NAME,
            limits_enforced: true,
            disk_limits_enforced: false,
            egress: false,
            network_unfiltered: true,
            serves_ports: false,
            restarts_stopped: false,
            timeouts_extend: false,
            image_templates: Some(
                std::iter::once((
                    sandbox_mcp_model::BASE_TEMPLATE.to_string(),
                    self.opts.default_image.clone(),
                ))
                .chain(self.opts.images.clone())
                .collect(),
            ),
            live_state: sandbox_mcp_model::driver::LiveState {
                available: false,
                detail: KUBE_NO_LIVE_STATE.into(),
            },
            volumes_refused: self
                .opts
                .storage_class
                .is_none()
                .then(|| KUBE_NO_VOLUMES.into()),
            workspaces_refused: Some(KUBE_NO_WORKSPACES.into()),
            volume_quotas: true,
        };
        let storage: Arc<dyn sandbox_mcp_model::driver::Storage> = match &self.opts.storage_class {
            Some(class) => Arc::new(volumes::Claims::new(
                self.pods.clone().into_client(),
                &self.opts.namespace,
                class,
                self.runtime.clone(),
            )),
            None => Arc::new(NoStorage(NAME)),
        };
        let this = Arc::new(self);
        Driver {
            capabilities,
            isolation: this.clone(),
            storage,
            shared: Some(this),
        }
    }
}

/// This driver's name, as the health endpoint and refusals show it.
const NAME: &str = "kubernetes";

impl Isolation for KubernetesDriver {
    fn no_live_state(&self) -> String {
        KUBE_NO_LIVE_STATE.into()
    }

    /// Slots only number this replica's cache entries (pods need no uid ranges).
    fn claim_slots(&self, taken: &[u32], count: usize) -> Result<Vec<u32>, DriverError> {
        Ok((0..).filter(|s| !taken.contains(s)).take(count).collect())
    }

    fn release_slot(&self, _slot: u32) {}

    fn reconcile_slots(&self, _held: &[u32]) {}

    fn close(&self) {}

    fn start<'a>(&'a self, spec: &'a StartSpec) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let record = PodRecord::of(&spec.record);
            let pod = pod::build(
                &self.opts,
                &record,
                &spec.env,
                spec.workdir.as_deref(),
                sandbox_mcp_model::ids::now_ms(),
            )
            .map_err(DriverError::Launch)?;
            let mut pod = pod;
            volumes::mount_claims(&mut pod, &spec.volumes);
            let name = pod::pod_name(&spec.id);
            match self.pods.create(&PostParams::default(), &pod).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // A pod of that name exists: a sandbox's pod is never made twice, so this is
                    // a restart of one that ended, which would come back without its files.
                    return Err(DriverError::Gone(format!(
                        "sandbox {} cannot be restarted on the kubernetes driver (its processes and files went with its pod); create a new sandbox",
                        spec.id
                    )));
                }
                Err(e) => {
                    return Err(DriverError::Launch(format!(
                        "cannot create the sandbox's pod: {}",
                        describe(&e)
                    )));
                }
            }
            let started = async {
                self.wait_running(&name).await?;
                // The container runs; its agent listens a moment later.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    match self.ping(&spec.id).await {
                        Ok(()) => return Ok(()),
                        // Its container ended as it started (the agent could not run): why, as
                        // for a pod that never ran.
                        Err(e @ DriverError::Gone(_)) => {
                            return Err(self
                                .start_failure(&name)
                                .await
                                .map_or(e, DriverError::Launch));
                        }
                        Err(e) if tokio::time::Instant::now() >= deadline => {
                            let why = self.start_failure(&name).await.unwrap_or_else(|| {
                                format!("the sandbox's agent did not answer: {e}")
                            });
                            return Err(DriverError::Launch(why));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            };
            let result = started.await;
            if result.is_err() {
                let _ = self.delete(&spec.id).await;
            }
            result
        })
    }

    fn connect<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<AgentConn, DriverError>> {
        Box::pin(self.stream(id))
    }

    fn liveness<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Liveness> {
        Box::pin(async move {
            match self.pods.get(&pod::pod_name(id)).await {
                Err(e) if not_found(&e) => Liveness::Gone,
                Ok(p) if matches!(pod::state(&p), PodState::Gone(_)) => Liveness::Gone,
                // Unreachable API server: not known to be gone.
                _ => Liveness::Running,
            }
        })
    }

    fn freeze(&self, _id: &str) -> Result<(), DriverError> {
        Err(Self::unsupported(
            "pause a sandbox: a pod's processes cannot be frozen through the Kubernetes API, and stopping the pod would lose its files; the sandbox keeps running (kill it when done)",
        ))
    }

    fn thaw(&self, _id: &str) -> Result<(), DriverError> {
        Ok(())
    }

    /// A wedged agent: its pod is deleted (there is no restarting a pod with its files).
    fn stop(&self, id: &str) -> Result<(), DriverError> {
        self.runtime.block_on(self.delete(id))
    }

    fn destroy(&self, id: &str) -> Result<(), DriverError> {
        self.runtime.block_on(self.delete(id))
    }

    fn usage(&self, _id: &str) -> Usage {
        Usage::default()
    }
}

/// The sandboxes' records, on their pods (annotations): every replica sees the same ones.
impl SharedRecords for KubernetesDriver {
    fn all(&self) -> BoxFuture<'_, Result<Vec<Record>, DriverError>> {
        Box::pin(async move {
            let list = self
                .pods
                .list(&ListParams::default().labels(&Self::selector()))
                .await
                .map_err(|e| DriverError::Io {
                    what: "list the sandboxes' pods",
                    source: std::io::Error::other(describe(&e)),
                })?;
            // Called on every tick by every replica: the one place that cleans up after a
            // replica that died mid-create, and after sandboxes that ended.
            let now = sandbox_mcp_model::ids::now_ms() / 1000;
            for p in &list.items {
                if let (Some(why), Some(name)) = (pod::sweep(p, now), p.metadata.name.as_deref()) {
                    tracing::info!(pod = name, "deleting a sandbox pod: {why}");
                    let _ = self.delete(&pod::sandbox_id(name)).await;
                }
            }
            Ok(list
                .items
                .iter()
                .filter(|p| pod::state(p) == PodState::Ready)
                .filter_map(pod::record)
                .map(|r| r.into_record(0))
                .collect())
        })
    }

    fn find<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Shared>, DriverError>> {
        Box::pin(async move {
            if !sandbox_mcp_model::ids::is_sandbox_id(id) {
                return Ok(None);
            }
            match self.pods.get(&pod::pod_name(id)).await {
                Ok(p) => {
                    let Some(record) = pod::record(&p)
                        .filter(|r| r.id == id)
                        .map(|r| r.into_record(0))
                    else {
                        return Ok(None);
                    };
                    Ok(match pod::state(&p) {
                        PodState::Ready => Some(Shared::Live(record)),
                        // Ended (its deadline, the OOM killer, an eviction): kept a while by
                        // the sweep so that this can say why.
                        PodState::Gone(why) => Some(Shared::Gone(record, why)),
                        PodState::Creating => None,
                    })
                }
                Err(e) if not_found(&e) => Ok(None),
                Err(e) => Err(DriverError::Io {
                    what: "read the sandbox's pod",
                    source: std::io::Error::other(describe(&e)),
                }),
            }
        })
    }

    fn acknowledge<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let text = serde_json::to_string(&PodRecord::of(record))
                .map_err(|e| DriverError::Agent(e.to_string()))?;
            let mut patch = serde_json::json!({
                "metadata": {
                    "labels": { pod::STATE_LABEL: "ready" },
                    "annotations": { pod::RECORD_ANNOTATION: text },
                }
            });
            // The kubelet's own kill follows the timeout: a pooled pod handed out with one, or
            // a timeout shortened (it is never moved later here).
            if record.expires_at.is_some() {
                let name = pod::pod_name(&record.id);
                let current = match self.pods.get(&name).await {
                    Ok(p) => p,
                    Err(e) if not_found(&e) => return Err(gone(&record.id)),
                    Err(e) => {
                        return Err(DriverError::Io {
                            what: "read the sandbox's pod",
                            source: std::io::Error::other(describe(&e)),
                        });
                    }
                };
                if let Some(seconds) = deadline::lowered(&current, record.expires_at) {
                    patch["spec"] = serde_json::json!({ "activeDeadlineSeconds": seconds });
                }
            }
            match self
                .pods
                .patch(
                    &pod::pod_name(&record.id),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if not_found(&e) => Err(gone(&record.id)),
                Err(e) => Err(DriverError::Io {
                    what: "record the sandbox on its pod",
                    source: std::io::Error::other(describe(&e)),
                }),
            }
        })
    }
}

/// Why the kubernetes driver carries no running processes.
const KUBE_NO_LIVE_STATE: &str = "the kubernetes driver cannot checkpoint running processes: Kubernetes 1.20 has no checkpoint API";
const KUBE_NO_VOLUMES: &str = "named volumes on the kubernetes driver are PersistentVolumeClaims: start the engine with --storage-class NAME (a class that can bind ReadWriteMany claims) to use them";
const KUBE_NO_WORKSPACES: &str = "workspaces are folders of the engine's host, which a pod on a cluster cannot see: use them with the namespaces driver (no --driver kubernetes)";
