//! Imported OCI images: one runs on its own userland (musl, Python), and the CLI imports one with or
//! without a running engine.

use serde_json::json;

use crate::common::{TestEngine, api, err, ok, sh};
use crate::require_sandboxes;

use super::{import, sandbox_from, with_builtins};

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
