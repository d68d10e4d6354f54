//! The SDKs, unmodified, against the engine: each script checks every call it makes.

use super::{E2bEngine, require_sdks, run_script};
use crate::require_sandboxes;

const KEYS: &str = "e2b-key-alpha alpha\n";

#[tokio::test]
async fn the_e2b_python_sdk_runs_unmodified_sync_and_async() {
    require_sandboxes!();
    if !require_sdks() {
        return;
    }
    let engine = E2bEngine::start(KEYS).await;
    run_script(&engine, "sdk_sync.py", "e2b-key-alpha");
    run_script(&engine, "sdk_async.py", "e2b-key-alpha");
}

#[tokio::test]
async fn the_e2b_code_interpreter_runs_unmodified() {
    require_sandboxes!();
    if !require_sdks() {
        return;
    }
    let engine = E2bEngine::start(KEYS).await;
    run_script(&engine, "code_interpreter.py", "e2b-key-alpha");
}
