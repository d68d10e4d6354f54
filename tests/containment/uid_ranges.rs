//! Uid ranges are host-wide: two engines on one host get disjoint ranges, and a sandbox whose
//! cleanup fails keeps its range rather than handing it on.

use crate::common::{TestEngine, create, sh};
use sandbox_mcp_model::config::DiskLimits;

use super::{proc_field, sandbox_dir};

#[tokio::test]
async fn two_engines_on_one_host_get_disjoint_uid_ranges() {
    require_own_ids!();
    use sandbox_mcp_linux::plan::{UID_BASE, UID_RANGE};
    let (one, two) = (TestEngine::start().await, TestEngine::start().await);
    let (c1, c2) = (one.mcp().await, two.mcp().await);
    let (a, b) = (create(&c1).await, create(&c2).await);
    let range = |engine: &TestEngine, id: &str| {
        let status = proc_field(engine.agent_pid(id), "status", "Uid:");
        let uid: u32 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
        (uid - UID_BASE) / UID_RANGE
    };
    let (ra, rb) = (range(&one, &a), range(&two, &b));
    assert_ne!(ra, rb, "two engines' sandboxes share a uid range");
    // The processes sandbox code runs are in their sandbox's own range too.
    sh(&c1, &a, "sleep 300 >/dev/null 2>&1 &").await;
    let cg = sandbox_mcp_linux::cgroups::Layout::detect().sandbox(&a);
    for pid in cg.pids() {
        let uid: u32 = proc_field(pid, "status", "Uid:")
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            (uid - UID_BASE) / UID_RANGE,
            ra,
            "pid {pid} runs outside its range"
        );
    }
}

/// The registry's claims of the engine on `data_dir`: the slots, each with its line.
fn claims_of(config: &sandbox_mcp_model::config::EngineConfig) -> Vec<String> {
    let owner = std::fs::canonicalize(config.data_dir.join("sandboxes")).unwrap();
    std::fs::read_to_string(&config.uid_registry)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&format!(" {}", owner.display())))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_sandbox_whose_cleanup_fails_keeps_its_uid_range() {
    require_own_ids!();
    let engine = TestEngine::start_with(|c| c.disk_limits = DiskLimits::Off).await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(&client, &id, "echo x > /root/pinned").await;
    let uid: u32 = proc_field(engine.agent_pid(&id), "status", "Uid:")
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let slot = (uid - sandbox_mcp_linux::plan::UID_BASE) / sandbox_mcp_linux::plan::UID_RANGE;
    let sandbox = sandbox_dir(&engine, &id);
    drop(client);
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let config = sandbox_mcp_model::config::EngineConfig {
        disk_limits: DiskLimits::Off,
        ..config
    };
    sandbox_mcp_engine::state::Store::open(&config.state_db())
        .unwrap()
        .set_status(&id, sandbox_mcp_engine::state::Status::Killing)
        .unwrap();
    // An immutable file in its upper layer: not even root can delete it, so the cleanup after
    // the restart fails.
    // (Found afresh each time: a failed delete may have moved it up the tree.)
    let chattr = |flag: &str| {
        let found = std::process::Command::new("find")
            .arg(&sandbox)
            .args(["-name", "pinned"])
            .output()
            .unwrap();
        let pinned = String::from_utf8(found.stdout).unwrap().trim().to_string();
        assert!(!pinned.is_empty(), "the file is in the sandbox's directory");
        std::process::Command::new("chattr")
            .args([flag, &pinned])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        eprintln!(
            "SKIPPED a_sandbox_whose_cleanup_fails_keeps_its_uid_range: needs the immutable attribute (chattr +i) on /tmp's filesystem"
        );
        return;
    }
    let engine = TestEngine::start_on(dir, config.clone()).await;
    let kept = claims_of(&config);
    assert!(chattr("-i"));
    assert!(sandbox.exists(), "the cleanup could not finish");
    assert_eq!(
        kept,
        vec![slot.to_string()],
        "the range of a sandbox that may still hold files is not given back"
    );
    // Once the cleanup can finish (the next start), the range is released.
    let dir = engine.stop().await;
    let _engine = TestEngine::start_on(dir, config.clone()).await;
    assert!(!sandbox.exists());
    assert_eq!(claims_of(&config), Vec::<String>::new());
}
