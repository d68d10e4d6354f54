//! Trees come back with their own pids, whatever the trees restored before them do.

use serde_json::json;

use super::{background, code, live_engine};
use crate::common::{create, ok};
use crate::require_sandboxes;

/// A code context (restored first: contexts come before jobs) whose thread starts a short-lived
/// process every 5 ms, and a job started right after it, with the next pid. Were the context to
/// run as soon as it is restored, its first new process would take the lowest free pid of the
/// child's namespace, which is the job's, and the job could not be restored.
#[tokio::test]
async fn a_tree_restored_first_never_takes_the_pid_of_one_restored_after_it() {
    require_sandboxes!();
    let Some((_engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    code(&client, &id, "x = 41").await;
    background(&client, &id, "exec sleep 3600").await;
    code(
        &client,
        &id,
        "import subprocess, threading, time\n\
         def spawn():\n    while True:\n        subprocess.Popen(['sleep', '0.3'])\n        time.sleep(0.005)\n\
         threading.Thread(target=spawn, daemon=True).start()",
    )
    .await;
    for round in 1..=3 {
        let forked = ok(
            &client,
            "sandbox_fork",
            json!({"sandbox_id": id, "count": 2, "memory": true}),
        )
        .await;
        assert_eq!(
            forked["memory"]["skipped"],
            json!([]),
            "fork {round}: {forked}"
        );
        assert_eq!(
            forked["memory"]["carried"],
            json!(["code context python", "job job_1"]),
            "fork {round}: {forked}"
        );
    }
}
