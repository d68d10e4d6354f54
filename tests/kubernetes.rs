//! The kubernetes driver against a real cluster (Kubernetes 1.20 on this machine, named by
//! `SANDBOX_MCP_TEST_K8S_RIG`): engine processes on `--driver kubernetes`, each test in a
//! namespace of its own, reached through a real MCP client. Without a cluster these tests skip
//! saying so; with `SANDBOX_MCP_REQUIRE_SANDBOX` set (CI) they fail instead.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::ServerSettings;
use sandbox_mcp_testkit::kubernetes::{Namespace, Rig};

use crate::common::{BIN, KEY, McpClient, api, err, mcp_for, ok, sh, spawn_engine_logged};

/// The rig, started once per test process (its first start builds the static agent).
fn rig() -> Result<&'static Rig, String> {
    static RIG: OnceLock<Result<Rig, String>> = OnceLock::new();
    RIG.get_or_init(|| {
        // The base image is made of this machine's busybox and python3.
        crate::common::ensure_host_tools();
        let target = Path::new(BIN)
            .parent()
            .and_then(Path::parent)
            .ok_or("no target directory")?;
        Rig::start(Path::new(env!("CARGO_MANIFEST_DIR")), target, false)
    })
    .as_ref()
    .map_err(Clone::clone)
}

macro_rules! require_cluster {
    () => {
        match rig() {
            Ok(rig) => rig,
            Err(reason) => {
                if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
                    panic!("a Kubernetes cluster is required here but unavailable: {reason}");
                }
                eprintln!("SKIPPED {}: {reason}", module_path!());
                return;
            }
        }
    };
}

// After the macro, which it uses.
mod starts;

/// An engine process on the kubernetes driver; killed (SIGKILL) when dropped.
struct KubeEngine {
    child: Child,
    url: String,
    log: PathBuf,
    _data: tempfile::TempDir,
}

impl KubeEngine {
    async fn start(rig: &Rig, ns: &Namespace, extra: &[(&str, &str)]) -> KubeEngine {
        let data = tempfile::tempdir().unwrap();
        let log = data.path().join("engine.log");
        let env = rig.engine_env(&ns.name);
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&**k, &**v)).collect();
        env.extend_from_slice(extra);
        let (child, url) = spawn_engine_logged(
            data.path(),
            &env,
            std::fs::File::create(&log).unwrap().into(),
        )
        .await;
        KubeEngine {
            child,
            url,
            log,
            _data: data,
        }
    }

    async fn mcp(&self) -> McpClient {
        mcp_for(
            Backend::remote(&self.url, Some(ApiKey::new(KEY))).unwrap(),
            ServerSettings::default(),
            "all",
        )
        .await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KubeEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small sandbox, for creates through the HTTP API (the MCP tool takes the template's shape).
fn small(memory_mb: u64) -> Value {
    json!({"shape": {"vcpus": 0.5, "memory_mb": memory_mb, "disk_mb": 256}})
}

/// An engine API call that may be cut off: the answer of a success, `None` for no answer or an
/// error (a request the engine did not acknowledge).
async fn try_api(base: &str, method: &str, path: &str, body: Value) -> Option<Value> {
    let http = sandbox_mcp_api::http_builder().no_proxy().build().ok()?;
    let r = http
        .request(method.parse().ok()?, format!("{base}{path}"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// A Kubernetes quantity (`1Gi`, `512Mi`; `1`, `500m`) in MiB or in millicores.
fn quantity(q: &Value) -> u64 {
    let q = q.as_str().unwrap_or_else(|| panic!("not a quantity: {q}"));
    let (n, scale) = [("Gi", 1024), ("Mi", 1), ("m", 1)]
        .iter()
        .find_map(|(suffix, scale)| Some((q.strip_suffix(suffix)?, *scale)))
        .unwrap_or((q, 1000));
    n.parse::<u64>().unwrap() * scale
}

/// The pod of sandbox `id` as the API server has it, or `None` once it is gone.
fn pod(rig: &Rig, ns: &Namespace, id: &str) -> Option<Value> {
    let name = id.replacen('_', "-", 1);
    let out = rig.kubectl(&["get", "pod", "-n", &ns.name, &name, "-o", "json"]);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("NotFound"), "kubectl get pod: {stderr}");
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

async fn eventually(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tools_work_on_pods_the_cluster_schedules_and_limits() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let engine = KubeEngine::start(rig, &ns, &[]).await;
    let client = engine.mcp().await;

    let created = ok(&client, "sandbox_create", json!({})).await;
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["status"], "running", "{created}");

    // The sandbox is a pod the cluster placed, shaped and locked down as README says.
    let p = pod(rig, &ns, &id).expect("the sandbox's pod");
    assert_eq!(p["status"]["phase"], "Running", "{p}");
    assert!(p["spec"]["nodeName"].is_string(), "scheduled: {p}");
    let spec = &p["spec"];
    let c = &spec["containers"][0];
    let limits = &c["resources"]["limits"];
    assert_eq!(
        quantity(&limits["memory"]),
        created["shape"]["memory_mb"].as_u64().unwrap()
    );
    assert_eq!(
        quantity(&limits["cpu"]) as f64,
        created["shape"]["vcpus"].as_f64().unwrap() * 1000.0
    );
    // Requests: memory as the limit; CPU a fiftieth (the tests' --cpu-overcommit 50).
    let requests = &c["resources"]["requests"];
    assert_eq!(requests["memory"], limits["memory"]);
    assert_eq!(quantity(&requests["cpu"]) * 50, quantity(&limits["cpu"]));
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        c["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(
        p["metadata"]["labels"]["sandbox-mcp.dev/state"], "ready",
        "acknowledged on the pod before the create answered"
    );

    // exec: PID 1 is our agent, reached from an image that holds no sandbox-mcp of its own.
    let out = sh(
        &client,
        &id,
        "echo hi; tr '\\0' ' ' </proc/1/cmdline; echo; ls /usr/bin | grep -c sandbox-mcp || true",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hi");
    assert!(lines[1].contains("__agent-pod"), "{out}");
    assert_eq!(lines[2], "0", "the image has no agent: {out}");
    let failed = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo oops >&2; exit 3"}),
    )
    .await;
    assert_eq!(failed["exit_code"], 3);
    assert_eq!(failed["stderr"], "oops\n");
    // No service-account token reaches the sandbox.
    assert_eq!(
        sh(
            &client,
            &id,
            "ls /var/run/secrets/kubernetes.io 2>&1 | wc -l"
        )
        .await
        .trim(),
        "1",
        "only ls's complaint"
    );

    // files: written through the API, seen by commands, read back byte for byte.
    let content = "print('hello from the pod: ü ✓')\n";
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/tmp/proj/main.py", "content": content}),
    )
    .await;
    assert_eq!(
        sh(&client, &id, "python3 /tmp/proj/main.py").await,
        "hello from the pod: ü ✓\n"
    );
    let read = ok(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/tmp/proj/main.py"}),
    )
    .await;
    assert_eq!(read["content"], content);
    let listing = ok(
        &client,
        "sandbox_files_list",
        json!({"sandbox_id": id, "path": "/tmp/proj"}),
    )
    .await;
    assert!(listing.to_string().contains("main.py"), "{listing}");

    // run_code: the interpreter keeps its state between calls.
    let code = |c: &str| json!({"sandbox_id": id, "code": c, "language": "python"});
    ok(&client, "sandbox_run_code", code("x = 41")).await;
    let r = ok(&client, "sandbox_run_code", code("print(x + 1)")).await;
    assert!(r.to_string().contains("42"), "{r}");

    // jobs: a background exec keeps running after the call; its output is read later.
    let job = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "sleep 1; echo done", "background": true}),
    )
    .await;
    let job_id = job["job_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": id, "job_id": job_id}),
        )
        .await;
        if s["status"] == "exited" {
            assert_eq!(s["exit_code"], 0);
            assert_eq!(s["output"], "done\n");
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Limits are the cluster's: a memory hog past the pod's limit is OOM-killed by the kernel
    // the kubelet configured, and the sandbox (its agent) lives on.
    let hog = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "python3 -c 'b = b\"x\" * (2 << 30); print(len(b))'"}),
    )
    .await;
    assert_ne!(hog["exit_code"], 0, "the hog must not finish: {hog}");
    assert_eq!(hog["stdout"], "", "{hog}");
    assert!(
        hog.to_string().contains("137")
            || hog.to_string().contains("SIGKILL")
            || hog.to_string().contains("killed"),
        "killed by the OOM killer: {hog}"
    );
    assert_eq!(sh(&client, &id, "echo alive").await, "alive\n");

    // What pods cannot do is refused up front, saying why.
    let pause = err(&client, "sandbox_pause", json!({"sandbox_id": id})).await;
    assert!(pause.contains("kubernetes driver cannot pause"), "{pause}");
    let rules = err(
        &client,
        "sandbox_update",
        json!({"sandbox_id": id, "network": {"allow_out": ["example.com"]}}),
    )
    .await;
    assert!(rules.contains("NetworkPolicy"), "{rules}");
    assert_eq!(
        sh(&client, &id, "echo still-running").await,
        "still-running\n"
    );

    // kill: the pod goes.
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    eventually("the pod is deleted", 30, || pod(rig, &ns, &id).is_none()).await;
    let gone = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "true"}),
    )
    .await;
    assert!(gone.contains(&id), "{gone}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_sandboxes_and_a_killed_one_loses_nothing_acknowledged() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let a = KubeEngine::start(rig, &ns, &[]).await;
    let b = KubeEngine::start(rig, &ns, &[]).await;

    // Made by A, seen and used through B: the state is on the pod.
    let (status, made) = api(&a.url, "POST", "/v1/sandboxes", Some(small(128))).await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let (status, listed) = api(&b.url, "GET", "/v1/sandboxes", None).await;
    assert_eq!(status, 200);
    assert!(
        listed.to_string().contains(&id),
        "B lists A's sandbox: {listed}"
    );
    let (status, ran) = api(
        &b.url,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "echo via-b"})),
    )
    .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], "via-b\n");

    // A burst on A: creates every 400 ms and a file write into the shared sandbox every 50 ms.
    // A is killed (SIGKILL) as soon as its first create is acknowledged: later creates and
    // writes are in flight then.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut burst = Vec::new();
    for i in 0..8u64 {
        let (url, done) = (a.url.clone(), done_tx.clone());
        burst.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400 * i)).await;
            let answer = try_api(&url, "POST", "/v1/sandboxes", small(64)).await;
            if answer.is_some() {
                let _ = done.send(());
            }
            (format!("create {i}"), answer)
        }));
    }
    for i in 0..120u64 {
        let (url, id) = (a.url.clone(), id.clone());
        burst.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50 * i)).await;
            let body = json!({"path": format!("/tmp/burst/{i}"), "content": format!("write {i}")});
            let answer = try_api(&url, "PUT", &format!("/v1/sandboxes/{id}/files"), body).await;
            (format!("write {i}"), answer)
        }));
    }
    tokio::time::timeout(Duration::from_secs(120), done_rx.recv())
        .await
        .expect("a create on A within 2 minutes");
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let mut acknowledged = Vec::new();
    let mut cut_off = 0;
    for task in burst {
        match task.await.unwrap() {
            (what, Some(body)) => acknowledged.push((what, body)),
            (_, None) => cut_off += 1,
        }
    }
    assert!(cut_off > 0, "the kill came mid-burst");
    let creates: Vec<String> = acknowledged
        .iter()
        .filter(|(what, _)| what.starts_with("create"))
        .map(|(_, body)| body["id"].as_str().unwrap().to_string())
        .collect();
    let writes: Vec<&String> = acknowledged
        .iter()
        .filter(|(what, _)| what.starts_with("write"))
        .map(|(what, _)| what)
        .collect();
    eprintln!(
        "acknowledged before the kill: {} creates, {} writes; {cut_off} requests cut off",
        creates.len(),
        writes.len()
    );
    assert!(
        !creates.is_empty() && !writes.is_empty(),
        "the kill came after a create and some writes: {acknowledged:?}\n{}",
        a.log()
    );

    // Everything A acknowledged is there through B.
    let client = b.mcp().await;
    for made in &creates {
        assert_eq!(sh(&client, made, "echo up").await, "up\n", "{made}");
    }
    let files = sh(&client, &id, "ls /tmp/burst").await;
    for what in writes {
        let n = what.trim_start_matches("write ");
        assert!(files.lines().any(|f| f == n), "{what} lost: {files}");
        assert_eq!(
            sh(&client, &id, &format!("cat /tmp/burst/{n}")).await,
            format!("write {n}")
        );
    }

    // B kills A's sandbox; a replica started afterwards sees what is left, and not it.
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    let c = KubeEngine::start(rig, &ns, &[]).await;
    let (_, listed) = api(&c.url, "GET", "/v1/sandboxes", None).await;
    let listed = listed.to_string();
    assert!(!listed.contains(&id), "{listed}");
    for made in &creates {
        assert!(listed.contains(made.as_str()), "{made} missing: {listed}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_behind_the_engines_back_is_reported_gone() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let engine = KubeEngine::start(rig, &ns, &[]).await;
    let client = engine.mcp().await;
    let made = ok(&client, "sandbox_create", json!({})).await;
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(sh(&client, &id, "echo before").await, "before\n");

    // As an operator would: the kubelet stops the container, then the pod object goes.
    let name = id.replacen('_', "-", 1);
    rig.kubectl_ok(&["delete", "pod", "-n", &ns.name, &name, "--wait=true"]);
    let message = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo after"}),
    )
    .await;
    assert!(
        message.starts_with(&format!("sandbox {id} is gone: ")) && message.contains("deleted"),
        "{message}"
    );
    assert!(
        message.ends_with("with sandbox_create."),
        "says what to do: {message}"
    );
    // Later calls, after the engine forgot the sandbox, still say what happened to it; the
    // HTTP API says it with its own code.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = err(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert!(again.contains("is gone"), "{again}");
    let (status, body) = api(&engine.url, "GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(
        (status, body["error_code"].as_str()),
        (404, Some("gone")),
        "{body}"
    );
    // The sandbox is no longer listed.
    let listed = ok(&client, "sandbox_list", json!({})).await;
    assert!(!listed.to_string().contains(&id), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_engine_runs_with_only_the_documented_rbac() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    rig.kubectl_ok(&[
        "apply",
        "-n",
        &ns.name,
        "-f",
        &deploy.join("rbac.yaml").to_string_lossy(),
    ]);
    // The engine's Deployment, Service and NetworkPolicy are valid for this API server (a dry
    // run: on this rig pods cannot reach the API server's address, so the engine runs outside).
    let applied = rig.kubectl_ok(&[
        "apply",
        "-n",
        &ns.name,
        "--dry-run=server",
        "-f",
        &deploy.join("engine.yaml").to_string_lossy(),
    ]);
    for kind in ["deployment", "service", "networkpolicy"] {
        assert!(applied.contains(kind), "{applied}");
    }

    // The service account may do what the engine needs, and nothing else.
    let who = format!("system:serviceaccount:{}:sandbox-mcp-engine", ns.name);
    // `RESOURCE/SUB` as kubectl's `--subresource` (its `pods/exec` form checks `pods` alone).
    let can = |verb: &str, what: &str| {
        let (resource, sub) = what.split_once('/').unwrap_or((what, ""));
        let sub = format!("--subresource={sub}");
        let mut args = vec![
            "auth", "can-i", verb, resource, "-n", &ns.name, "--as", &who,
        ];
        if what.contains('/') {
            args.push(&sub);
        }
        let out = rig.kubectl(&args);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    for (verb, what) in [
        ("create", "pods"),
        ("get", "pods"),
        ("list", "pods"),
        ("watch", "pods"),
        ("patch", "pods"),
        ("delete", "pods"),
        ("create", "pods/exec"),
    ] {
        assert!(can(verb, what), "{verb} {what} must be allowed");
    }
    for (verb, what) in [
        ("get", "secrets"),
        ("update", "pods"),
        ("create", "pods/portforward"),
        ("create", "pods/attach"),
        ("create", "deployments"),
        ("list", "configmaps"),
    ] {
        assert!(!can(verb, what), "{verb} {what} must not be allowed");
    }
    let elsewhere = rig.kubectl(&[
        "auth", "can-i", "list", "pods", "-n", "default", "--as", &who,
    ]);
    assert_eq!(String::from_utf8_lossy(&elsewhere.stdout).trim(), "no");

    // The engine with that service account's own token: the full loop works.
    let token = sa_token(rig, &ns, "sandbox-mcp-engine").await;
    let kubeconfig = token_kubeconfig(rig, &token, &ns);
    let kc = kubeconfig.path().to_string_lossy().into_owned();
    let engine = KubeEngine::start(rig, &ns, &[("KUBECONFIG", &kc)]).await;
    let client = engine.mcp().await;
    let made = ok(&client, "sandbox_create", json!({})).await;
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(sh(&client, &id, "echo with-rbac").await, "with-rbac\n");
    ok(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    eventually("the pod is deleted", 30, || pod(rig, &ns, &id).is_none()).await;

    // A service account with no role: the engine refuses to start, naming what it lacks.
    rig.kubectl_ok(&["create", "serviceaccount", "-n", &ns.name, "nobody"]);
    let token = sa_token(rig, &ns, "nobody").await;
    let kubeconfig = token_kubeconfig(rig, &token, &ns);
    let data = tempfile::tempdir().unwrap();
    let env = rig.engine_env(&ns.name);
    let out = Command::new(BIN)
        .args(["engine", "--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", kubeconfig.path())
        .env("SANDBOX_MCP_DATA_DIR", data.path())
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("list") && stderr.contains("pods") && stderr.contains("rbac.yaml"),
        "{stderr}"
    );
}

/// A token for a service account, from the TokenRequest API (what a pod's projected token is;
/// the rig runs no controller that would make the older token secrets).
async fn sa_token(rig: &Rig, ns: &Namespace, account: &str) -> String {
    let request = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        request.path(),
        r#"{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}"#,
    )
    .unwrap();
    let path = format!(
        "/api/v1/namespaces/{}/serviceaccounts/{account}/token",
        ns.name
    );
    let out = rig.kubectl_ok(&[
        "create",
        "--raw",
        &path,
        "-f",
        &request.path().to_string_lossy(),
    ]);
    let answer: Value = serde_json::from_str(&out).unwrap();
    answer["status"]["token"].as_str().unwrap().to_string()
}

/// A kubeconfig for the rig's API server with `token` as its only credential.
fn token_kubeconfig(rig: &Rig, token: &str, ns: &Namespace) -> tempfile::NamedTempFile {
    let server = rig.kubectl_ok(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: c, cluster: {{server: \"{server}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: \"{token}\"}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u, namespace: {}}}}}]\n\
             current-context: c\n",
            ns.name
        ),
    )
    .unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_expires_with_no_engine_running() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let engine = KubeEngine::start(rig, &ns, &[]).await;
    let client = engine.mcp().await;
    let made = ok(&client, "sandbox_create", json!({"timeout_seconds": 8})).await;
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(sh(&client, &id, "echo up").await, "up\n");
    // Every replica goes: the deadline is on the pod, and the kubelet keeps it.
    drop(client);
    drop(engine);
    eventually("the kubelet ends the pod at its deadline", 60, || {
        pod(rig, &ns, &id).is_none_or(|p| p["status"]["phase"] == "Failed")
    })
    .await;
    // A replica started afterwards says what happened to it.
    let engine = KubeEngine::start(rig, &ns, &[]).await;
    let client = engine.mcp().await;
    let gone = err(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "true"}),
    )
    .await;
    assert!(
        gone.contains("is gone") && gone.contains("timeout"),
        "{gone}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_run_as_a_non_root_uid_when_asked() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    let engine = KubeEngine::start(rig, &ns, &[("SANDBOX_MCP_RUN_AS_USER", "65534")]).await;
    let client = engine.mcp().await;
    let made = ok(&client, "sandbox_create", json!({})).await;
    let id = made["id"].as_str().unwrap().to_string();
    let p = pod(rig, &ns, &id).expect("the sandbox's pod");
    let sc = &p["spec"]["containers"][0]["securityContext"];
    assert_eq!(
        (sc["runAsUser"].as_u64(), sc["runAsNonRoot"].as_bool()),
        (Some(65534), Some(true))
    );
    // The agent and every command run as that uid; what it may write, it writes.
    assert_eq!(sh(&client, &id, "id -u; id -g").await, "65534\n65534\n");
    assert_eq!(
        sh(
            &client,
            &id,
            "tr '\\0' ' ' </proc/1/status | grep -c '^Uid:.65534'"
        )
        .await,
        "1\n"
    );
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/tmp/mine", "content": "non-root"}),
    )
    .await;
    assert_eq!(sh(&client, &id, "cat /tmp/mine").await, "non-root");
    let denied = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo x > /etc/passwd"}),
    )
    .await;
    assert_ne!(denied["exit_code"], 0, "{denied}");
}
