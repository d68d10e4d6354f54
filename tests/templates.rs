//! Templates: builds from steps (cache, failures, limits), captures, shapes, delete rules,
//! restarts, the default template and warm pools — through the MCP tools a model uses.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{McpClient, TestEngine, api, create, err, ok, sh};
use crate::require_sandboxes;

/// Polls sandbox_template_list until `name` is no longer building.
pub async fn wait_built(client: &McpClient, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = ok(client, "sandbox_template_list", json!({})).await;
        let t = list["templates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not listed: {list}"));
        if t["status"] != "building" {
            return t;
        }
        assert!(Instant::now() < deadline, "{name} still building: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn layers(engine: &TestEngine) -> usize {
    std::fs::read_dir(engine.data_dir().join("layers"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The sandboxes on disk, the engine's own (build, pool) included.
fn sandbox_dirs(engine: &TestEngine) -> Vec<String> {
    std::fs::read_dir(engine.data_dir().join("sandboxes"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with("sbx_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `check` holds of the sandboxes on disk.
async fn wait_dirs(engine: &TestEngine, what: &str, check: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check(&sandbox_dirs(engine)) {
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}",
            sandbox_dirs(engine)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn sandbox_from(client: &McpClient, template: &str) -> String {
    ok(client, "sandbox_create", json!({"template": template})).await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_build_runs_its_steps_caches_them_and_reports_a_failing_step() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let steps = json!([
        {"run": "mkdir -p /opt/tool && printf 'v1' > /opt/tool/version && python3 -c 'print(42)' > /usr/local/answer"},
        {"env": {"TOOL_MODE": "fast"}},
        {"workdir": "/opt/tool"},
        {"run": "rm /etc/hostname && echo second > /opt/tool/second"},
    ]);
    let t = ok(
        &client,
        "sandbox_template_create",
        json!({"name": "tool", "steps": steps}),
    )
    .await;
    assert_eq!(t["status"], "building", "{t}");
    let t = wait_built(&client, "tool").await;
    assert_eq!(t["status"], "ready", "{t}");
    assert_eq!(t["parent"], "base");
    assert!(t["size_bytes"].as_u64().unwrap() > 0, "{t}");
    let id = sandbox_from(&client, "tool").await;
    // Files of both run steps (/ and the host's /usr overlay), the env and workdir steps, and
    // a deletion carried as a whiteout.
    let out = sh(
        &client,
        &id,
        "pwd; cat version second /usr/local/answer; echo $TOOL_MODE; test -e /etc/hostname || echo no-hostname",
    )
    .await;
    assert_eq!(out, "/opt/tool\nv1second\n42\nfast\nno-hostname\n");
    // Writes stay in the sandbox: the template is unchanged for the next one.
    sh(&client, &id, "echo changed > /opt/tool/version").await;
    let other = sandbox_from(&client, "tool").await;
    assert_eq!(sh(&client, &other, "cat /opt/tool/version").await, "v1");

    // The same steps again: every step is a cache hit, no layer is added.
    let before = layers(&engine);
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "tool-again", "steps": steps}),
    )
    .await;
    assert_eq!(wait_built(&client, "tool-again").await["status"], "ready");
    assert_eq!(layers(&engine), before, "an unchanged rebuild added layers");
    // A changed last step rebuilds only that one.
    let mut changed = steps.clone();
    changed[3]["run"] = json!("echo third > /opt/tool/third");
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "tool-changed", "steps": changed}),
    )
    .await;
    assert_eq!(wait_built(&client, "tool-changed").await["status"], "ready");
    assert_eq!(layers(&engine), before + 1);

    // A failing step: which one, its exit code and the end of its output.
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "broken", "from": "tool", "steps": [
            {"run": "echo fine"},
            {"run": "echo working; echo 'E: no such package' >&2; exit 3"}
        ]}),
    )
    .await;
    let t = wait_built(&client, "broken").await;
    assert_eq!(t["status"], "failed", "{t}");
    let f = &t["failure"];
    assert_eq!(f["step"], 2, "{t}");
    assert_eq!(f["exit_code"], 3, "{t}");
    assert!(
        f["output_tail"]
            .as_str()
            .unwrap()
            .contains("E: no such package"),
        "{t}"
    );
    let e = err(&client, "sandbox_create", json!({"template": "broken"})).await;
    assert!(e.contains("failed to build"), "{e}");
    let e = err(
        &client,
        "sandbox_template_create",
        json!({"name": "child", "from": "broken", "steps": [{"run": "true"}]}),
    )
    .await;
    assert!(e.contains("failed to build"), "{e}");
    // A failed template's name can be reused at once; its finished step is reused too.
    let before = layers(&engine);
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "broken", "from": "tool", "steps": [
            {"run": "echo fine"}, {"run": "echo fixed > /fixed"}
        ]}),
    )
    .await;
    assert_eq!(wait_built(&client, "broken").await["status"], "ready");
    assert_eq!(layers(&engine), before + 1);
}

#[tokio::test]
async fn bad_template_requests_get_clear_errors_and_leave_nothing() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let step = json!([{"run": "true"}]);
    for (args, expected) in [
        (json!({"name": "base", "steps": step}), "built-in"),
        (json!({"name": "Bad Name", "steps": step}), "name"),
        (json!({"name": "x"}), "steps"),
        (
            json!({"name": "x", "steps": [{"run": "true", "workdir": "/a"}]}),
            "",
        ),
        (
            json!({"name": "x", "from": "nope", "steps": step}),
            "does not exist",
        ),
        (
            json!({"name": "x", "steps": vec![json!({"run": "true"}); 51]}),
            "50",
        ),
        (
            json!({"name": "x", "from_sandbox": "sbx_00000000000000000000000000", "steps": step}),
            "",
        ),
    ] {
        let e = err(&client, "sandbox_template_create", args.clone()).await;
        assert!(e.contains(expected), "{args}: {e}");
    }
    // A slow build: its name is taken, and nothing can be built from it yet.
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "slow", "steps": [{"run": "sleep 3"}]}),
    )
    .await;
    let e = err(
        &client,
        "sandbox_template_create",
        json!({"name": "slow", "steps": step}),
    )
    .await;
    assert!(e.contains("already exists"), "{e}");
    let e = err(
        &client,
        "sandbox_template_create",
        json!({"name": "on-slow", "from": "slow", "steps": step}),
    )
    .await;
    assert!(e.contains("still building"), "{e}");
    let e = err(&client, "sandbox_template_delete", json!({"name": "slow"})).await;
    assert!(e.contains("still building"), "{e}");
    // Build sandboxes are the engine's own: no listing shows them.
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 0, "{list}");
    assert_eq!(wait_built(&client, "slow").await["status"], "ready");
    let e = err(&client, "sandbox_template_delete", json!({"name": "base"})).await;
    assert!(e.contains("built in"), "{e}");
    let names: Vec<String> = ok(&client, "sandbox_template_list", json!({})).await["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, with_builtins(&["slow"]));
}

#[tokio::test]
async fn a_step_past_the_time_limit_or_the_disk_fails_the_build_with_the_reason() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let (status, _) = api(
        &engine.url,
        "POST",
        "/v1/templates",
        Some(json!({"name": "hangs", "timeout_seconds": 2, "steps": [{"run": "sleep 60"}]})),
    )
    .await;
    assert_eq!(status, 201);
    let client = engine.mcp().await;
    let t = wait_built(&client, "hangs").await;
    assert_eq!(t["status"], "failed", "{t}");
    assert!(
        t["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("time limit"),
        "{t}"
    );
    if !engine.manager.driver().capabilities().disk_limits_enforced {
        eprintln!("SKIPPED disk part: disk limits are not enforced here (needs root and btrfs)");
        return;
    }
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "fills", "shape": {"disk_mb": 64}, "steps": [
            {"run": "dd if=/dev/zero of=/big bs=1M count=200"}
        ]}),
    )
    .await;
    let t = wait_built(&client, "fills").await;
    assert_eq!(t["status"], "failed", "{t}");
    let tail = t["failure"]["output_tail"].as_str().unwrap();
    assert!(tail.contains("quota") || tail.contains("space"), "{t}");
    assert_ne!(t["failure"]["exit_code"], 0, "{t}");
}

#[tokio::test]
async fn a_captured_sandbox_becomes_a_template_and_shapes_are_capped_by_it() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let src = create(&client).await;
    sh(
        &client,
        &src,
        "mkdir -p /srv/app && echo state > /srv/app/data && rm /etc/hostname",
    )
    .await;
    let t = ok(
        &client,
        "sandbox_template_create",
        json!({"name": "snap", "from_sandbox": src, "shape": {"memory_mb": 256, "max_pids": 64}}),
    )
    .await;
    assert_eq!(t["status"], "ready", "{t}");
    // The source keeps running, unchanged.
    assert_eq!(sh(&client, &src, "cat /srv/app/data").await, "state\n");
    let id = sandbox_from(&client, "snap").await;
    assert_eq!(
        sh(
            &client,
            &id,
            "cat /srv/app/data; test -e /etc/hostname || echo gone"
        )
        .await,
        "state\ngone\n"
    );
    let info = ok(&client, "sandbox_info", json!({"sandbox_id": id})).await;
    assert_eq!(info["shape"]["memory_mb"], 256, "{info}");
    assert_eq!(info["shape"]["max_pids"], 64, "{info}");
    // Less than the template's shape is fine; more is refused, naming the limit.
    let create = |shape: Value| {
        api(
            &engine.url,
            "POST",
            "/v1/sandboxes",
            Some(json!({"template": "snap", "shape": shape})),
        )
    };
    let (status, body) = create(json!({"memory_mb": 128})).await;
    assert_eq!(status, 201);
    assert_eq!(body["shape"]["memory_mb"], 128, "{body}");
    assert_eq!(body["shape"]["max_pids"], 64, "{body}");
    let (status, body) = create(json!({"memory_mb": 512})).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("at most that"),
        "{body}"
    );
    // Outside the spec's bounds: refused before the template is even looked at.
    let (status, body) = create(json!({"vcpus": 0.01})).await;
    assert_eq!(status, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("shape.vcpus must be between"),
        "{body}"
    );
    // Delete: refused while used (naming the sandboxes), then its layers go.
    let before = layers(&engine);
    let e = err(&client, "sandbox_template_delete", json!({"name": "snap"})).await;
    assert!(e.contains(&id), "{e}");
    for s in ok(&client, "sandbox_list", json!({})).await["sandboxes"]
        .as_array()
        .unwrap()
    {
        ok(&client, "sandbox_kill", json!({"sandbox_id": s["id"]})).await;
    }
    ok(&client, "sandbox_template_delete", json!({"name": "snap"})).await;
    assert_eq!(layers(&engine), before - 1);
    let e = err(&client, "sandbox_create", json!({"template": "snap"})).await;
    assert!(e.contains("does not exist"), "{e}");
}

#[tokio::test]
async fn templates_survive_a_restart_and_one_can_be_the_default() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "keep", "warm": 1, "steps": [{"run": "echo kept > /kept"}, {"env": {"KEPT": "yes"}}]}),
    )
    .await;
    assert_eq!(wait_built(&client, "keep").await["status"], "ready");
    wait_dirs(&engine, "the pool was not filled", |d| d.len() == 1).await;
    let pooled = sandbox_dirs(&engine);
    // A build the engine stops in the middle of.
    ok(
        &client,
        "sandbox_template_create",
        json!({"name": "interrupted", "steps": [{"run": "sleep 60"}]}),
    )
    .await;
    wait_dirs(&engine, "no build sandbox started", |d| d.len() == 2).await;
    let building = sandbox_dirs(&engine);
    drop(client);
    let dir = engine.stop().await;
    // The pooled and build sandboxes were killed at shutdown, not paused: nothing of them runs
    // while no engine does.
    let layout = sandbox_mcp_linux::cgroups::Layout::detect();
    for id in &building {
        assert!(
            layout.sandbox(id).pids().is_empty(),
            "{id} left processes behind"
        );
    }
    let mut config = TestEngine::config_for(dir.path());
    config.default_template = Some("keep".into());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let list = ok(&client, "sandbox_template_list", json!({})).await;
    let keep = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "keep")
        .unwrap();
    assert_eq!(keep["default"], true, "{list}");
    assert_eq!(list["templates"][0]["default"], false, "{list}");
    let interrupted = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "interrupted")
        .unwrap();
    assert_eq!(interrupted["status"], "failed", "{list}");
    assert!(
        interrupted["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("engine stopped"),
        "{list}"
    );
    // The build sandbox and the stale pooled one are gone; the pool is refilled anew.
    wait_dirs(&engine, "the pool was not refilled", |d| {
        d.len() == 1 && d != pooled.as_slice()
    })
    .await;
    // No template named: the default.
    let id = ok(&client, "sandbox_create", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        sh(&client, &id, "cat /kept; echo $KEPT").await,
        "kept\nyes\n"
    );
    let e = err(&client, "sandbox_template_delete", json!({"name": "keep"})).await;
    assert!(e.contains("default"), "{e}");
    drop(client);
    // A default that does not exist stops the engine from starting, saying why.
    let dir = engine.stop().await;
    let mut config = TestEngine::config_for(dir.path());
    config.default_template = Some("nope".into());
    let e = sandbox_mcp::wiring::open_manager(&config)
        .await
        .err()
        .expect("an engine with a missing default template started");
    assert!(e.to_string().contains("nope"), "{e}");
}

#[tokio::test]
async fn a_warm_pool_hands_out_fresh_sandboxes_and_refills() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let (status, _) = api(
        &engine.url,
        "POST",
        "/v1/templates",
        Some(json!({"name": "pooled", "warm": 2, "steps": [{"run": "echo pooled > /mark"}]})),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(wait_built(&client, "pooled").await["status"], "ready");
    wait_dirs(&engine, "the pool was not filled", |d| d.len() >= 2).await;
    // Pooled sandboxes are not listed.
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 0, "{list}");
    // Taken from the pool: the request's labels and environment apply, nothing else ran.
    let (status, a) = api(
        &engine.url,
        "POST",
        "/v1/sandboxes",
        Some(
            json!({"template": "pooled", "metadata": {"who": "a"}, "env_vars": {"GREETING": "hi"},
                   "network": {"deny_out": ["0.0.0.0/0"]}}),
        ),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(a["network"]["deny_out"][0], "0.0.0.0/0", "{a}");
    let id = a["id"].as_str().unwrap();
    assert_eq!(a["metadata"]["who"], "a", "{a}");
    assert_eq!(
        sh(&client, id, "cat /mark; echo $GREETING; ls -A /tmp | wc -l").await,
        "pooled\nhi\n0\n"
    );
    let list = ok(&client, "sandbox_list", json!({})).await;
    assert_eq!(list["sandboxes"][0]["id"], id, "{list}");
    // A second and a third: distinct ids; the pool refills behind them.
    let b = sandbox_from(&client, "pooled").await;
    let c = sandbox_from(&client, "pooled").await;
    assert!(id != b && b != c && id != c);
    wait_dirs(&engine, "the pool was not refilled", |d| d.len() >= 5).await;
    // Deleting the template (once its sandboxes are gone) drains the pool.
    for s in [id.to_string(), b, c] {
        ok(&client, "sandbox_kill", json!({"sandbox_id": s})).await;
    }
    ok(
        &client,
        "sandbox_template_delete",
        json!({"name": "pooled"}),
    )
    .await;
    assert_eq!(sandbox_dirs(&engine), Vec::<String>::new());
}

async fn import(engine: &TestEngine, name: &str, archive: Vec<u8>) -> (u16, Value) {
    let r = engine
        .http()
        .put(format!("{}/v1/templates/{name}/image", engine.url))
        .bearer_auth(crate::common::KEY)
        .header("content-type", "application/octet-stream")
        .body(archive)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// A python3 userland copied from the host's: the interpreter, the libraries it links and its
/// standard library — a Debian image in miniature, with nothing of the host's /usr shown.
fn python_layer() -> Vec<u8> {
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let ldd = std::process::Command::new("ldd")
        .arg(&python)
        .output()
        .unwrap();
    let mut files: Vec<(String, Vec<u8>, u32)> = vec![(
        "usr/bin/python3".into(),
        std::fs::read(&python).unwrap(),
        0o755,
    )];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(std::path::PathBuf::from);
        if let Some(p) = path {
            let real = std::fs::canonicalize(&p).unwrap();
            files.push((
                p.to_string_lossy().trim_start_matches('/').to_string(),
                std::fs::read(real).unwrap(),
                0o755,
            ));
        }
    }
    let version = python.file_name().unwrap().to_string_lossy().to_string();
    let stdlib = std::path::Path::new("/usr/lib").join(&version);
    let mut stack = vec![stdlib];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if [
                "test",
                "__pycache__",
                "site-packages",
                "dist-packages",
                "idlelib",
                "tkinter",
            ]
            .contains(&name.as_str())
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                files.push((
                    p.to_string_lossy().trim_start_matches('/').to_string(),
                    std::fs::read(&p).unwrap(),
                    0o644,
                ));
            }
        }
    }
    let refs: Vec<(&str, &[u8], u32)> = files
        .iter()
        .map(|(p, d, m)| (p.as_str(), d.as_slice(), *m))
        .collect();
    crate::images::layer(&refs, &[])
}

#[tokio::test]
async fn an_imported_image_runs_on_its_own_userland() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    // Two layers, the second deleting a file of the first; Env, WorkingDir and User set.
    let mut top = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("app/hello.txt", &b"hello"[..]),
        ("etc/.wh.os-release", b""),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        top.append_data(&mut h, path, data).unwrap();
    }
    let image = crate::images::docker_save(
        &[crate::images::busybox_layer(), top.into_inner().unwrap()],
        json!({"Env": ["PATH=/bin", "GREETING=from-image"], "WorkingDir": "/app", "User": "app"}),
    );
    let (status, t) = import(&engine, "tiny", image).await;
    assert_eq!(status, 201, "{t}");
    assert_eq!(t["status"], "ready", "{t}");
    let id = sandbox_from(&client, "tiny").await;
    let out = sh(
        &client,
        &id,
        "pwd; cat hello.txt; echo $GREETING; id -u; test -e /etc/os-release || echo whited-out; test -e /usr/bin/python3 || echo no-host-usr; cat /etc/hostname",
    )
    .await;
    let uid = if nix::unistd::geteuid().is_root() {
        "1000"
    } else {
        "0"
    };
    assert_eq!(
        out,
        format!("/app\nhellofrom-image\n{uid}\nwhited-out\nno-host-usr\nsandbox\n")
    );
    // Files work on a foreign root too.
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/tmp/note", "content": "written"}),
    )
    .await;
    let r = ok(
        &client,
        "sandbox_files_read",
        json!({"sandbox_id": id, "path": "/tmp/note"}),
    )
    .await;
    assert_eq!(r["content"], "written", "{r}");
    // No python3 in this image: run_code says so instead of finding the host's.
    let e = err(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": "1 + 1"}),
    )
    .await;
    assert!(e.contains("python3"), "{e}");

    // An Alpine-like musl userland: busybox, musl's loader and a program linked against it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hello.c"),
        "#include <stdio.h>\nint main(void) { puts(\"hello from musl\"); return 0; }\n",
    )
    .unwrap();
    let built = std::process::Command::new("musl-gcc")
        .arg("-o")
        .arg(dir.path().join("hello"))
        .arg(dir.path().join("hello.c"))
        .status()
        .expect("musl-gcc (musl-tools) is installed");
    assert!(built.success());
    let loader = std::fs::read(std::fs::canonicalize("/lib/ld-musl-x86_64.so.1").unwrap()).unwrap();
    let hello = std::fs::read(dir.path().join("hello")).unwrap();
    let musl = crate::images::layer(
        &[
            ("lib/ld-musl-x86_64.so.1", &loader, 0o755),
            ("usr/bin/hello", &hello, 0o755),
        ],
        &[],
    );
    let image = crate::images::docker_save(
        &[crate::images::busybox_layer(), musl],
        json!({"Env": ["PATH=/usr/bin:/bin"]}),
    );
    let (status, t) = import(&engine, "alpine-like", image).await;
    assert_eq!(status, 201, "{t}");
    let id = sandbox_from(&client, "alpine-like").await;
    assert_eq!(
        sh(
            &client,
            &id,
            "hello; test -e /lib/x86_64-linux-gnu/libc.so.6 || echo no-glibc"
        )
        .await,
        "hello from musl\nno-glibc\n"
    );
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "note", "content": "musl"}),
    )
    .await;
    assert_eq!(sh(&client, &id, "cat /root/note").await, "musl");

    // A glibc userland with python3 of its own: run_code works on it.
    let image = crate::images::docker_save(
        &[crate::images::busybox_layer(), python_layer()],
        json!({"Env": ["PATH=/usr/bin:/bin"]}),
    );
    let (status, t) = import(&engine, "py-image", image).await;
    assert_eq!(status, 201, "{t}");
    let id = sandbox_from(&client, "py-image").await;
    let r = ok(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": "import sys, os\nprint(sys.version_info[0], os.path.exists('/usr/bin/node'))\n6 * 7"}),
    )
    .await;
    assert_eq!(r["result"], "42", "{r}");
    assert_eq!(r["stdout"], "3 False\n", "{r}");
}

#[tokio::test]
async fn a_hostile_or_broken_image_is_refused_and_leaves_nothing() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let layers_before = layers(&engine);
    use crate::images::raw_layer;
    use tar::EntryType::{Char, Link, Regular, Symlink};
    let evil = raw_layer(&[(b"../../etc/passwd", Regular, b"", b"evil")]);
    let through_link = raw_layer(&[
        (b"etc", Symlink, b"/etc", b""),
        (b"etc/cron.d/x", Regular, b"", b"evil"),
    ]);
    let hard_link = raw_layer(&[(b"shadow", Link, b"/etc/shadow", b"")]);
    let device = raw_layer(&[(b"dev/sda", Char, b"", b"")]);
    let good = crate::images::docker_save(&[crate::images::busybox_layer()], json!({}));
    let mut corrupt = crate::images::docker_save(&[crate::images::busybox_layer()], json!({}));
    // Flip a byte inside the busybox binary: the layer no longer matches its digest.
    let at = corrupt.len() / 2;
    corrupt[at] ^= 0xff;
    let truncated = good[..good.len() / 2].to_vec();
    for (name, archive, expected) in [
        (
            "evil",
            crate::images::docker_save(&[evil], json!({})),
            "leaves the image root",
        ),
        (
            "through-link",
            crate::images::docker_save(&[through_link], json!({})),
            "writes through the symlink",
        ),
        (
            "hard-link",
            crate::images::docker_save(&[hard_link], json!({})),
            "not a file of this layer",
        ),
        (
            "device",
            crate::images::docker_save(&[device], json!({})),
            "device node",
        ),
        ("corrupt", corrupt, "sha256"),
        ("truncated", truncated, ""),
        ("garbage", b"not an image at all".to_vec(), ""),
        // Refused after unpacking, before any layer reaches the store.
        (
            "ghost",
            crate::images::docker_save(&[crate::images::busybox_layer()], json!({"User": "ghost"})),
            "User ghost is not in its /etc/passwd",
        ),
    ] {
        let (status, body) = import(&engine, name, archive).await;
        assert_eq!(status, 400, "{name}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(expected), "{name}: {message}");
    }
    let (status, body) = import(&engine, "base", good.clone()).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = import(&engine, "Bad", good).await;
    assert_eq!(status, 400, "{body}");
    // Nothing half-made: no template, no layer, no upload, no scratch directory.
    let client = engine.mcp().await;
    let list = ok(&client, "sandbox_template_list", json!({})).await;
    assert_eq!(
        list["templates"].as_array().unwrap().len(),
        with_builtins(&[]).len(),
        "{list}"
    );
    assert_eq!(layers(&engine), layers_before);
    let uploads = std::fs::read_dir(engine.data_dir().join("uploads"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(uploads, 0);
}

/// The files the engine reads from an image it imports (`/etc/passwd` for its `User`, the CA
/// bundle it adds the egress CA to) are resolved inside the image, as a sandbox of it would see
/// them: an image whose symlinks point at host directories or files — absolute, climbing out
/// with `..`, at the file itself, at its parent directory, in an upper or a lower layer — gets
/// none of the host's files into its sandboxes, while links inside the image still work.
#[tokio::test]
async fn an_image_import_never_reads_host_files_through_the_images_symlinks() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let host = tempfile::tempdir_in("/tmp").unwrap();
    let hd = host.path().to_str().unwrap().to_string();
    std::fs::create_dir_all(host.path().join("ssl/certs")).unwrap();
    std::fs::write(
        host.path().join("passwd"),
        "hostuser:x:4242:4242:host:/host-home-secret:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        host.path().join("ssl/certs/ca-certificates.crt"),
        "HOST-SECRET-CERTIFICATE\n",
    )
    .unwrap();
    let up = "../".repeat(12);
    let climb = format!("{up}{}", &hd[1..]);
    let busybox = crate::images::busybox_layer;
    let links = |links: &[(&str, &str)]| crate::images::layer(&[], links);
    // A User found only in the host's passwd: the import must not find it.
    for (name, stack) in [
        ("abs-dir", vec![busybox(), links(&[("etc", hd.as_str())])]),
        (
            "rel-dir",
            vec![busybox(), links(&[("etc", climb.as_str())])],
        ),
        (
            "abs-file",
            vec![
                busybox(),
                links(&[("etc/passwd", format!("{hd}/passwd").as_str())]),
            ],
        ),
        (
            "rel-file",
            vec![links(&[("etc/passwd", format!("{climb}/passwd").as_str())])],
        ),
        (
            "chain",
            vec![busybox(), links(&[("etc", "/cfg"), ("cfg", hd.as_str())])],
        ),
    ] {
        let image = crate::images::docker_save(&stack, json!({"User": "hostuser"}));
        let (status, body) = import(&engine, name, image).await;
        assert_eq!(status, 400, "{name}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("User hostuser is not in its /etc/passwd"),
            "{name}: {message}"
        );
    }
    // The CA bundle through a link to the host's directory: the sandbox's bundle holds the
    // egress CA and nothing of the host's.
    let image = crate::images::docker_save(
        &[
            busybox(),
            links(&[("etc/ssl", format!("{hd}/ssl").as_str())]),
        ],
        json!({}),
    );
    let (status, body) = import(&engine, "ssl-link", image).await;
    assert_eq!(status, 201, "{body}");
    let id = sandbox_from(&client, "ssl-link").await;
    let bundle = sh(&client, &id, "cat /etc/ssl/certs/ca-certificates.crt").await;
    assert!(!bundle.contains("HOST-SECRET"), "{bundle}");
    assert!(bundle.contains("BEGIN CERTIFICATE"), "{bundle}");
    // Links inside the image resolve against its own root: an absolute link to its own
    // directory, and one climbing past its root, find its own passwd (and the user's home).
    let own = crate::images::layer(
        &[(
            "real/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nimguser:x:1234:1234::/home/imguser:/bin/sh\n",
            0o644,
        )],
        &[("etc/passwd", "../../../../../../real/passwd")],
    );
    let image = crate::images::docker_save(&[busybox(), own], json!({"User": "imguser"}));
    let (status, body) = import(&engine, "own-link", image).await;
    assert_eq!(status, 201, "{body}");
    let id = sandbox_from(&client, "own-link").await;
    assert_eq!(sh(&client, &id, "echo $HOME").await, "/home/imguser\n");
}

/// The engine API as `tenant` (none: the operator, untenanted).
async fn as_tenant(
    engine: &TestEngine,
    tenant: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = engine
        .http()
        .request(method.parse().unwrap(), format!("{}{path}", engine.url))
        .bearer_auth(crate::common::KEY);
    if let Some(t) = tenant {
        req = req.header("x-sandbox-tenant", t);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Builds `name` as `tenant` from `steps` and waits until it is ready.
async fn build_as(engine: &TestEngine, tenant: Option<&str>, name: &str, steps: Value) {
    let (status, t) = as_tenant(
        engine,
        tenant,
        "POST",
        "/v1/templates",
        Some(json!({"name": name, "steps": steps})),
    )
    .await;
    assert_eq!(status, 201, "{name}: {t}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, t) = as_tenant(
            engine,
            tenant,
            "GET",
            &format!("/v1/templates/{name}"),
            None,
        )
        .await;
        if t["status"] != "building" {
            assert_eq!(t["status"], "ready", "{t}");
            return;
        }
        assert!(Instant::now() < deadline, "{name} still building");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sandbox of `tenant` from `template`: its id, or the refusal.
async fn start_as(
    engine: &TestEngine,
    tenant: Option<&str>,
    template: &str,
) -> Result<String, Value> {
    let (status, r) = as_tenant(
        engine,
        tenant,
        "POST",
        "/v1/sandboxes",
        Some(json!({"template": template})),
    )
    .await;
    if status == 201 {
        Ok(r["id"].as_str().unwrap().to_string())
    } else {
        Err(r)
    }
}

async fn cat_as(engine: &TestEngine, tenant: Option<&str>, id: &str, path: &str) -> String {
    let (_, r) = as_tenant(
        engine,
        tenant,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": format!("cat {path} 2>&1")})),
    )
    .await;
    r["stdout"].as_str().unwrap_or("").to_string()
}

/// Templates belong to the tenant that made them: another tenant cannot list, read, start from,
/// build on, capture into, delete or shadow them, and its own template of the same name is its
/// own. Shared ones (built in, the operator's) are usable by every tenant and deletable by none.
/// Build caches are never shared between tenants.
#[tokio::test]
async fn templates_belong_to_their_tenant_and_shared_ones_are_read_only() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let (a, b) = (Some("tenant-a"), Some("tenant-b"));
    // The same steps for everyone: a file only the builder's run can have written.
    let steps =
        json!([{"run": "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /root/rand"}]);
    build_as(&engine, a, "team", steps.clone()).await;
    let ida = start_as(&engine, a, "team").await.unwrap();
    let a_rand = cat_as(&engine, a, &ida, "/root/rand").await;
    assert_eq!(a_rand.len(), 32, "{a_rand}");
    // A capture of A's sandbox is A's too.
    let (status, r) = as_tenant(
        &engine,
        a,
        "POST",
        "/v1/templates",
        Some(json!({"name": "snap-a", "from_sandbox": ida})),
    )
    .await;
    assert_eq!(status, 201, "{r}");
    assert_eq!(r["shared"], false, "{r}");
    // B sees neither, and every way to reach them answers as for a template that does not exist.
    let (_, list) = as_tenant(&engine, b, "GET", "/v1/templates", None).await;
    let names: Vec<&str> = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"team") && !names.contains(&"snap-a"),
        "{list}"
    );
    assert!(names.contains(&"base"), "{list}");
    assert!(
        list["templates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["shared"] == true)
    );
    for name in ["team", "snap-a"] {
        let (status, r) =
            as_tenant(&engine, b, "GET", &format!("/v1/templates/{name}"), None).await;
        assert_eq!(status, 404, "{r}");
        let e = start_as(&engine, b, name).await.unwrap_err();
        assert!(
            e["message"].as_str().unwrap().contains("does not exist"),
            "{e}"
        );
        let (status, r) =
            as_tenant(&engine, b, "DELETE", &format!("/v1/templates/{name}"), None).await;
        assert_eq!(status, 404, "{r}");
        let (status, r) = as_tenant(
            &engine,
            b,
            "POST",
            "/v1/templates",
            Some(json!({"name": "on-top", "from": name, "steps": [{"run": "true"}]})),
        )
        .await;
        assert_eq!(status, 404, "{r}");
    }
    // Nor the operator: a tenant's template is in the tenant's namespace only.
    let (_, list) = as_tenant(&engine, None, "GET", "/v1/templates", None).await;
    assert!(!list.to_string().contains("\"team\""), "{list}");
    // B's own "team", from the same steps: its own build (never A's cached layer), its own files.
    build_as(&engine, b, "team", steps.clone()).await;
    let idb = start_as(&engine, b, "team").await.unwrap();
    let b_rand = cat_as(&engine, b, &idb, "/root/rand").await;
    assert_eq!(b_rand.len(), 32, "{b_rand}");
    assert_ne!(a_rand, b_rand, "B's build reused A's layer");
    let again = start_as(&engine, a, "team").await.unwrap();
    assert_eq!(cat_as(&engine, a, &again, "/root/rand").await, a_rand);
    // Within one namespace the cache still works: the operator's two builds of the same steps
    // share their layer.
    build_as(&engine, None, "ops-1", steps.clone()).await;
    build_as(&engine, None, "ops-2", steps.clone()).await;
    let o1 = start_as(&engine, None, "ops-1").await.unwrap();
    let o2 = start_as(&engine, None, "ops-2").await.unwrap();
    assert_eq!(
        cat_as(&engine, None, &o1, "/root/rand").await,
        cat_as(&engine, None, &o2, "/root/rand").await
    );
    // The operator's templates are shared: B starts from one, but cannot delete, rebuild or
    // shadow it; nor a built-in one.
    let idops = start_as(&engine, b, "ops-1").await.unwrap();
    assert_eq!(cat_as(&engine, b, &idops, "/root/rand").await.len(), 32);
    for name in ["ops-1", "base"] {
        let (status, r) =
            as_tenant(&engine, b, "DELETE", &format!("/v1/templates/{name}"), None).await;
        assert_eq!(status, 403, "{name}: {r}");
        assert!(r["message"].as_str().unwrap().contains("shared"), "{r}");
    }
    let (status, r) = as_tenant(
        &engine,
        b,
        "POST",
        "/v1/templates",
        Some(json!({"name": "ops-1", "steps": [{"run": "true"}]})),
    )
    .await;
    assert_eq!(status, 409, "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("shared template"),
        "{r}"
    );
    // B's sandboxes show the name B gave; A deletes its own once its sandboxes are gone.
    let (_, view) = as_tenant(&engine, b, "GET", &format!("/v1/sandboxes/{idb}"), None).await;
    assert_eq!(view["template"], "team", "{view}");
    for id in [&ida, &again] {
        as_tenant(&engine, a, "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    }
    let (status, r) = as_tenant(&engine, a, "DELETE", "/v1/templates/team", None).await;
    assert_eq!(status, 200, "{r}");
    // B's "team" is untouched, and survives a restart as B's.
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let (status, r) = as_tenant(&engine, b, "GET", "/v1/templates/team", None).await;
    assert_eq!((status, r["shared"].clone()), (200, json!(false)), "{r}");
    let (status, _) = as_tenant(&engine, a, "GET", "/v1/templates/team", None).await;
    assert_eq!(status, 404);
    let (status, _) = as_tenant(&engine, a, "GET", "/v1/templates/snap-a", None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_cli_imports_an_image_with_or_without_a_running_engine() {
    require_sandboxes!();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let data = dir.path().join("data");
    let archive = dir.path().join("image.tar");
    std::fs::write(
        &archive,
        crate::images::docker_save(&[crate::images::busybox_layer()], json!({})),
    )
    .unwrap();
    let run = |name: &str| {
        std::process::Command::new(crate::common::BIN)
            .args(["template", "import", name])
            .arg(&archive)
            .env("SANDBOX_MCP_DATA_DIR", &data)
            .output()
            .unwrap()
    };
    // No engine: straight into the data dir.
    let out = run("offline");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("template offline: ready"));
    // An engine serves the data dir: through its API.
    let (mut child, url) = crate::common::spawn_engine_process(&data).await;
    let out = run("online");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, body) = api(&url, "GET", "/v1/templates", None).await;
    let names: Vec<&str> = body["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, with_builtins(&["offline", "online"]));
    let out = run("online");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let _ = child.kill();
    let _ = child.wait();
    crate::common::kill_left_behind(&data);
}

/// The built-in templates (`base`, and `desktop` on a host with Xvfb), then `others`: how
/// template lists come, base first and the rest by name.
fn with_builtins(others: &[&str]) -> Vec<String> {
    let mut names = vec!["base".to_string()];
    let mut rest: Vec<String> = others.iter().map(|s| s.to_string()).collect();
    if std::path::Path::new("/usr/bin/Xvfb").exists() {
        rest.push("desktop".into());
    }
    rest.sort();
    names.extend(rest);
    names
}
