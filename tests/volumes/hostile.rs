//! A sandbox (or a caller) trying to reach outside a volume or a workspace: names that are
//! paths, mount points in forbidden places, links and binds from inside, a mount point bent
//! into a symlink, a workspace whose directories become links, and another tenant.

use serde_json::json;

use super::workspace::{apply_cli, make_repo, tree};
use super::{create_with, keep_volumes_once};
use crate::common::{TestEngine, err, exec, ok, sh};
use crate::require_sandboxes;

#[tokio::test(flavor = "multi_thread")]
async fn names_and_mount_points_that_are_paths_are_refused() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    for name in ["../x", "..", "a/b", ".", "A", "x\u{0}y", "-x", ""] {
        let said = err(&client, "volume_create", json!({"name": name})).await;
        assert!(!said.is_empty(), "{name:?}");
        let (status, body) = engine
            .as_tenant(None, "POST", "/v1/volumes", Some(json!({"name": name})))
            .await;
        assert_eq!(status, 400, "{name:?}: {body}");
    }
    let (status, _) = engine
        .as_tenant(None, "DELETE", "/v1/volumes/..%2Fx", None)
        .await;
    assert!(status == 400 || status == 404, "{status}");
    ok(&client, "volume_create", json!({"name": "v"})).await;
    for path in [
        "relative",
        "/",
        "/proc",
        "/proc/self",
        "/dev/x",
        "/sys",
        "/a/../etc",
        "/a:b",
    ] {
        let said = err(
            &client,
            "sandbox_create",
            json!({"volumes": [{"name": "v", "path": path}]}),
        )
        .await;
        assert!(!said.is_empty(), "{path}");
    }
    let overlap = err(
        &client,
        "sandbox_create",
        json!({"volumes": [{"name": "v", "path": "/a"}, {"name": "v", "path": "/a/b"}]}),
    )
    .await;
    assert!(
        overlap.contains("twice") || overlap.contains("overlap"),
        "{overlap}"
    );
    assert_eq!(
        std::fs::read_dir(engine.data_dir().join("sandboxes/.volumes"))
            .unwrap()
            .count(),
        1,
        "only the one volume exists"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_cannot_leave_its_volume() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    // A file of the host the sandbox must never see, next to the volumes.
    let secret = engine.dir.path().join("host-secret");
    std::fs::write(&secret, "host only").unwrap();
    ok(&client, "volume_create", json!({"name": "v"})).await;
    let id = create_with(&client, json!([{"name": "v", "path": "/data"}])).await;
    let attempts = [
        // Up and out: `..` of the mount is the sandbox's own root.
        format!("ls /data/../ && cat /data/..{}", secret.display()),
        // A symlink resolves inside the sandbox, whoever follows it.
        format!("ln -s / /data/root && cat /data/root{}", secret.display()),
        // Hard links and renames across the mount stop at it.
        "ln /etc/hostname /data/hostname".into(),
        // Mounting anything is not allowed in a sandbox.
        "mkdir -p /data/m && mount --bind / /data/m".into(),
        "mount -t tmpfs none /data".into(),
        "umount /data".into(),
    ];
    for a in &attempts {
        let r = exec(&client, &id, a).await;
        assert_ne!(r["exit_code"], 0, "`{a}` succeeded: {r}");
    }
    // What the sandbox left in the volume is there, and nothing of the host came in.
    let volume = engine.data_dir().join("sandboxes/.volumes");
    let dir = std::fs::read_dir(&volume)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(
        std::fs::read_link(dir.join("root")).unwrap(),
        std::path::PathBuf::from("/")
    );
    assert!(!dir.join("hostname").exists());
    assert!(!dir.join("m").join("etc").exists());
    // The mount point bent into a link: the next start refuses rather than mount through it.
    sh(&client, &id, "mkdir -p /mnt/real").await;
    let id2 = create_with(&client, json!([{"name": "v", "path": "/mnt/inner/v"}])).await;
    sh(
        &client,
        &id2,
        "mv /mnt/inner /mnt/moved && ln -s /etc /mnt/inner",
    )
    .await;
    let snap = ok(
        &client,
        "sandbox_snapshot_create",
        json!({"sandbox_id": id2}),
    )
    .await;
    let refused = err(
        &client,
        "sandbox_snapshot_restore",
        json!({"sandbox_id": id2, "snapshot_id": snap["id"]}),
    )
    .await;
    assert!(refused.contains("symlink"), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_never_meet_in_volumes() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let (s, v) = engine
        .as_tenant(
            Some("t1"),
            "POST",
            "/v1/volumes",
            Some(json!({"name": "data"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, list) = engine
        .as_tenant(Some("t2"), "GET", "/v1/volumes", None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(list["volumes"], json!([]), "t2 sees t1's volume");
    // t2 cannot mount or delete it by name; its own `data` is another volume.
    let mount = json!({"volumes": [{"name": "data", "path": "/data"}]});
    let (s, _) = engine
        .as_tenant(Some("t2"), "POST", "/v1/sandboxes", Some(mount.clone()))
        .await;
    assert_eq!(s, 404);
    let (s, d) = engine
        .as_tenant(Some("t2"), "DELETE", "/v1/volumes/data", None)
        .await;
    assert_eq!((s, &d["deleted"]), (200, &json!(false)));
    let (s, _) = engine
        .as_tenant(
            Some("t2"),
            "POST",
            "/v1/volumes",
            Some(json!({"name": "data"})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, a) = engine
        .as_tenant(Some("t1"), "POST", "/v1/sandboxes", Some(mount.clone()))
        .await;
    assert_eq!(s, 201, "{a}");
    let (s, b) = engine
        .as_tenant(Some("t2"), "POST", "/v1/sandboxes", Some(mount))
        .await;
    assert_eq!(s, 201, "{b}");
    let (_, r) = engine
        .as_tenant(
            Some("t1"),
            "POST",
            &format!("/v1/sandboxes/{}/exec", a["id"].as_str().unwrap()),
            Some(json!({"command": "echo t1-secret > /data/f"})),
        )
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let (_, r) = engine
        .as_tenant(
            Some("t2"),
            "POST",
            &format!("/v1/sandboxes/{}/exec", b["id"].as_str().unwrap()),
            Some(json!({"command": "cat /data/f; ls -A /data"})),
        )
        .await;
    assert!(!r["stdout"].as_str().unwrap().contains("t1-secret"), "{r}");
    // The untenanted caller's volumes are its own too.
    let (_, list) = engine.as_tenant(None, "GET", "/v1/volumes", None).await;
    assert_eq!(list["volumes"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn applying_never_writes_outside_the_folder() {
    require_sandboxes!();
    let host = tempfile::Builder::new()
        .prefix("smcp-ws")
        .tempdir_in("/tmp")
        .unwrap();
    let repo = host.path().join("repo");
    make_repo(&repo);
    // The user's own link out of the folder, and a directory the sandbox will swap for a link.
    let outside = host.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), "untouched").unwrap();
    std::os::unix::fs::symlink(&outside, repo.join("link")).unwrap();
    let outside_before = tree(&outside, false);
    let spec = format!("repo={}", repo.display());
    let engine = TestEngine::start_with(|c| {
        c.workspaces = vec![sandbox_mcp_model::config::Workspace::parse(&spec).unwrap()];
    })
    .await;
    let client = engine.mcp().await;
    let id = create_with(&client, json!([{"name": "repo", "path": "/w"}])).await;
    let attack = format!(
        "cd /w && rm link && mkdir link && echo pwned > link/precious && echo pwned > link/new && \
         rm -r sub && ln -s {} sub && \
         ln -s /etc/passwd passwd-link",
        outside.display()
    );
    sh(&client, &id, &attack).await;
    let applied = apply_cli(&engine, &id, "repo");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    // The folder holds what the sandbox made: a real directory, links as links.
    assert!(repo.join("link").is_dir() && !repo.join("link").is_symlink());
    assert_eq!(
        std::fs::read_to_string(repo.join("link/precious")).unwrap(),
        "pwned\n"
    );
    assert!(repo.join("sub").is_symlink());
    assert!(repo.join("passwd-link").is_symlink());
    // And nothing outside it changed.
    assert_eq!(tree(&outside, false), outside_before);
}

/// The engine copies a volume while sandboxes that mount it run (a snapshot that keeps
/// volumes, and its restore): one of them swapping a directory of the volume for a link to a
/// host directory, as fast as it can, never gets a host file into the copy, nor a file of the
/// copy written into the host directory.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_bent_while_the_engine_copies_it_never_reaches_the_host() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let outside = engine.dir.path().join("outside");
    std::fs::create_dir_all(outside.join("e")).unwrap();
    std::fs::write(outside.join("e/host-secret"), "host only").unwrap();
    ok(&client, "volume_create", json!({"name": "v"})).await;
    let mount = json!([{"name": "v", "path": "/data"}]);
    let (a, b) = (
        create_with(&client, mount.clone()).await,
        create_with(&client, mount).await,
    );
    sh(
        &client,
        &a,
        &format!(
            "mkdir -p /data/d/e && for i in $(seq 50); do echo mine > /data/d/e/mine$i; done && ln -s {} /data/l",
            outside.display()
        ),
    )
    .await;
    // renameat2(RENAME_EXCHANGE) of /data/d and /data/l, in a loop.
    let swapper = "exec python3 -c 'import ctypes\nlibc = ctypes.CDLL(None)\nwhile True: libc.syscall(316, -100, b\"/data/d\", -100, b\"/data/l\", 2)'";
    ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": b, "command": swapper, "background": true}),
    )
    .await;
    // Once A sees /data/d as the link.
    let snaps = keep_volumes_once(&client, &a, "[ -L /data/d ]", 5).await;
    for snap in &snaps {
        // A restore may fail on a directory the swapper bent (it is refused, never followed).
        let _ = crate::common::call(
            &client,
            "sandbox_snapshot_restore",
            json!({"sandbox_id": a, "snapshot_id": snap}),
        )
        .await;
    }
    let kept = engine.data_dir().join("sandboxes/.volumes");
    let found = std::process::Command::new("find")
        .args([kept.as_os_str(), "-name".as_ref(), "host-secret".as_ref()])
        .output()
        .unwrap();
    assert!(
        found.stdout.is_empty(),
        "a host file was copied into a volume: {}",
        String::from_utf8_lossy(&found.stdout)
    );
    let written: Vec<_> = std::fs::read_dir(outside.join("e"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(written, ["host-secret"], "written into the host directory");
}
