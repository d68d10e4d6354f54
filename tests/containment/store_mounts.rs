//! The sandbox store's mount: a store left mounted by `kill -9`, or still attached after a clean
//! exit, is taken up again by the next engine.

use serde_json::json;

use crate::require_cgroups;

/// After `kill -9` the store stays mounted (nothing could unmount it); the next engine uses that
/// mount, and no second loop device is attached to the image.
#[tokio::test]
async fn a_store_left_mounted_by_kill_9_is_reused() {
    require_cgroups!();
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let (mut first, url) = crate::common::spawn_engine_process(&data).await;
    let http = sandbox_mcp_api::http_builder().no_proxy().build().unwrap();
    let create = |url: String| {
        let http = http.clone();
        async move {
            let r = http
                .post(format!("{url}/v1/sandboxes"))
                .bearer_auth(crate::common::KEY)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
        }
    };
    create(url).await;
    let image = data.join("sandboxes.img");
    let enforced = image.exists();
    let _ = first.kill();
    let _ = first.wait();
    let (mut second, url) = crate::common::spawn_engine_process(&data).await;
    create(url).await;
    let devices = crate::common::loop_devices_of(&image);
    let _ = second.kill();
    let _ = second.wait();
    crate::common::kill_left_behind(&data);
    if enforced {
        assert_eq!(devices.len(), 1, "one image, one loop device");
    }
}

/// A clean exit with a paused sandbox: its frozen processes keep the store's loop device
/// attached after the engine lets go of the mount, and the next engine must mount that device
/// again (one image, one device) and find the sandbox's files.
#[tokio::test]
async fn a_store_still_attached_after_a_clean_exit_is_mounted_again() {
    require_cgroups!();
    use crate::common::{api, loop_devices_of, mounted};
    let dir = crate::common::TempData::new();
    let data = dir.data();
    let (mut first, url) = crate::common::spawn_engine_process(&data).await;
    let (status, made) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{made}");
    let exec = format!("/v1/sandboxes/{}/exec", made["id"].as_str().unwrap());
    let (status, _) = api(
        &url,
        "POST",
        &exec,
        Some(json!({"command": "echo kept > /root/f"})),
    )
    .await;
    assert_eq!(status, 200);
    let image = data.join("sandboxes.img");
    if !image.exists() {
        let _ = first.kill();
        let _ = first.wait();
        crate::common::kill_left_behind(&data);
        if std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_some() {
            panic!("the btrfs store (loop devices, mkfs.btrfs) is required here");
        }
        eprintln!(
            "SKIPPED a_store_still_attached_after_a_clean_exit_is_mounted_again: needs the btrfs store"
        );
        return;
    }
    // SIGTERM: a clean exit, which pauses the sandbox and lets go of the store's mount.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    assert!(first.wait().unwrap().success());
    assert!(
        !mounted(&data.join("sandboxes")),
        "the engine let go of the store's mount at exit"
    );
    assert_eq!(
        loop_devices_of(&image).len(),
        1,
        "the paused sandbox's processes keep the device"
    );
    let (mut second, url) = crate::common::spawn_engine_process(&data).await;
    let (_, out) = api(&url, "POST", &exec, Some(json!({"command": "cat /root/f"}))).await;
    let (status, _) = api(&url, "POST", "/v1/sandboxes", Some(json!({}))).await;
    let devices = loop_devices_of(&image);
    let _ = second.kill();
    let _ = second.wait();
    crate::common::kill_left_behind(&data);
    assert_eq!(out["stdout"], "kept\n", "{out}");
    assert_eq!(status, 201);
    assert_eq!(devices.len(), 1, "one image, one loop device");
}
