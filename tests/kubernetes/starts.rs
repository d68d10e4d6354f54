//! The static build the agent image holds, and pods whose agent cannot start: what the create
//! says of them, against the real cluster.

use std::process::{Command, Stdio};

use sandbox_mcp_testkit::kubernetes::Namespace;
use serde_json::json;

use super::{KubeEngine, eventually, rig};
use crate::common::{err, ok, sh};

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_static_build_runs_with_nothing_beside_it() {
    let rig = require_cluster!();
    // `rig.agent` is what `cargo build-static` made, as the agent image holds it: alone in an
    // empty root (no loader, no libc, no /proc), it runs.
    let root = tempfile::tempdir().unwrap();
    std::fs::copy(&rig.agent, root.path().join("sandbox-mcp")).unwrap();
    for args in [&["--version"][..], &["--help"]] {
        let out = Command::new("chroot")
            .arg(root.path())
            .arg("/sandbox-mcp")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("sandbox-mcp"), "{args:?}: {stdout}");
        if args == ["--version"] {
            assert_eq!(
                stdout,
                concat!("sandbox-mcp ", env!("CARGO_PKG_VERSION"), "\n")
            );
        }
    }
    let elf = std::fs::read(&rig.agent).unwrap();
    // The init container copies it into each pod's 128 MiB volume (pod.rs).
    assert!(elf.len() < 128 << 20, "{} bytes", elf.len());
    // Linked at a fixed address like every build of the binary (docs/architecture.md): an
    // ELF executable (not a position-independent one), with no program interpreter.
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(u16::from_le_bytes([elf[16], elf[17]]), 2, "ET_EXEC");
    let at = u64::from_le_bytes(elf[32..40].try_into().unwrap()) as usize;
    let (size, count) = (
        u16::from_le_bytes([elf[54], elf[55]]) as usize,
        u16::from_le_bytes([elf[56], elf[57]]) as usize,
    );
    let interp = (0..count).any(|i| {
        let p = at + i * size;
        u32::from_le_bytes(elf[p..p + 4].try_into().unwrap()) == 3
    });
    assert!(!interp, "a PT_INTERP program header: not static");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_whose_agent_cannot_start_is_reported_with_its_reason() {
    let rig = require_cluster!();
    let ns = Namespace::new(rig);
    // Agent images whose /sandbox-mcp cannot do the init container's job: a static busybox (it
    // knows no applet of that name: prints so, exits 127), and a dynamically linked binary (no
    // loader in the image: the runtime cannot start it).
    let images = tempfile::tempdir().unwrap();
    let image = |name: &str, binary: &str| {
        let root = images.path().join(name);
        std::fs::create_dir(&root).unwrap();
        std::fs::copy(binary, root.join("sandbox-mcp")).unwrap();
        let tag = format!("localhost/sandbox-mcp-{name}:test");
        rig.image(&tag, &root, "/sandbox-mcp").unwrap();
        tag
    };
    let exits = image("exits", "/bin/busybox");
    let dynamic = image("dynamic", "/usr/bin/true");

    let engine = KubeEngine::start(rig, &ns, &[("SANDBOX_MCP_AGENT_IMAGE", &exits)]).await;
    let message = err(&engine.mcp().await, "sandbox_create", json!({})).await;
    for part in [
        "init container agent",
        "exited with code 127",
        "sandbox-mcp: applet not found",
        "--agent-image must hold a static sandbox-mcp",
        "cargo build-static",
        &format!("kubectl get events -n {}", ns.name),
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    drop(engine);

    let engine = KubeEngine::start(rig, &ns, &[("SANDBOX_MCP_AGENT_IMAGE", &dynamic)]).await;
    let message = err(&engine.mcp().await, "sandbox_create", json!({})).await;
    for part in ["init container agent", "exited with code", "no such file"] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    drop(engine);

    // A template whose image the node does not have (and may not pull): the sandbox container
    // waits on it, which waiting will not fix.
    let engine = KubeEngine::start(
        rig,
        &ns,
        &[(
            "SANDBOX_MCP_TEMPLATE_IMAGES",
            "absent=localhost/sandbox-mcp-absent:test",
        )],
    )
    .await;
    let client = engine.mcp().await;
    let message = err(&client, "sandbox_create", json!({"template": "absent"})).await;
    for part in [
        "container sandbox",
        "ErrImageNeverPull",
        "localhost/sandbox-mcp-absent:test",
        "--template-image NAME=IMAGE",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    // Every failed start's pod went with it; the engine still makes sandboxes.
    eventually("the failed pods are deleted", 30, || {
        rig.kubectl_ok(&["get", "pods", "-n", &ns.name, "-o", "name"])
            .trim()
            .is_empty()
    })
    .await;
    let made = ok(&client, "sandbox_create", json!({})).await;
    let id = made["id"].as_str().unwrap();
    assert_eq!(sh(&client, id, "echo fine").await, "fine\n");
}
