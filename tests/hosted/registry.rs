//! The registry of hosted servers: the engine API (checked input, tenants, environment values
//! shown to the owner only), the `servers` CLI, and servers installed from source.

use std::process::Command;

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn registrations_are_checked_and_shown_to_each_tenant_as_theirs() {
    crate::require_sandboxes!();
    let hosted = Hosted::start(None).await;
    let bad = [
        ("Bad_Name", json!({"command": ["x"]}), "not a server name"),
        ("ok", json!({"command": []}), "command"),
        ("ok", json!({"command": [""]}), "command is empty"),
        (
            "ok",
            json!({"command": ["x"], "allow_out": ["not a rule!"]}),
            "allow_out",
        ),
        (
            "ok",
            json!({"command": ["x"], "env_vars": {"1BAD": "v"}}),
            "1BAD",
        ),
        (
            "ok",
            json!({"command": ["x"], "idle_timeout_seconds": 1}),
            "idle_timeout_seconds",
        ),
        ("ok", json!({"command": ["x"], "warm": 99}), "warm"),
        (
            "ok",
            json!({"command": ["x"], "surprise": true}),
            "surprise",
        ),
    ];
    for (name, body, says) in bad {
        let (status, answer) = hosted.register(None, name, body.clone()).await;
        assert_eq!(status, 400, "{name} {body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap_or("").contains(says),
            "{body}: {answer}"
        );
    }
    hosted
        .register_ok(
            None,
            "shared",
            json!({"command": ["mcp-server-time"], "env_vars": {"OPERATOR_ONLY": "o-value"}}),
        )
        .await;
    hosted
        .register_ok(Some("alice"), "mine", json!({"command": ["mcp-server-time"], "env_vars": {"ALICE": "a-value"}, "allow_out": ["api.github.com"]}))
        .await;
    let list = |tenant: &'static str| {
        let http = hosted.http();
        let url = format!("{}/v1/servers", hosted.engine.url);
        async move {
            let r: Value = http
                .get(url)
                .bearer_auth(KEY)
                .header("x-sandbox-tenant", tenant)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            r["servers"].as_array().unwrap().clone()
        }
    };
    let alices = list("alice").await;
    let names: Vec<&str> = alices.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mine", "shared"]);
    let mine = &alices[0];
    assert_eq!(mine["shared"], false);
    assert_eq!(
        mine["env_vars"]["ALICE"], "a-value",
        "the owner sees its values"
    );
    assert_eq!(mine["allow_out"], json!(["api.github.com"]));
    let shared = &alices[1];
    assert_eq!(shared["shared"], true);
    assert!(
        shared["env_vars"].is_null(),
        "the operator's values stay the operator's: {shared}"
    );
    assert_eq!(shared["env_var_names"], json!(["OPERATOR_ONLY"]));
    let bobs = list("bob").await;
    assert_eq!(bobs.len(), 1, "bob sees only the shared one: {bobs:?}");
    // Alice's server by name, as bob: unknown to read, to replace and to delete; and the
    // operator's shared one he may use but not delete.
    let as_bob = |method: &str, name: &str, body: Option<Value>| {
        let mut r = hosted
            .http()
            .request(
                method.parse().unwrap(),
                format!("{}/v1/servers/{name}", hosted.engine.url),
            )
            .bearer_auth(KEY)
            .header("x-sandbox-tenant", "bob");
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send()
    };
    let r = as_bob("GET", "mine", None).await.unwrap();
    let status = r.status();
    assert_eq!(status, 404, "{}", r.text().await.unwrap());
    // A delete of alice's answers as for a name bob never registered: nothing deleted. The
    // shared one, which he sees listed, is refused with the reason.
    for name in ["mine", "never-registered"] {
        let r = as_bob("DELETE", name, None).await.unwrap();
        assert_eq!(r.status(), 200, "{name}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["deleted"], false, "{name}: {body}");
    }
    let r = as_bob("DELETE", "shared", None).await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("only the operator removes it")
    );
    assert_eq!(
        list("alice").await.len(),
        2,
        "alice's servers are both still there"
    );
    // A PUT of that name makes bob a server of his own; alice's is untouched.
    let r = as_bob(
        "PUT",
        "mine",
        Some(json!({"command": ["mcp-server-time"], "env_vars": {"BOB": "b-value"}})),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let alices = list("alice").await;
    let mine = alices.iter().find(|s| s["name"] == "mine").unwrap();
    assert_eq!(mine["env_vars"], json!({"ALICE": "a-value"}), "{mine}");
    assert_eq!(list("bob").await.len(), 2);
    assert!(
        list("alice")
            .await
            .iter()
            .all(|s| s["env_vars"]["BOB"].is_null())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_cli_adds_lists_and_removes() {
    crate::require_sandboxes!();
    let hosted = Hosted::start(None).await;
    let cli = |args: &[&str]| {
        let out = hosted.servers_cli(args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&[
        "add",
        "time",
        "--allow-out",
        "pypi.org",
        "--warm",
        "1",
        "--env",
        "TZ=UTC",
        "--",
        "mcp-server-time",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("/servers/time/mcp"), "{out}");
    let (ok, out) = cli(&["list"]);
    assert!(
        ok && out.contains("time") && out.contains("mcp-server-time"),
        "{out}"
    );
    let (ok, out) = cli(&["list", "--json"]);
    let listed: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    assert!(ok);
    assert_eq!(listed["servers"][0]["warm"], 1);
    assert_eq!(listed["servers"][0]["env_vars"]["TZ"], "UTC");
    // Mistakes are named.
    let (ok, out) = cli(&["add", "x", "--env", "NOEQUALS", "--", "y"]);
    assert!(!ok && out.contains("--env takes K=V"), "{out}");
    let (ok, out) = cli(&["add", "x", "--shape", "cores=2", "--", "y"]);
    assert!(!ok && out.contains("vcpus"), "{out}");
    let (ok, out) = cli(&["rm", "time"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["rm", "time"]);
    assert!(!ok && out.contains("no hosted server named time"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_from_a_local_directory_is_installed_once_and_served() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    let source = tempfile::tempdir().unwrap();
    std::fs::write(
        source.path().join("server.py"),
        "import installed_check\nfrom mcp_server_time import main\nmain()\n",
    )
    .unwrap();
    std::fs::create_dir(source.path().join(".git")).unwrap();
    std::fs::write(source.path().join(".git/HEAD"), "not packed").unwrap();
    let from = source.path().to_str().unwrap();
    let install = "echo 'print(\"installed\", file=__import__(\"sys\").stderr)' > installed_check.py && test ! -e .git";
    let add = || {
        hosted.servers_cli(&[
            "add",
            "unreleased",
            "--from",
            from,
            "--install",
            install,
            "--entrypoint",
            "python3 server.py",
        ])
    };
    let out = add();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let token = hosted.token("alice");
    let client = hosted.connect("unreleased", &token).await;
    let r = tool(
        client.peer(),
        "get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await;
    assert!(said(&r).contains("UTC"), "{}", said(&r));
    client.cancel().await.unwrap();
    // The same source again: the install is not repeated.
    let out = add();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("reusing"), "{text}");
    // A failing install says why.
    let out = hosted.servers_cli(&[
        "add",
        "broken",
        "--from",
        from,
        "--install",
        "echo 'npm ERR! missing lockfile' >&2; exit 1",
        "--entrypoint",
        "python3 server.py",
    ]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("missing lockfile"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_log_shows_a_running_server_s_network_and_stderr() {
    crate::require_reference_servers!();
    let net = crate::require_testnet!();
    let hosted = Hosted::start(Some(&net)).await;
    hosted
        .register_ok(None, "fetch", reference_registration("fetch"))
        .await;
    let token = hosted.token("alice");
    let client = hosted.connect("fetch", &token).await;
    exercise(client.peer(), "fetch", "").await;
    let out = hosted.servers_cli(&["log", "fetch"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The allowed fetch and the refused one, and the server's job (its stderr).
    assert!(text.contains("api.example.test"), "{text}");
    assert!(text.contains("other.test"), "{text}");
    assert!(text.contains("job_1"), "{text}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_from_a_git_url_is_cloned_and_installed_by_template_steps() {
    crate::require_reference_servers!();
    let net = crate::require_testnet!();
    // A git repository served over HTTP from the test internet (git's "dumb" protocol).
    let served = tempfile::Builder::new()
        .prefix("smcp-git-")
        .tempdir_in("/tmp")
        .unwrap();
    let work = served.path().join("work");
    let git = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::create_dir(&work).unwrap();
    git(&work, &["init", "-q", "-b", "release"]);
    std::fs::write(
        work.join("server.py"),
        "from mcp_server_time import main\nmain()\n",
    )
    .unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "a server"]);
    git(
        served.path(),
        &["clone", "-q", "--bare", "work", "repo.git"],
    );
    git(&served.path().join("repo.git"), &["update-server-info"]);
    let mut http = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.ns,
            "/usr/bin/python3",
            "-m",
            "http.server",
            "8088",
        ])
        .args(["--bind", &net.net_ip.to_string(), "--directory"])
        .arg(served.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect((net.net_ip, 8088)).is_err() {
        assert!(Instant::now() < deadline, "the git server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let hosted = Hosted::start(Some(&net)).await;
    let out = hosted.servers_cli(&[
        "add",
        "from-git",
        "--from",
        "http://api.example.test:8088/repo.git",
        "--ref",
        "release",
        "--install",
        "python3 -m py_compile server.py",
        "--entrypoint",
        "python3 server.py",
    ]);
    let _ = http.kill();
    let _ = http.wait();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let token = hosted.token("alice");
    let client = hosted.connect("from-git", &token).await;
    let r = tool(
        client.peer(),
        "get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await;
    assert!(said(&r).contains("UTC"), "{}", said(&r));
    client.cancel().await.unwrap();
}
