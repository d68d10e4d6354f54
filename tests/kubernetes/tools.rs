//! The tools on pods: the cluster schedules and limits them, and sandboxes run as a non-root uid
//! when asked.

use std::time::{Duration, Instant};

use serde_json::json;

use sandbox_mcp_testkit::kubernetes::Namespace;

use crate::common::{err, ok, sh};

use super::{KubeEngine, eventually, pod, quantity, rig};

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
    // So is anything that would checkpoint processes: Kubernetes 1.20 has no checkpoint API.
    for (tool, args) in [
        ("sandbox_fork", json!({"sandbox_id": id, "memory": true})),
        (
            "sandbox_pause",
            json!({"sandbox_id": id, "hibernate": true}),
        ),
        (
            "sandbox_snapshot_create",
            json!({"sandbox_id": id, "memory": true}),
        ),
    ] {
        let refused = err(&client, tool, args).await;
        assert!(refused.contains("no checkpoint API"), "{tool}: {refused}");
    }
    // Named volumes need a storage class to claim them in (see volumes.rs).
    let volume = err(&client, "volume_create", json!({"name": "data"})).await;
    assert!(volume.contains("--storage-class"), "{volume}");
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
