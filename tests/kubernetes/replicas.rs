//! Replicas and the cluster's own doings: replicas share sandboxes and a killed one loses nothing
//! acknowledged, a pod deleted behind the engine's back is reported gone, and a sandbox expires with
//! no engine running.

use std::time::Duration;

use serde_json::json;

use sandbox_mcp_testkit::kubernetes::Namespace;

use crate::common::{api, err, ok, sh};

use super::{KubeEngine, eventually, pod, rig, small, try_api};

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
    // A timeout that would pause or stop a sandbox is refused: a pod can be neither frozen nor
    // restarted with its files.
    for action in ["pause", "stop"] {
        let ask = json!({"timeout_seconds": 60, "on_timeout": action});
        let (status, refused) = api(&a.url, "POST", "/v1/sandboxes", Some(ask)).await;
        assert!(
            status >= 400 && refused.to_string().contains("kill it instead"),
            "{action}: {status} {refused}"
        );
    }
    // A timeout is set, and shortened, but never moved later than the pod's deadline, which the
    // kubelet enforces on its own.
    let path = format!("/v1/sandboxes/{id}");
    for (seconds, allowed) in [(600, true), (3600, false), (300, true)] {
        let ask = json!({"timeout_seconds": seconds});
        let (status, answer) = api(&b.url, "PATCH", &path, Some(ask)).await;
        if allowed {
            assert_eq!(status, 200, "{seconds}: {answer}");
        } else {
            assert!(
                status >= 400 && answer.to_string().contains("can be shortened here"),
                "{seconds}: {status} {answer}"
            );
        }
        // The kubelet's deadline follows, counted from the pod's start (a minute or two ago
        // at most): set by the first timeout, lowered by the last.
        let deadline = pod(rig, &ns, &id).unwrap()["spec"]["activeDeadlineSeconds"].as_i64();
        let least = if seconds == 3600 { 600 } else { seconds };
        assert!(
            deadline.is_some_and(|d| d >= least && d <= least + 300),
            "after a timeout of {seconds} s: activeDeadlineSeconds {deadline:?}"
        );
    }

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
