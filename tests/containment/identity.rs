//! What identifies the machine: a sandbox sees a boot id of its own, never the host's, so code
//! in two tenants' sandboxes cannot tell from it that they share a machine, and cannot set it.

use serde_json::json;

use crate::common::{TestEngine, create, ok, sh, snapshot_and_restore};
use crate::require_sandboxes;

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

async fn boot_id(client: &crate::common::McpClient, id: &str) -> String {
    let got = sh(client, id, &format!("cat {BOOT_ID}")).await;
    assert_eq!(got.len(), 37, "a boot id is a UUID and a newline: {got:?}");
    got
}

#[tokio::test]
async fn each_sandbox_has_its_own_boot_id_which_its_code_cannot_change_or_uncover() {
    require_sandboxes!();
    let host = std::fs::read_to_string(BOOT_ID).unwrap();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let alice = create(&client).await;
    // Another tenant's sandbox, through the engine's API.
    let other = Some("other-tenant");
    let (status, bob) = engine
        .as_tenant(other, "POST", "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{bob}");
    let (status, out) = engine
        .as_tenant(
            other,
            "POST",
            &format!("/v1/sandboxes/{}/exec", bob["id"].as_str().unwrap()),
            Some(json!({"command": format!("cat {BOOT_ID}")})),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let a = boot_id(&client, &alice).await;
    let b = out["stdout"].as_str().unwrap().to_string();
    assert_ne!(a, host, "the host's boot id reached a sandbox");
    assert_ne!(b, host, "the host's boot id reached a sandbox");
    assert_ne!(a, b, "two sandboxes share a boot id");

    // Root in the sandbox can neither write it, nor unmount it, nor mount a /proc of its own
    // that would show the kernel's.
    let tries = sh(
        &client,
        &alice,
        &format!(
            "echo 00000000-0000-0000-0000-000000000000 > {BOOT_ID} 2>/dev/null && echo WROTE; \
             umount {BOOT_ID} 2>/dev/null && echo UNMOUNTED; umount -l /proc 2>/dev/null && echo UNMOUNTED; \
             mkdir -p /tmp/p && mount -t proc proc /tmp/p 2>/dev/null && echo MOUNTED; \
             cat /tmp/p/sys/kernel/random/boot_id 2>/dev/null; echo done"
        ),
    )
    .await;
    assert_eq!(tries, "done\n", "{tries}");
    assert_eq!(boot_id(&client, &alice).await, a);

    // A pause keeps the boot; a restore starts the sandbox's processes afresh: a new boot.
    ok(&client, "sandbox_pause", json!({"sandbox_id": alice})).await;
    ok(&client, "sandbox_resume", json!({"sandbox_id": alice})).await;
    assert_eq!(boot_id(&client, &alice).await, a, "a pause is not a boot");
    snapshot_and_restore(&client, &alice).await;
    let again = boot_id(&client, &alice).await;
    assert!(again != a && again != host, "{again:?} after a restore");
}
