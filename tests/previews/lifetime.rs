//! Lifetime: previews survive an engine restart, and expire.

use serde_json::json;

use crate::common::*;
use crate::require_sandboxes;

use super::{Url, get, needs_previews, preview, start_app, token_header};

/// Previews are stored with their sandbox: they survive an engine restart, and one past its
/// expiry answers 410 and is listed as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_survive_a_restart_and_expire() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    if !needs_previews(&engine) {
        return;
    }
    let client = engine.mcp().await;
    let id = create(&client).await;
    let kept = preview(&client, &id, json!({"port": 4000})).await;
    let expiring = preview(&client, &id, json!({"port": 4001, "expires_in": 60})).await;
    assert!(expiring["expires_at"].is_string(), "{expiring}");
    drop(client);
    let dir = engine.stop().await;
    // Move the expiry into the past while the engine is down.
    let db = rusqlite::Connection::open(dir.path().join("data/state.db")).unwrap();
    db.execute(
        "UPDATE previews SET expires_at = 1000 WHERE port = 4001",
        [],
    )
    .unwrap();
    drop(db);
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    start_app(&client, &id, 4000, "back").await;
    let listed = ok(&client, "sandbox_preview_list", json!({"sandbox_id": id})).await;
    let previews = listed["previews"].as_array().unwrap();
    assert_eq!(previews.len(), 2, "{listed}");
    let url = Url::parse(previews[0]["url"].as_str().unwrap());
    assert_eq!(
        url.token,
        Url::parse(kept["url"].as_str().unwrap()).token,
        "the token survived the restart"
    );
    assert_eq!(
        get(&url, "/", &token_header(&url)).await.json()["name"],
        "back"
    );
    assert_eq!(previews[1]["expired"], true, "{listed}");
    let gone = Url::parse(previews[1]["url"].as_str().unwrap());
    let a = get(&gone, "/", &token_header(&gone)).await;
    assert_eq!(a.status, 410, "{a:?}");
    assert!(a.body.contains("expired"), "{}", a.body);
}
