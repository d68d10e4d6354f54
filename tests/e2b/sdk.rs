//! The SDKs, unmodified, against the engine: each script checks every call it makes.

use super::{E2bEngine, require_js_sdk, require_sdks, run_script};
use crate::require_sandboxes;

/// Shaped as E2B's keys are (`e2b_` and 40 hex digits): recent SDKs refuse any other.
const KEY: &str = "e2b_a1fa000000000000000000000000000000000001";
const KEYS: &str = "e2b_a1fa000000000000000000000000000000000001 alpha\n";

#[tokio::test]
async fn the_e2b_python_sdk_runs_unmodified_sync_and_async() {
    require_sandboxes!();
    if !require_sdks() {
        return;
    }
    let engine = E2bEngine::start(KEYS).await;
    run_script(&engine, "sdk_sync.py", KEY);
    run_script(&engine, "sdk_async.py", KEY);
}

#[tokio::test]
async fn the_e2b_code_interpreter_runs_unmodified() {
    require_sandboxes!();
    if !require_sdks() {
        return;
    }
    let engine = E2bEngine::start(KEYS).await;
    run_script(&engine, "code_interpreter.py", KEY);
}

#[tokio::test]
async fn the_e2b_javascript_sdk_runs_unmodified() {
    require_sandboxes!();
    if !require_js_sdk() {
        return;
    }
    let engine = E2bEngine::start(KEYS).await;
    run_script(&engine, "sdk_js.cjs", KEY);
}
