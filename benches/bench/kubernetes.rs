//! The kubernetes driver on the k8s-local cluster (`SANDBOX_MCP_TEST_K8S_RIG`), beside the
//! namespaces driver on this machine, in the same run.

use std::path::Path;

use serde_json::json;

use sandbox_mcp_testkit::kubernetes;

use crate::figures::{Figure, figure, median_p95, ms, time};
use crate::servers::{Engine, THIS_BUILD};

/// The kubernetes driver on the k8s-local cluster (`SANDBOX_MCP_TEST_K8S_RIG`), beside the
/// namespaces driver on this machine, in the same run.
pub(crate) fn kubernetes_figures(out: &mut Vec<Figure>) -> String {
    let heading = "\n## Kubernetes driver\n\n";
    let target = Path::new(THIS_BUILD).parent().unwrap().parent().unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rig = match kubernetes::Rig::start_for_benchmarks(manifest, target) {
        Ok(rig) => rig,
        Err(why) => return format!("{heading}Not measured: {why}.\n"),
    };
    match measure_kubernetes(&rig, out) {
        Ok(text) => format!("{heading}{text}\n"),
        Err(why) => {
            eprintln!("kubernetes figures FAILED: {why}");
            format!("{heading}Not (all) measured: {why}\n")
        }
    }
}

fn measure_kubernetes(rig: &kubernetes::Rig, out: &mut Vec<Figure>) -> Result<String, String> {
    // Small pods: fifty of them share this one node.
    let shape = json!({"shape": {"vcpus": 0.1, "memory_mb": 64, "disk_mb": 64}});
    let create = |engine: &Engine| -> Result<String, String> {
        let made = engine.call("POST", "/v1/sandboxes", Some(shape.clone()))?;
        Ok(made["id"].as_str().unwrap_or_default().to_string())
    };
    let first_exec = |engine: &Engine, runs: usize| -> Result<Vec<f64>, String> {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (d, id) = time(|| create_and_run(engine, shape.clone()));
            let id = id?;
            samples.push(ms(d));
            engine.call("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
        }
        Ok(samples)
    };
    let warm = |engine: &Engine, runs: usize| -> Result<Vec<f64>, String> {
        let id = create(engine)?;
        let mut samples = Vec::new();
        for _ in 0..runs {
            let (d, r) = time(|| {
                engine.call(
                    "POST",
                    &format!("/v1/sandboxes/{id}/exec"),
                    Some(json!({"command": "true"})),
                )
            });
            r?;
            samples.push(ms(d));
        }
        engine.call("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
        Ok(samples)
    };

    let ns = kubernetes::Namespace::new(rig);
    let env = rig.engine_env(&ns.name);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&**k, &**v)).collect();
    let kube = Engine::start_with(&env);
    let local = Engine::start();

    let k = first_exec(&kube, 10)?;
    let n = first_exec(&local, 10)?;
    let ratio = |a: &[f64], b: &[f64]| median_p95(a).0 / median_p95(b).0;
    let first_ratio = ratio(&k, &n);
    let k_first = k.clone();
    out.push(figure(
        "Kubernetes: create → first exec result (`true`)",
        "ms",
        k,
        None,
        "HTTP API; a pod scheduled, its init container copying the agent, then the first exec through the API server",
    ));
    out.push(figure(
        "Kubernetes, beside it: the namespaces driver's create → first exec",
        "ms",
        n,
        None,
        "HTTP API, same run, same shape",
    ));
    let k = warm(&kube, 100)?;
    let n = warm(&local, 100)?;
    let warm_ratio = ratio(&k, &n);
    out.push(figure(
        "Kubernetes: exec round trip in a warm sandbox (`true`)",
        "ms",
        k,
        None,
        "HTTP API; one stream on the pod's multiplexed exec",
    ));
    out.push(figure(
        "Kubernetes, beside it: the namespaces driver's warm exec round trip",
        "ms",
        n,
        None,
        "HTTP API, same run",
    ));
    drop(local);

    // The cluster alone: fifty pods of the sandboxes' shape (the agent image's init container,
    // then a container of the base image) created at once with no engine, until all run.
    let floor = cluster_floor(rig, &ns, 50, true)?;
    // And without the init container: what its second container costs each pod.
    let floor_one = cluster_floor(rig, &ns, 50, false)?;
    // Fifty creates at once, each on its own connection.
    let (wall, results) = time(|| {
        std::thread::scope(|scope| {
            let tasks: Vec<_> = (0..50).map(|_| scope.spawn(|| create(&kube))).collect();
            tasks
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err("panicked".into())))
                .collect::<Vec<_>>()
        })
    });
    let errors: Vec<String> = results.iter().filter_map(|r| r.clone().err()).collect();
    let made = results.len() - errors.len();
    out.push(figure(
        "Kubernetes: 50 sandboxes created concurrently (wall time)",
        "s",
        vec![wall.as_secs_f64()],
        Some((15.0, "≤ 15 s")),
        &format!(
            "{made} created, {} errors; each create returns once its agent answers",
            errors.len()
        ),
    ));
    out.push(figure(
        "Kubernetes, beside it: 50 pods of the same shape created at once, no engine (the cluster's floor)",
        "s",
        vec![floor],
        None,
        "kubectl create of 50 pods (an init container of the agent image, a container of the base image), until all run",
    ));
    out.push(figure(
        "Kubernetes, beside it: the same 50 pods without the init container (one container each)",
        "s",
        vec![floor_one],
        None,
        "kubectl create of 50 pods of the base image's container alone, until all run",
    ));
    let floor_ratio = wall.as_secs_f64() / floor;
    let listed = kube.get("/v1/sandboxes")?;
    let running = listed["sandboxes"].as_array().map_or(0, Vec::len);
    // From a warm pool: a second engine keeping POOL pods of `base` running; each create is
    // timed once the pool is full again.
    let pooled = {
        const POOL: usize = 4;
        let mut env = env.clone();
        env.push(("SANDBOX_MCP_WARM", "base=4"));
        // The fifty of before are still there.
        let others = running_pods(rig, &ns);
        let pooling = Engine::start_with(&env);
        let full = |made: usize| -> Result<(), String> {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
            while running_pods(rig, &ns) < others + made + POOL {
                if std::time::Instant::now() > deadline {
                    return Err("the warm pool of pods was not filled within 3 minutes".into());
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            Ok(())
        };
        let (mut samples, mut ids) = (Vec::new(), Vec::new());
        for made in 0..10 {
            full(made)?;
            let (d, id) = time(|| create_and_run(&pooling, json!({})));
            ids.push(id?);
            samples.push(ms(d));
        }
        for id in ids {
            pooling.call("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
        }
        samples
    };
    let pooled_ratio = median_p95(&pooled).0 / median_p95(&k_first).0;
    out.push(figure(
        "Kubernetes: create → first exec result from a warm pool (`--warm base=4`)",
        "ms",
        pooled,
        Some((100.0, "≤ 100 ms")),
        "HTTP API; the create takes a running pod whose agent is connected, then the first exec through the API server; each run once the pool is full again",
    ));

    drop(kube);
    drop(ns);
    let mut text = format!(
        "The kubernetes driver against a single-node Kubernetes 1.20 on this machine (the \
         k8s-local rig: containerd and runc, pods reached through the API server's exec), \
         with the namespaces driver measured beside it in the same run. Pods ask for 0.1 vCPU \
         (overcommitted 50 times, as the tests do), 64 MiB and 64 MiB of disk. Create → first \
         exec is {first_ratio:.0}× the namespaces driver's, most of it the kubelet starting two \
         containers; a warm exec round trip is {warm_ratio:.1}× (one hop through the API \
         server and the pod's multiplexed exec). From a warm pool of pods, create → first \
         exec is {pooled_ratio:.3}× the cold figure. Fifty concurrent creates: {made} made, {} \
         errors, {running} listed running afterwards, in {:.1} s, {floor_ratio:.2}× the \
         {floor:.1} s the cluster itself takes to run fifty such pods ({floor_one:.1} s \
         without the init container that copies the agent in). The rig's kubelet runs \
         with a current kubelet's API rates (`kubeAPIQPS: 50`, `kubeAPIBurst: 100`, the \
         defaults since Kubernetes 1.27, set by \
         tests/fixtures/kubernetes/kubelet-rates.sh); at 1.20's defaults (5 and 10) the \
         kubelet's own status updates held fifty pods for 38 to 42 s, with or without the \
         engine (measured by hand on 2026-11-28 with kubectl).",
        errors.len(),
        wall.as_secs_f64()
    );
    if let Some(first) = errors.first() {
        text.push_str(&format!(" First error: {first}."));
    }
    Ok(text)
}

/// Seconds from creating `n` pods of the sandboxes' shape with kubectl (no engine) to all of
/// them running (`init`: with the init container that copies the agent in, as the driver's
/// pods have); they are deleted afterwards.
fn cluster_floor(
    rig: &kubernetes::Rig,
    ns: &kubernetes::Namespace,
    n: usize,
    init: bool,
) -> Result<f64, String> {
    const LABEL: &str = "bench-floor";
    let resources = json!({
        "requests": {"cpu": "2m", "memory": "64Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    });
    let security = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    let mount = json!([{"name": "agent", "mountPath": "/agent"}]);
    let pods: Vec<_> = (0..n)
        .map(|i| {
            let mut pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": format!("floor-{i}"), "labels": {LABEL: "1"}},
                "spec": {
                    "initContainers": [{
                        "name": "install", "image": kubernetes::AGENT_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/sandbox-mcp", "__install", "/agent/sandbox-mcp"],
                        "volumeMounts": mount, "resources": resources, "securityContext": security,
                    }],
                    "containers": [{
                        "name": "sandbox", "image": kubernetes::BASE_IMAGE,
                        "imagePullPolicy": "Never", "command": ["/bin/sleep", "3600"],
                        "volumeMounts": mount, "resources": resources, "securityContext": security,
                    }],
                    "volumes": [{"name": "agent", "emptyDir": {"sizeLimit": "128Mi"}}],
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                },
            });
            if !init {
                pod["spec"]
                    .as_object_mut()
                    .map(|spec| spec.remove("initContainers"));
            }
            pod
        })
        .collect();
    let file = std::env::temp_dir().join(format!("bench-floor-{}.json", std::process::id()));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": pods});
    std::fs::write(&file, list.to_string()).map_err(|e| e.to_string())?;
    let selector = format!("{LABEL}=1");
    let (wall, done) = time(|| -> Result<(), String> {
        let made = rig.kubectl(&["create", "-n", &ns.name, "-f", &file.to_string_lossy()]);
        if !made.status.success() {
            return Err(format!(
                "kubectl create: {}",
                String::from_utf8_lossy(&made.stderr)
            ));
        }
        // One watch until every pod is ready (running: they have no probes), not a poll that
        // would take the cores the kubelet needs.
        let ready = rig.kubectl(&[
            "wait",
            "pods",
            "-n",
            &ns.name,
            "-l",
            &selector,
            "--for=condition=Ready",
            "--timeout=300s",
        ]);
        if !ready.status.success() {
            return Err(format!(
                "{n} bare pods did not all run within 5 minutes: {}",
                String::from_utf8_lossy(&ready.stderr)
            ));
        }
        Ok(())
    });
    let _ = std::fs::remove_file(&file);
    // Not forced: the call returns once the kubelet has stopped them, so the figures after
    // this one do not share the node with fifty pods being torn down.
    rig.kubectl(&[
        "delete",
        "pods",
        "-n",
        &ns.name,
        "-l",
        &selector,
        "--wait=true",
        "--timeout=300s",
    ]);
    done.map(|()| wall.as_secs_f64())
}

/// How many pods of the namespace are running (not being deleted).
fn running_pods(rig: &kubernetes::Rig, ns: &kubernetes::Namespace) -> usize {
    let out = rig.kubectl(&["get", "pods", "-n", &ns.name, "-o", "json"]);
    let pods: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    pods["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|p| {
                p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
            })
            .count()
    })
}

/// Creates a sandbox (`body`) and runs `true` in it: its id.
fn create_and_run(engine: &Engine, body: serde_json::Value) -> Result<String, String> {
    let made = engine.call("POST", "/v1/sandboxes", Some(body))?;
    let id = made["id"].as_str().unwrap_or_default().to_string();
    let r = engine.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "true"})),
    )?;
    if r["exit_code"] != 0 {
        return Err(format!("`true` failed: {r}"));
    }
    Ok(id)
}
