//! The limits the README names, met as it says.

use serde_json::{Value, json};

use crate::common::{TestEngine, create, err, sh};
use crate::require_sandboxes;

/// The limits the README names, each met with the error it promises and nothing done: 16 code
/// contexts per sandbox, a write of 8 MiB at most, a zip of 10 MiB at most, 8 volumes per sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_limits_hold_and_say_so() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    let api = async |method: &str, path: String, body: Option<Value>| {
        engine.as_tenant(None, method, &path, body).await
    };
    for n in 0..16 {
        let (status, body) = api(
            "POST",
            format!("/v1/sandboxes/{id}/contexts"),
            Some(json!({"language": "python"})),
        )
        .await;
        assert!(status < 300, "context {n}: {body}");
    }
    let e = err(
        &client,
        "sandbox_code_context_create",
        json!({"sandbox_id": id, "language": "python"}),
    )
    .await;
    assert!(e.contains("already has 16 code contexts"), "{e}");
    let (_, listed) = api("GET", format!("/v1/sandboxes/{id}/contexts"), None).await;
    assert_eq!(listed["contexts"].as_array().unwrap().len(), 16, "{listed}");

    let (status, body) = api(
        "PUT",
        format!("/v1/sandboxes/{id}/files"),
        Some(json!({"path": "/root/big", "content": "x".repeat(8 * 1024 * 1024 + 1)})),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("at most 8388608 bytes"),
        "{body}"
    );
    assert_eq!(
        sh(&client, &id, "test -e /root/big || echo absent").await,
        "absent\n"
    );

    sh(
        &client,
        &id,
        "mkdir -p /root/z && head -c 11000000 /dev/urandom > /root/z/noise",
    )
    .await;
    let (status, body) = api(
        "GET",
        format!("/v1/sandboxes/{id}/files/download?path=/root/z"),
        None,
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("exceeds 10485760 bytes"),
        "{body}"
    );

    let volumes: Vec<Value> = (0..9)
        .map(|i| json!({"name": format!("v{i}"), "path": format!("/v{i}")}))
        .collect();
    let before = engine.manager.list(None, &[], None).len();
    let (status, body) = api(
        "POST",
        "/v1/sandboxes".to_string(),
        Some(json!({"volumes": volumes})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("at most 8 volumes per sandbox"),
        "{body}"
    );
    assert_eq!(engine.manager.list(None, &[], None).len(), before);
}
