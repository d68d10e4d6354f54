//! The pod of a sandbox, and the record it carries: pure functions, unit-tested.
//!
//! The pod is the sandbox's whole state in the cluster: labels find it, the `record` annotation
//! holds what the API reports (id, tenant, template, metadata, shape, expiry), and the `state`
//! label says whether its creation was acknowledged. Any engine replica can rebuild its view from
//! the pods alone, so replicas hold nothing of their own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use sandbox_mcp_model::driver::Shape;
use sandbox_mcp_model::{NetworkRules, Record, Status};
use sandbox_mcp_protocol::mux::AGENT_DIR;

/// Label every sandbox pod has (and the engine's RBAC and NetworkPolicy select on).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "sandbox-mcp");
/// Label: the sandbox id (pod names cannot hold `_`).
pub const SANDBOX_LABEL: &str = "sandbox-mcp.dev/sandbox";
/// Label: `creating` until the engine acknowledged the sandbox, then `ready`.
pub const STATE_LABEL: &str = "sandbox-mcp.dev/state";
/// Annotation: the sandbox's record as JSON.
pub const RECORD_ANNOTATION: &str = "sandbox-mcp.dev/record";
/// The container that is the sandbox.
pub const CONTAINER: &str = "sandbox";
/// The init container that copies the agent into the pod.
pub const INIT_CONTAINER: &str = "agent";
/// A failed container's termination message is its last log lines (the kubelet keeps 2 KiB):
/// how the agent's own words reach an error after its pod was deleted.
const MESSAGE_POLICY: &str = "FallbackToLogsOnError";

pub use sandbox_mcp_model::config::PodOptions;

/// A sandbox's record as the pod annotation holds it. The uid slot is not kept: each replica
/// numbers its sandboxes itself (a cache key, meaningless in a pod).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    pub template: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    pub shape: Shape,
    pub created_at: i64,
    #[serde(default)]
    pub expires_at: Option<i64>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub network: NetworkRules,
    #[serde(default)]
    pub volumes: Vec<sandbox_mcp_model::record::Mounted>,
}

impl PodRecord {
    pub fn of(r: &Record) -> Self {
        PodRecord {
            id: r.id.clone(),
            name: r.name.clone(),
            template: r.template.clone(),
            metadata: r.metadata.clone(),
            env: r.env.clone(),
            shape: r.shape,
            created_at: r.created_at,
            expires_at: r.expires_at,
            tenant: r.tenant.clone(),
            network: r.network.clone(),
            volumes: r.volumes.clone(),
        }
    }

    /// The record a replica keeps, with its own uid slot.
    pub fn into_record(self, uid_slot: u32) -> Record {
        Record {
            id: self.id,
            name: self.name,
            template: self.template,
            status: Status::Running,
            metadata: self.metadata,
            env: self.env,
            shape: self.shape,
            uid_slot,
            created_at: self.created_at,
            last_active_at: self.created_at,
            expires_at: self.expires_at,
            tenant: self.tenant,
            network: self.network,
            secrets: BTreeMap::new(),
            desktop: None,
            volumes: self.volumes,
            // A pod can be neither paused nor stopped with its files: the engine refuses other
            // actions on this driver.
            on_timeout: Default::default(),
        }
    }
}

/// The pod name of a sandbox id: `sbx_…` with `-` (ids are lowercase base32 already).
pub fn pod_name(id: &str) -> String {
    id.replace('_', "-")
}

/// The sandbox id of a pod name made by [`pod_name`].
pub fn sandbox_id(pod: &str) -> String {
    pod.replacen('-', "_", 1)
}

/// The pod of a new sandbox. `env`: the sandbox's environment (the image's own comes on top of
/// nothing: the container runtime adds it). `now_ms`: for the kubelet's deadline.
pub fn build(
    opts: &PodOptions,
    record: &PodRecord,
    env: &[(String, String)],
    workdir: Option<&str>,
    now_ms: i64,
) -> Result<Pod, String> {
    let image = opts.image(&record.template)?.to_string();
    let name = pod_name(&record.id);
    let labels = BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (SANDBOX_LABEL.to_string(), name.clone()),
        (STATE_LABEL.to_string(), "creating".to_string()),
    ]);
    let annotations = BTreeMap::from([(
        RECORD_ANNOTATION.to_string(),
        serde_json::to_string(record).map_err(|e| e.to_string())?,
    )]);
    let binary = format!("{AGENT_DIR}/sandbox-mcp");
    let pull = opts.pull_policy.clone();
    let volume = VolumeMount {
        name: "agent".into(),
        mount_path: AGENT_DIR.into(),
        ..Default::default()
    };
    // The same restrictions on both containers: no capabilities, no privilege gain, the
    // runtime's default seccomp profile, and a non-root user when the operator names one.
    let security = SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        privileged: Some(false),
        run_as_user: opts.run_as_user.map(i64::from),
        run_as_group: opts.run_as_user.map(i64::from),
        run_as_non_root: opts.run_as_user.map(|u| u != 0),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    };
    // The agent reaches any image this way: an init container copies the static binary from the
    // agent image into a volume the sandbox container starts it from.
    let init = Container {
        name: INIT_CONTAINER.into(),
        image: Some(opts.agent_image.clone()),
        image_pull_policy: pull.clone(),
        command: Some(vec![
            "/sandbox-mcp".into(),
            "__install".into(),
            binary.clone(),
        ]),
        volume_mounts: Some(vec![volume.clone()]),
        security_context: Some(security.clone()),
        termination_message_policy: Some(MESSAGE_POLICY.into()),
        resources: Some(resources(
            &Shape {
                vcpus: record.shape.vcpus.min(0.5),
                memory_mb: record.shape.memory_mb.min(64),
                disk_mb: 0,
                max_pids: 0,
            },
            opts.cpu_overcommit,
        )),
        ..Default::default()
    };
    let main = Container {
        name: CONTAINER.into(),
        image: Some(image),
        image_pull_policy: pull,
        command: Some(vec![binary, "__agent-pod".into()]),
        env: Some(
            env.iter()
                .map(|(k, v)| EnvVar {
                    name: k.clone(),
                    value: Some(v.clone()),
                    value_from: None,
                })
                .collect(),
        ),
        working_dir: workdir.map(str::to_string),
        volume_mounts: Some(vec![volume]),
        security_context: Some(security),
        termination_message_policy: Some(MESSAGE_POLICY.into()),
        resources: Some(resources(&record.shape, opts.cpu_overcommit)),
        ..Default::default()
    };
    // `activeDeadlineSeconds` is the kubelet's own kill at the sandbox's timeout: it holds even
    // with every engine replica down. A timeout given or shortened later moves it too
    // (deadline.rs).
    let deadline = record
        .expires_at
        .map(|at| crate::deadline::seconds_between(now_ms, at));
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(opts.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![init]),
            containers: vec![main],
            volumes: Some(vec![Volume {
                name: "agent".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: None,
                    size_limit: Some(Quantity("128Mi".into())),
                }),
                ..Default::default()
            }]),
            // The sandbox never talks to the API server, and sees no service of the namespace.
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // A dead agent is a dead sandbox: the engine reports it gone rather than serve a
            // fresh container that lost every process and file.
            restart_policy: Some("Never".into()),
            active_deadline_seconds: deadline,
            // Nothing in a sandbox needs a graceful stop, but 0 would let a delete from outside
            // the engine remove the pod object at once while its container runs on (and
            // answers calls) until the kubelet catches up; with 1 the object goes only once the
            // container has stopped. The engine's own kills ask for 0 explicitly.
            termination_grace_period_seconds: Some(1),
            runtime_class_name: opts
                .runtime_classes
                .get(&record.template)
                .or_else(|| opts.runtime_classes.get("*"))
                .cloned(),
            ..Default::default()
        }),
        status: None,
    })
}

/// Requests equal limits (the Guaranteed class): a sandbox gets what its shape says, and the
/// scheduler places it where that fits. With `cpu_overcommit` above 1 the CPU request is that
/// much smaller (the Burstable class): more sandboxes share a node's cores, none uses more than
/// its shape. Memory is never overcommitted: a node short of it evicts pods, files and all.
fn resources(shape: &Shape, cpu_overcommit: f64) -> ResourceRequirements {
    let millicores =
        |vcpus: f64| Quantity(format!("{}m", (vcpus * 1000.0).round().max(1.0) as u64));
    let mut limits = BTreeMap::from([
        ("cpu".to_string(), millicores(shape.vcpus)),
        (
            "memory".to_string(),
            Quantity(format!("{}Mi", shape.memory_mb.max(1))),
        ),
    ]);
    if shape.disk_mb > 0 {
        limits.insert(
            "ephemeral-storage".to_string(),
            Quantity(format!("{}Mi", shape.disk_mb)),
        );
    }
    let mut requests = limits.clone();
    requests.insert(
        "cpu".to_string(),
        millicores(shape.vcpus / cpu_overcommit.max(1.0)),
    );
    ResourceRequirements {
        limits: Some(limits),
        requests: Some(requests),
        ..Default::default()
    }
}

/// What a pod says of its sandbox.
#[derive(Debug, Clone, PartialEq)]
pub enum PodState {
    /// Acknowledged and its container runs.
    Ready,
    /// Still being made (by this replica or another).
    Creating,
    /// Its container or the pod ended, or it is being deleted: the reason, for the caller.
    Gone(String),
}

/// Reads the state of a sandbox pod.
pub fn state(pod: &Pod) -> PodState {
    let id = pod
        .metadata
        .name
        .as_deref()
        .map(sandbox_id)
        .unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Gone(format!(
            "sandbox {id} is gone: its pod is being deleted (by another engine replica, or outside the engine); create a new sandbox"
        ));
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Failed") || phase == Some("Succeeded") {
        return PodState::Gone(super::status::gone(pod, &id));
    }
    let labelled_ready = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(STATE_LABEL))
        .is_some_and(|s| s == "ready");
    if labelled_ready {
        PodState::Ready
    } else {
        PodState::Creating
    }
}

/// A pod still `creating` this long after it was made has lost the replica making it (a start
/// gives up, and deletes its pod, well within this).
pub const ORPHAN_AFTER_SECS: i64 = 300;
/// An ended pod stays this long, so that calls on its sandbox can say why it ended.
pub const ENDED_KEPT_SECS: i64 = 600;

/// Whether a replica's sweep deletes this pod, and why: a creation no replica will finish, or a
/// sandbox that ended a while ago. Every replica sweeps; deleting twice is harmless.
pub fn sweep(pod: &Pod, now_secs: i64) -> Option<&'static str> {
    let made = pod.metadata.creation_timestamp.as_ref()?.0.timestamp();
    match state(pod) {
        PodState::Creating if now_secs - made > ORPHAN_AFTER_SECS => {
            Some("its creation was never acknowledged (the engine replica making it died)")
        }
        PodState::Gone(_) if pod.metadata.deletion_timestamp.is_none() => {
            let ended = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.iter().find(|c| c.name == CONTAINER))
                .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
                .map_or(made, |t| t.0.timestamp());
            (now_secs - ended > ENDED_KEPT_SECS).then_some("it ended")
        }
        _ => None,
    }
}

/// The record a pod carries, if it is a sandbox pod with a readable one.
pub fn record(pod: &Pod) -> Option<PodRecord> {
    let text = pod.metadata.annotations.as_ref()?.get(RECORD_ANNOTATION)?;
    serde_json::from_str(text).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn options() -> PodOptions {
        PodOptions {
            namespace: "sandboxes".into(),
            agent_image: "example/agent:1".into(),
            default_image: "example/base:1".into(),
            images: BTreeMap::from([("py".into(), "example/python:3".into())]),
            runtime_classes: BTreeMap::from([("py".into(), "gvisor".into())]),
            run_as_user: Some(1000),
            pull_policy: None,
            cpu_overcommit: 1.0,
            storage_class: None,
        }
    }

    fn record(template: &str) -> PodRecord {
        PodRecord {
            id: "sbx_0123456789abcdefghjkmnpqrs".into(),
            name: Some("n".into()),
            template: template.into(),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            env: vec![("A".into(), "1".into())],
            shape: Shape {
                vcpus: 1.5,
                memory_mb: 512,
                disk_mb: 1024,
                max_pids: 256,
            },
            created_at: 1_000,
            expires_at: Some(61_000),
            tenant: Some("t".into()),
            network: NetworkRules::default(),
            volumes: Vec::new(),
        }
    }

    #[test]
    fn the_pod_is_locked_down_and_shaped() {
        let pod = build(
            &options(),
            &record("base"),
            &[("A".into(), "1".into())],
            None,
            1_000,
        )
        .unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("sbx-0123456789abcdefghjkmnpqrs")
        );
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.enable_service_links, Some(false));
        assert_eq!(spec.active_deadline_seconds, Some(60));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.runtime_class_name, None,
            "only py names a runtime class"
        );
        let main = &spec.containers[0];
        assert_eq!(main.image.as_deref(), Some("example/base:1"));
        assert_eq!(
            main.command.as_deref().unwrap(),
            ["/.sandbox-mcp/sandbox-mcp", "__agent-pod"]
        );
        let limits = main.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["cpu"].0, "1500m");
        assert_eq!(limits["memory"].0, "512Mi");
        assert_eq!(limits["ephemeral-storage"].0, "1024Mi");
        assert_eq!(
            main.resources.as_ref().unwrap().requests.as_ref(),
            Some(limits)
        );
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.as_ref().unwrap())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_string()][..])
            );
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            assert_eq!(sc.run_as_non_root, Some(true));
            assert_eq!(sc.run_as_user, Some(1000));
            assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
            assert_eq!(
                c.termination_message_policy.as_deref(),
                Some("FallbackToLogsOnError"),
                "a failed start reports the container's last words"
            );
        }
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("example/agent:1"));
        assert_eq!(main.env.as_ref().unwrap()[0].name, "A");
        // The record round-trips through the annotation.
        assert_eq!(super::record(&pod), Some(record("base")));
        assert_eq!(state(&pod), PodState::Creating);
    }

    #[test]
    fn cpu_overcommit_lowers_the_cpu_request_only() {
        let opts = PodOptions {
            cpu_overcommit: 10.0,
            ..options()
        };
        let pod = build(&opts, &record("base"), &[], None, 1_000).unwrap();
        let res = pod.spec.unwrap().containers[0].resources.clone().unwrap();
        let (limits, requests) = (res.limits.unwrap(), res.requests.unwrap());
        assert_eq!(limits["cpu"].0, "1500m");
        assert_eq!(requests["cpu"].0, "150m");
        assert_eq!(
            requests["memory"], limits["memory"],
            "memory is never overcommitted"
        );
        assert_eq!(requests["ephemeral-storage"], limits["ephemeral-storage"]);
    }

    #[test]
    fn templates_map_to_images_and_runtime_classes() {
        let pod = build(&options(), &record("py"), &[], Some("/work"), 0).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("example/python:3")
        );
        assert_eq!(spec.containers[0].working_dir.as_deref(), Some("/work"));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        let err = build(&options(), &record("node"), &[], None, 0).unwrap_err();
        assert!(err.contains("--template-image node=IMAGE"), "{err}");
        let mut opts = options();
        opts.run_as_user = None;
        opts.runtime_classes.insert("*".into(), "kata".into());
        let pod = build(&opts, &record("base"), &[], None, 0).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.runtime_class_name.as_deref(), Some("kata"));
        let sc = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_non_root), (None, None));
    }

    #[test]
    fn no_timeout_means_no_deadline_and_names_round_trip() {
        let mut r = record("base");
        r.expires_at = None;
        let pod = build(&options(), &r, &[], None, 0).unwrap();
        assert_eq!(pod.spec.unwrap().active_deadline_seconds, None);
        assert_eq!(sandbox_id(&pod_name(&r.id)), r.id);
    }

    #[test]
    fn pod_state_reads_deletion_and_endings() {
        let mut pod = build(&options(), &record("base"), &[], None, 0).unwrap();
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(STATE_LABEL.into(), "ready".into());
        assert_eq!(state(&pod), PodState::Ready);
        let mut ended = pod.clone();
        ended.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            reason: Some("DeadlineExceeded".into()),
            ..Default::default()
        });
        match state(&ended) {
            PodState::Gone(why) => assert!(why.contains("timeout passed"), "{why}"),
            other => panic!("{other:?}"),
        }
        pod.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::chrono::DateTime::UNIX_EPOCH,
            ));
        match state(&pod) {
            PodState::Gone(why) => assert!(why.contains("create a new sandbox"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sweeps_take_orphaned_creations_and_long_ended_pods_only() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |secs: i64| {
            Some(Time(
                k8s_openapi::chrono::DateTime::from_timestamp(secs, 0).unwrap(),
            ))
        };
        let mut pod = build(&options(), &record("base"), &[], None, 1_000).unwrap();
        pod.metadata.creation_timestamp = at(10_000);
        // Creating: left alone while a replica may still be starting it.
        assert_eq!(sweep(&pod, 10_000 + ORPHAN_AFTER_SECS), None);
        assert!(sweep(&pod, 10_001 + ORPHAN_AFTER_SECS).is_some());
        // Ready: never, however old.
        let mut ready = pod.clone();
        ready
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(STATE_LABEL.into(), "ready".into());
        assert_eq!(sweep(&ready, 10_000_000), None);
        // Ended: kept a while after its container finished, for the reason.
        let mut ended = ready;
        ended.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![k8s_openapi::api::core::v1::ContainerStatus {
                name: CONTAINER.into(),
                state: Some(k8s_openapi::api::core::v1::ContainerState {
                    terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                        finished_at: at(20_000),
                        reason: Some("OOMKilled".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(sweep(&ended, 20_000 + ENDED_KEPT_SECS), None);
        assert!(sweep(&ended, 20_001 + ENDED_KEPT_SECS).is_some());
        // Already being deleted: nothing to do.
        ended.metadata.deletion_timestamp = at(20_002);
        assert_eq!(sweep(&ended, 30_000), None);
    }
}
