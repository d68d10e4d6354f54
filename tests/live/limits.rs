//! What a fork with memory does not carry, and how it says so.

use serde_json::json;

use super::{code, live_engine};
use crate::common::{create, ok};
use crate::require_sandboxes;

/// Each sandbox's `/dev/shm` is its own tmpfs and starts empty; the dump leaves it out (no
/// archive of it is made while the parent is stopped). A context holding a file of it open is
/// listed as skipped with CRIU's reason, and the parent's context goes on untouched.
#[tokio::test]
async fn a_context_holding_a_file_of_dev_shm_is_skipped_and_the_parent_runs_on() {
    require_sandboxes!();
    let Some((_engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    code(
        &client,
        &id,
        "f = open('/dev/shm/held', 'w+'); f.write('kept'); f.flush(); x = 41",
    )
    .await;
    let forked = ok(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "memory": true}),
    )
    .await;
    let memory = &forked["memory"];
    assert_eq!(memory["carried"], json!([]), "{forked}");
    let skipped = memory["skipped"][0].as_str().unwrap_or_default();
    assert!(
        skipped.contains("code context python") && skipped.contains("dev/shm/held"),
        "{forked}"
    );
    let kid = forked["ids"][0].as_str().unwrap();
    let fresh = code(&client, kid, "'x' in globals()").await;
    assert_eq!(fresh["result"], "False", "{fresh}");
    let parent = code(&client, &id, "f.seek(0); (x, f.read())").await;
    assert_eq!(parent["result"], "(41, 'kept')", "{parent}");
}
