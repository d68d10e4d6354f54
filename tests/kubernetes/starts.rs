//! The static build the agent image holds.

use std::process::{Command, Stdio};

use super::rig;

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
    // Linked at a fixed address like every build of the binary (docs/architecture.md): an
    // ELF executable (not a position-independent one), with no program interpreter.
    let elf = std::fs::read(&rig.agent).unwrap();
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
