//! A workspace over a real git repository made here: the sandbox edits, builds and commits in
//! its copy; the folder stays byte for byte as it was; the exported patch applies with `git
//! apply` and gives the sandbox's tree; `sandbox-mcp workspace apply` writes it into the folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::create_with;
use crate::common::{BIN, KEY, McpClient, TestEngine, err, ok, sh};
use crate::require_sandboxes;

/// Runs `cmd` with `sh -c` in `dir`, which must succeed; returns its stdout.
fn run(dir: &Path, cmd: &str) -> Vec<u8> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{cmd}`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A git repository with text, binary, executable-to-be and nested files, committed.
pub fn make_repo(dir: &Path) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("README.md"), "hello\nsecond line\n").unwrap();
    let lines: String = (1..=40).map(|i| format!("# line {i}\n")).collect();
    std::fs::write(dir.join("src/main.py"), format!("print('hi')\n{lines}")).unwrap();
    std::fs::write(dir.join("data.bin"), [0u8, 1, 2, 3, 255, 0, 7]).unwrap();
    std::fs::write(dir.join("old.txt"), "to be removed\n").unwrap();
    std::fs::write(dir.join("script.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::write(dir.join("sub/keep.txt"), "keep\n").unwrap();
    run(
        dir,
        "git init -q && git add -A && git -c user.name=t -c user.email=t@example.test commit -qm init",
    );
}

/// Every path of a tree with its type, mode and content (a symlink's target), `.git` included
/// unless `skip_git`.
pub fn tree(dir: &Path, skip_git: bool) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            if skip_git && rel.starts_with(".git") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let content = if m.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if m.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                stack.push(p.clone());
                Vec::new()
            };
            out.insert(rel, (m.mode(), content));
        }
    }
    out
}

/// The sandbox's view of its copy (`.git` left out): path → (git's mode, sha256 of the content
/// or the link's target), as JSON from Python inside the sandbox.
const VIEW: &str = r#"python3 - <<'PY'
import os, hashlib, json, stat
out = {}
for root, dirs, files in os.walk('.'):
    dirs[:] = [d for d in dirs if d != '.git' or root != '.']
    for n in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
        p = os.path.join(root, n)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            out[p] = ['120000', os.readlink(p)]
        else:
            mode = '100755' if st.st_mode & 0o111 else '100644'
            out[p] = [mode, hashlib.sha256(open(p, 'rb').read()).hexdigest()]
print(json.dumps(out, sort_keys=True))
PY"#;

fn host_view(dir: &Path) -> Value {
    serde_json::from_slice(&run(dir, VIEW)).unwrap()
}

async fn sandbox_view(client: &McpClient, id: &str) -> Value {
    serde_json::from_str(&sh(client, id, &format!("cd /root/repo && {VIEW}")).await).unwrap()
}

/// What the sandbox does in its copy: edit, add (a unicode name, a file without a final
/// newline, a symlink, a nested directory), remove, chmod, change a binary, build, commit.
const WORK: &str = r#"cd /root/repo && \
sed -i 's/hello/hello, sandbox/' README.md && \
sed -i 's/^# line 20$/# line twenty/' src/main.py && \
printf 'print(2)\n' >> src/main.py && \
python3 -m py_compile src/main.py && \
rm old.txt && chmod +x script.sh && \
printf '\000\001changed\377' > data.bin && \
mkdir -p new/dir && echo new > new/dir/file.txt && \
echo u > 'café.txt' && printf 'no newline' > nonl.txt && ln -s README.md link && \
echo added > sub/added.txt && \
git add -A && git -c user.name=s -c user.email=s@example.test commit -qm sandbox"#;

async fn engine_with(repo: &Path, ro: &Path) -> TestEngine {
    let spec = [
        format!("repo={}", repo.display()),
        format!("ro={}:ro", ro.display()),
    ];
    TestEngine::start_with(|c| {
        c.workspaces = spec
            .iter()
            .map(|s| sandbox_mcp_model::config::Workspace::parse(s).unwrap())
            .collect();
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_works_on_a_repository_that_changes_only_when_applied() {
    require_sandboxes!();
    let host = tempfile::Builder::new()
        .prefix("smcp-ws")
        .tempdir_in("/tmp")
        .unwrap();
    let (repo, ro) = (host.path().join("repo"), host.path().join("ro"));
    make_repo(&repo);
    make_repo(&ro);
    // Owners other than the engine's: a file the sandbox changes keeps its owner when applied,
    // and a new file takes its directory's.
    std::os::unix::fs::chown(repo.join("README.md"), Some(1234), Some(1234)).unwrap();
    std::os::unix::fs::chown(repo.join("sub"), Some(4321), Some(4321)).unwrap();
    let before = tree(&repo, false);
    let engine = engine_with(&repo, &ro).await;
    let client = engine.mcp().await;
    let list = ok(&client, "volume_list", json!({})).await;
    let kinds: Vec<_> = list["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].clone(), v["kind"].clone(), v["read_only"].clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (json!("repo"), json!("workspace"), json!(false)),
            (json!("ro"), json!("workspace"), json!(true))
        ]
    );
    // A volume may not take a workspace's name.
    let taken = err(&client, "volume_create", json!({"name": "repo"})).await;
    assert!(taken.contains("workspace"), "{taken}");

    let id = create_with(&client, json!([{"name": "repo", "path": "/root/repo"}])).await;
    assert_eq!(
        sh(&client, &id, "cat /root/repo/README.md").await,
        "hello\nsecond line\n"
    );
    sh(&client, &id, WORK).await;
    assert_eq!(
        sh(&client, &id, "cd /root/repo && git log --format=%s -1").await,
        "sandbox\n"
    );
    // The folder, .git and all, is exactly as it was.
    assert_eq!(tree(&repo, false), before, "the host folder changed");

    let changes = ok(
        &client,
        "sandbox_workspace_changes",
        json!({"sandbox_id": id, "name": "repo"}),
    )
    .await;
    let files: BTreeMap<String, (String, bool)> = changes["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                (
                    f["change"].as_str().unwrap().to_string(),
                    f["binary"].as_bool().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(files["README.md"], ("modified".into(), false));
    assert_eq!(files["old.txt"], ("removed".into(), false));
    assert_eq!(files["data.bin"], ("modified".into(), true));
    assert_eq!(files["new/dir/file.txt"], ("added".into(), false));
    assert!(files.keys().any(|p| p.ends_with(".pyc")), "{files:?}");
    assert!(!files.keys().any(|p| p.starts_with(".git")), "{files:?}");
    let patch = changes["patch"].as_str().unwrap();
    assert!(
        patch.contains("old mode 100644\nnew mode 100755"),
        "{patch}"
    );
    assert!(patch.contains("GIT binary patch"), "{patch}");

    // The patch, applied by git to a copy of the folder, gives the sandbox's tree.
    let copy = host.path().join("copy");
    run(
        host.path(),
        &format!("cp -a {} {}", repo.display(), copy.display()),
    );
    let patch_file = host.path().join("changes.patch");
    std::fs::write(&patch_file, patch).unwrap();
    run(&copy, &format!("git apply {}", patch_file.display()));
    let wanted = sandbox_view(&client, &id).await;
    assert_eq!(host_view(&copy), wanted);

    // A read-only workspace: the sandbox still works on its copy, nothing is applied.
    let other = create_with(&client, json!([{"name": "ro", "path": "/ro"}])).await;
    sh(&client, &other, "echo changed > /ro/README.md").await;
    let ro_apply = apply_cli(&engine, &other, "ro");
    assert!(!ro_apply.status.success());
    let said = String::from_utf8_lossy(&ro_apply.stderr);
    assert!(said.contains("read-only"), "{said}");
    assert_eq!(
        std::fs::read_to_string(ro.join("README.md")).unwrap(),
        "hello\nsecond line\n"
    );

    // A tenant's key reads changes but never writes the operator's folder.
    let r = engine
        .http()
        .post(format!(
            "{}/v1/sandboxes/{id}/workspaces/repo/apply",
            engine.url
        ))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "t1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(tree(&repo, false), before);

    // `workspace changes` prints the patch the tool gave, byte for byte, and changes nothing.
    let printed = Command::new(BIN)
        .args(["workspace", "changes", &id, "repo", "--url", &engine.url])
        .env("SANDBOX_MCP_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&printed.stdout), patch);
    assert_eq!(
        tree(&repo, false),
        before,
        "printing changes changes nothing"
    );

    // The operator applies: the folder's working tree becomes the sandbox's, its .git stays.
    let applied = apply_cli(&engine, &id, "repo");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let said = String::from_utf8_lossy(&applied.stdout);
    assert!(
        said.contains("D old.txt") && said.contains("applied"),
        "{said}"
    );
    assert_eq!(host_view(&repo), wanted);
    {
        use std::os::unix::fs::MetadataExt;
        let uid = |p: &str| std::fs::symlink_metadata(repo.join(p)).unwrap().uid();
        assert_eq!(uid("README.md"), 1234, "a changed file keeps its owner");
        assert_eq!(
            uid("sub/added.txt"),
            4321,
            "a new file takes its directory's owner"
        );
        assert_eq!(uid("new/dir/file.txt"), uid("."));
    }
    let after = tree(&repo, false);
    for (path, entry) in &before {
        if path.starts_with(".git") {
            assert_eq!(after.get(path), Some(entry), "{path:?} of .git changed");
        }
    }
    // Nothing more to apply: the sandbox's copy and the folder agree.
    let again = ok(
        &client,
        "sandbox_workspace_changes",
        json!({"sandbox_id": id, "name": "repo"}),
    )
    .await;
    assert_eq!(again["files"], json!([]), "{again}");
}

pub fn apply_cli(engine: &TestEngine, id: &str, name: &str) -> std::process::Output {
    Command::new(BIN)
        .args(["workspace", "apply", id, name, "--url", &engine.url])
        .env("SANDBOX_MCP_API_KEY", KEY)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_of_a_workspace_sandbox_diverge_independently() {
    require_sandboxes!();
    let host = tempfile::Builder::new()
        .prefix("smcp-ws")
        .tempdir_in("/tmp")
        .unwrap();
    let (repo, ro) = (host.path().join("repo"), host.path().join("ro"));
    make_repo(&repo);
    make_repo(&ro);
    let engine = engine_with(&repo, &ro).await;
    let client = engine.mcp().await;
    let parent = create_with(&client, json!([{"name": "repo", "path": "/root/repo"}])).await;
    sh(&client, &parent, "echo p > /root/repo/parent.txt").await;
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": parent, "memory": false}),
    )
    .await;
    let child = forked["ids"][0].as_str().unwrap().to_string();
    sh(
        &client,
        &child,
        "echo c > /root/repo/child.txt; rm /root/repo/parent.txt",
    )
    .await;
    sh(&client, &parent, "echo p2 >> /root/repo/README.md").await;
    let paths = |v: &Value| -> Vec<String> {
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                format!(
                    "{} {}",
                    f["change"].as_str().unwrap(),
                    f["path"].as_str().unwrap()
                )
            })
            .collect()
    };
    let p = ok(
        &client,
        "sandbox_workspace_changes",
        json!({"sandbox_id": parent, "name": "repo"}),
    )
    .await;
    let c = ok(
        &client,
        "sandbox_workspace_changes",
        json!({"sandbox_id": child, "name": "repo"}),
    )
    .await;
    assert_eq!(paths(&p), ["modified README.md", "added parent.txt"]);
    assert_eq!(paths(&c), ["added child.txt"]);
    // A sandbox that does not mount it has no changes to it.
    let none = err(
        &client,
        "sandbox_workspace_changes",
        json!({"sandbox_id": parent, "name": "ro"}),
    )
    .await;
    assert!(none.contains("mounts no workspace ro"), "{none}");
}
