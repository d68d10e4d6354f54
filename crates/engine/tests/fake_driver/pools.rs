//! Warm pools (`--warm TEMPLATE=N`): pooled sandboxes outlive a restart of the engine — a crash
//! or a clean stop — and are handed out again, while those that went or no longer fit the pool
//! are replaced or killed.

use std::collections::BTreeSet;

use sandbox_mcp_engine::services::CreateRequest;

use super::harness::{Engine, until};

fn dirs(engine: &Engine) -> BTreeSet<String> {
    engine.fake.sandbox_dirs().into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_outlives_restarts_of_the_engine_and_is_handed_out_again() {
    let engine = Engine::open_with(|c| {
        c.warm.insert("base".into(), 3);
    })
    .await;
    until("the pool was filled", || engine.fake.running().len() == 3).await;
    assert!(engine.listed().is_empty(), "pooled sandboxes are listed");
    let pooled: Vec<String> = dirs(&engine).into_iter().collect();
    let (went, died, lives) = (&pooled[0], &pooled[1], &pooled[2]);

    // A crash of the engine; meanwhile one pooled pod is deleted and one agent dies.
    engine.fake.gone(went, "deleted by an operator");
    engine.fake.crash(died);
    let engine = engine
        .reopen_with(|c| {
            c.warm.insert("base".into(), 3);
        })
        .await;
    // The live one is kept as it was, the dead one started again, the one that went replaced.
    until("the pool was taken back and refilled", || {
        engine.fake.running().len() == 3
    })
    .await;
    let now = dirs(&engine);
    assert!(
        now.contains(died) && now.contains(lives),
        "{now:?} {pooled:?}"
    );
    assert!(!now.contains(went), "{now:?}");
    assert_eq!(engine.fake.starts(lives), 1, "the live one was restarted");
    assert_eq!(engine.fake.starts(died), 2);
    assert!(engine.listed().is_empty());

    // A clean stop pauses pooled sandboxes rather than killing them; the next start with a
    // smaller pool keeps one of them and kills the rest.
    engine.manager.shutdown().await;
    for id in &now {
        assert!(engine.fake.is_frozen(id), "{id} was not paused at shutdown");
    }
    let engine = engine
        .reopen_with(|c| {
            c.warm.insert("base".into(), 1);
        })
        .await;
    until("the surplus of the pool was killed", || {
        dirs(&engine).len() == 1 && engine.fake.running().len() == 1
    })
    .await;
    let kept = dirs(&engine).into_iter().next().unwrap();
    assert!(now.contains(&kept), "{kept} is new, not kept");
    until("the kept one was in its pool again", || {
        !engine.fake.is_frozen(&kept)
    })
    .await;

    // Handed out: it is the caller's now, and the pool starts a replacement.
    let id = engine.create_with(CreateRequest::default()).await;
    assert_eq!(id, kept);
    assert_eq!(engine.listed(), BTreeSet::from([id.clone()]));
    assert_eq!(engine.run(&id, "echo hi").await, "hi\n");
    until("the pool was refilled", || dirs(&engine).len() == 2).await;

    // Without `--warm` the pool goes at the next start; the caller's sandbox stays.
    engine.manager.shutdown().await;
    let engine = engine.reopen().await;
    until("the pool was killed", || dirs(&engine).len() == 1).await;
    assert_eq!(dirs(&engine), BTreeSet::from([id.clone()]));
}

#[tokio::test]
async fn warm_naming_a_template_that_does_not_exist_stops_the_engine_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let fake = sandbox_mcp_testkit::fake::FakeDriver::new(&dir.path().join("fake")).unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let mut config = super::harness::config(dir.path());
    config.warm.insert("nope".into(), 2);
    let e = sandbox_mcp_engine::manager::Manager::open(config, fake.driver())
        .await
        .err()
        .expect("an engine with --warm for a missing template started");
    let e = e.to_string();
    assert!(
        e.contains("--warm names template nope") && e.contains("base"),
        "{e}"
    );
}
