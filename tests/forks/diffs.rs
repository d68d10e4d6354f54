//! Diffs of what is not a plain file: special files, symlink loops, odd names and mode changes.

use serde_json::json;

use crate::common::{TestEngine, api, create, ok, sh};
use crate::require_sandboxes;

use super::{changes, ids};

/// Special files, loops, unprintable names and permission-only changes in a diff.
#[tokio::test]
async fn diffs_of_special_files_loops_odd_names_and_modes() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let a = create(&client).await;
    sh(&client, &a, "mkdir /root/t && cd /root/t && ln -s l2 l1 && ln -s l1 l2 && mkfifo p && echo x > same && chmod 600 same && touch \"$(printf 'new\\nline')\" \"$(printf 'bad\\377byte')\" 'back\\slash'").await;
    let b = ids(&ok(&client, "sandbox_fork", json!({"sandbox_id": a})).await).remove(0);
    sh(&client, &b, "cd /root/t && chmod 644 same && rm p && mkfifo q && ln -sfn elsewhere l1 && mkdir -p deep && cd deep && for i in $(seq 1 50); do mkdir d && cd d; done").await;
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": b, "against": a, "path": "/root/t"}),
    )
    .await;
    let c = changes(&d);
    let find = |p: &str| c.iter().find(|e| e.0 == p).cloned();
    assert_eq!(find("/root/t/same").unwrap().2, json!(["mode"]), "{d}");
    assert_eq!(find("/root/t/l1").unwrap().2, json!(["target"]), "{d}");
    assert_eq!(find("/root/t/p").unwrap().1, "removed");
    assert_eq!(find("/root/t/q").unwrap().1, "added");
    assert_eq!(d["added"], 52, "q, deep and 50 nested directories: {d}");
    // The odd names are untouched: present on both sides, so not listed.
    assert!(
        c.iter()
            .all(|e| !e.0.contains("line") && !e.0.contains("byte")),
        "{d}"
    );
    // And are written so that each is one printable, distinct line.
    sh(
        &client,
        &b,
        "cd /root/t && rm \"$(printf 'new\\nline')\" \"$(printf 'bad\\377byte')\" 'back\\slash'",
    )
    .await;
    let d = ok(
        &client,
        "sandbox_diff",
        json!({"sandbox_id": b, "against": a, "path": "/root/t"}),
    )
    .await;
    let removed: Vec<String> = changes(&d)
        .into_iter()
        .filter(|e| e.1 == "removed")
        .map(|e| e.0)
        .collect();
    assert!(
        removed.contains(&"/root/t/new\\x0aline".to_string()),
        "{removed:?}"
    );
    assert!(
        removed.contains(&"/root/t/bad\\xffbyte".to_string()),
        "{removed:?}"
    );
    assert!(
        removed.contains(&"/root/t/back\\\\slash".to_string()),
        "{removed:?}"
    );
    // A capped listing keeps the counts exact.
    let (status, capped) = api(
        &engine.url,
        "POST",
        &format!("/v1/sandboxes/{b}/diff"),
        Some(json!({"against": a, "limit": 3})),
    )
    .await;
    assert_eq!(status, 200, "{capped}");
    assert_eq!(capped["entries"].as_array().unwrap().len(), 3);
    assert_eq!(capped["truncated"], true);
    assert!(capped["added"].as_u64().unwrap() >= 52, "{capped}");
}
