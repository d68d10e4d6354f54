//! The engine's HTTP API: authentication, limits, error shapes.

use serde_json::{Value, json};

use crate::common::{self, KEY, TestEngine};
use crate::require_sandboxes;

#[tokio::test]
async fn every_request_needs_a_valid_key() {
    let engine = TestEngine::start().await;
    let http = engine.http();
    for (auth, expected) in [
        (None, 401),
        (Some("Bearer wrong"), 401),
        (Some("Basic abc"), 401),
        (Some(format!("Bearer {KEY}").as_str()), 200),
    ] {
        for path in [
            "/v1/health",
            "/v1/sandboxes",
            "/v1/templates",
            "/v1/no-such-route",
        ] {
            let mut req = http.get(format!("{}{path}", engine.url));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            if expected == 401 {
                assert_eq!(status, 401, "{path} with {auth:?}");
                assert_eq!(resp.headers().get("www-authenticate").unwrap(), "Bearer");
                let body: Value = resp.json().await.unwrap();
                assert_eq!(body["error_code"], "unauthorized");
                assert!(body["request_id"].as_str().is_some_and(|r| !r.is_empty()));
            } else if path == "/v1/no-such-route" {
                assert_eq!(status, 404);
                let body: Value = resp.json().await.unwrap();
                assert_eq!(body["error_code"], "not_found");
            } else {
                assert_eq!(status, 200, "{path}");
            }
        }
    }
}

#[tokio::test]
async fn malformed_requests_get_errors_in_the_spec_shape() {
    let engine = TestEngine::start().await;
    let http = engine.http();
    let auth = format!("Bearer {KEY}");
    let post = |body: &'static str| {
        http.post(format!("{}/v1/sandboxes", engine.url))
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .body(body)
    };
    for (body, needle) in [
        ("{not json", "invalid request body"),
        (r#"{"bogus": 1}"#, "unknown field `bogus`"),
        (r#"{"timeout_seconds": "soon"}"#, "invalid type"),
        (r#"{"name": "has/slash"}"#, "doesn't match pattern"),
        (
            r#"{"env_vars": {"1BAD": "x"}}"#,
            "environment variable name",
        ),
        (r#"{"metadata": {"a=b": "x"}}"#, "metadata key"),
        (
            r#"{"template": "nonexistent"}"#,
            "template nonexistent does not exist",
        ),
    ] {
        let resp = post(body).send().await.unwrap();
        let status = resp.status().as_u16();
        let json: Value = resp.json().await.unwrap();
        assert!(matches!(status, 400 | 404), "{body}: {status} {json}");
        assert!(
            json["message"].as_str().unwrap().contains(needle),
            "{body}: {json}"
        );
        assert!(json["error_code"].is_string() && json["request_id"].is_string());
    }
    // Wrong method on a known route.
    let resp = http
        .put(format!("{}/v1/health", engine.url))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    let json: Value = resp.json().await.unwrap();
    assert_eq!(json["error_code"], "invalid_argument");
    // A malformed sandbox id is simply not found.
    let resp = http
        .get(format!("{}/v1/sandboxes/..%2F..%2Fetc", engine.url))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
}

/// Rules of a request the engine checks itself, before anything is looked up, each refused with
/// what to give instead: an empty update (the spec's `minProperties`, which the generated type
/// does not check), environment variable names (map keys, which OpenAPI 3.0 cannot constrain),
/// an `env` build step without variables.
#[tokio::test]
async fn bodies_the_spec_refuses_get_errors_that_say_what_to_give() {
    let engine = TestEngine::start().await;
    let http = engine.http();
    let sandbox = format!("{}/v1/sandboxes/sbx_0000000000000000000000000a", engine.url);
    let nothing = "nothing to update: give `metadata`, `network`, `timeout_seconds`, or several";
    let bad_name = "environment variable name \"1BAD\" is invalid: use letters, digits and `_`, not starting with a digit, at most 128 characters";
    for (method, url, body, message) in [
        (reqwest::Method::PATCH, sandbox.clone(), json!({}), nothing),
        (
            reqwest::Method::PATCH,
            sandbox.clone(),
            json!({"metadata": null, "network": null}),
            nothing,
        ),
        (
            reqwest::Method::POST,
            format!("{sandbox}/exec"),
            json!({"command": "true", "env": {"1BAD": "x"}}),
            bad_name,
        ),
        (
            reqwest::Method::POST,
            format!("{}/v1/templates", engine.url),
            json!({"name": "t", "steps": [{"env": {"1BAD": "x"}}]}),
            bad_name,
        ),
        (
            reqwest::Method::POST,
            format!("{}/v1/templates", engine.url),
            json!({"name": "t", "steps": [{"run": "true"}, {"env": {}}]}),
            "step 2 sets no variables: give env at least one, or leave the step out",
        ),
    ] {
        let resp = http
            .request(method, &url)
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{url} {body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error_code"], "invalid_argument", "{v}");
        assert_eq!(v["message"], message, "{body}");
    }
    // The spec says the first two are invalid too, in the words 3.0 has.
    let spec: Value = serde_json::from_str(include_str!("../openapi/sandbox-mcp.json")).unwrap();
    let schemas = &spec["components"]["schemas"];
    assert_eq!(schemas["UpdateSandboxRequest"]["minProperties"], 1);
    assert_eq!(schemas["StepEnvVars"]["minProperties"], 1);
    for field in ["metadata", "network"] {
        assert!(schemas["UpdateSandboxRequest"]["properties"][field]["nullable"].is_null());
    }
}

#[tokio::test]
async fn request_bodies_over_16_mib_are_refused() {
    let engine = TestEngine::start().await;
    let body = format!(
        r#"{{"path": "f", "content": "{}"}}"#,
        "x".repeat(17 * 1024 * 1024)
    );
    let resp = engine
        .http()
        .put(format!(
            "{}/v1/sandboxes/sbx_0000000000000000000000000a/files",
            engine.url
        ))
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let json: Value = resp.json().await.unwrap();
    assert_eq!(json["error_code"], "payload_too_large");
}

/// An answer given before the request's body was read to its end says `Connection: close`, so
/// an HTTP/1.1 client never sends its next request on a connection the server is closing; one
/// whose body was read keeps the connection.
#[tokio::test]
async fn answers_before_the_body_is_read_close_the_connection() {
    let engine = TestEngine::start().await;
    let addr = engine.url.trim_start_matches("http://");
    let files = "/v1/sandboxes/sbx_0000000000000000000000000a/files";
    let cases = [
        // Over the body limit: refused from Content-Length, nothing read.
        (
            format!(
                "PUT {files} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            ),
            17 << 20,
            413,
        ),
        // A wrong key: refused before the body is looked at.
        (
            format!(
                "PUT {files} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer wrong\r\nContent-Type: application/json\r\n"
            ),
            4096,
            401,
        ),
    ];
    for (head, len, status) in cases {
        let answer = common::send_raw(addr, &head, len).await;
        assert_eq!(answer.status(), status, "{}", answer.head);
        assert!(answer.says_close() && answer.closed, "{}", answer.head);
    }
    // A body read to its end: the connection stays open for the next request.
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
    );
    let answer = common::send_raw(addr, &head, 10).await;
    assert!(!answer.says_close() && !answer.closed, "{}", answer.head);
}

#[tokio::test]
async fn quota_is_enforced_with_its_own_code() {
    require_sandboxes!();
    let engine = TestEngine::start_with(|c| c.max_sandboxes = 2).await;
    let client = engine.client();
    for _ in 0..2 {
        client
            .create_sandbox()
            .body(json_body())
            .send()
            .await
            .unwrap();
    }
    let e = client
        .create_sandbox()
        .body(json_body())
        .send()
        .await
        .unwrap_err();
    let sandbox_mcp_api::Error::ErrorResponse(rv) = e else {
        panic!("{e:?}")
    };
    assert_eq!(rv.status().as_u16(), 429);
    assert_eq!(rv.into_inner().error_code, "quota_exceeded");
}

fn json_body() -> sandbox_mcp_api::types::CreateSandboxRequest {
    serde_json::from_value(json!({})).unwrap()
}

#[tokio::test]
async fn ids_are_random_and_unguessable() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.client();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let s = client
            .create_sandbox()
            .body(json_body())
            .send()
            .await
            .unwrap()
            .into_inner();
        ids.push(s.id.to_string());
    }
    for id in &ids {
        assert!(sandbox_mcp_model::ids::is_sandbox_id(id), "{id}");
    }
    // 26 base32 characters carry 130 bits; consecutive ids share no structure.
    assert_ne!(ids[0][4..12], ids[1][4..12]);
    assert_ne!(ids[1][4..12], ids[2][4..12]);
}

#[tokio::test]
async fn metadata_filters_and_updates() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.client();
    let a = client
        .create_sandbox()
        .body(
            serde_json::from_value::<sandbox_mcp_api::types::CreateSandboxRequest>(
                json!({"name": "alpha", "metadata": {"project": "x", "owner": "ann"}}),
            )
            .unwrap(),
        )
        .send()
        .await
        .unwrap()
        .into_inner();
    client
        .create_sandbox()
        .body(
            serde_json::from_value::<sandbox_mcp_api::types::CreateSandboxRequest>(
                json!({"metadata": {"project": "y"}}),
            )
            .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let found = client
        .list_sandboxes()
        .metadata("project=x")
        .send()
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.sandboxes.len(), 1);
    assert_eq!(found.sandboxes[0].id, a.id);
    assert_eq!(found.sandboxes[0].name.as_deref(), Some("alpha"));
    let updated = client
        .update_sandbox()
        .sandbox_id(a.id.to_string())
        .body(
            serde_json::from_value::<sandbox_mcp_api::types::UpdateSandboxRequest>(
                json!({"metadata": {"project": "z"}}),
            )
            .unwrap(),
        )
        .send()
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.metadata.0.len(), 1);
    assert!(
        client
            .list_sandboxes()
            .metadata("project=x")
            .send()
            .await
            .unwrap()
            .into_inner()
            .sandboxes
            .is_empty()
    );
    // The typed client refuses a filter without `=` before sending it; the engine refuses it
    // too, for clients that do not check.
    assert!(
        client
            .list_sandboxes()
            .metadata("justakey")
            .send()
            .await
            .is_err()
    );
    let resp = engine
        .http()
        .get(format!("{}/v1/sandboxes?metadata=justakey", engine.url))
        .header("authorization", format!("Bearer {KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error_code"], "invalid_argument", "{body}");
    // The spec's 32-pair limit holds on create and on update, for clients that do not check it.
    let too_many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!(""))).collect();
    for (method, path) in [
        (reqwest::Method::POST, "/v1/sandboxes".to_string()),
        (reqwest::Method::PATCH, format!("/v1/sandboxes/{}", *a.id)),
    ] {
        let resp = engine
            .http()
            .request(method, format!("{}{path}", engine.url))
            .header("authorization", format!("Bearer {KEY}"))
            .json(&json!({"metadata": too_many}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{path}");
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["message"].as_str().unwrap().contains("at most 32"),
            "{body}"
        );
    }
    let running = client
        .list_sandboxes()
        .status("running")
        .send()
        .await
        .unwrap()
        .into_inner();
    assert_eq!(running.sandboxes.len(), 2);
}

#[tokio::test]
async fn a_create_without_a_body_uses_the_defaults() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    // `curl -X POST …/v1/sandboxes`, or a generic client that leaves out an all-optional body.
    let resp = engine
        .http()
        .post(format!("{}/v1/sandboxes", engine.url))
        .header("authorization", format!("Bearer {KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "running", "{body}");
    assert_eq!(body["template"], "base", "{body}");
    // A body that is present but empty and typed as JSON is still malformed.
    let resp = engine
        .http()
        .post(format!("{}/v1/sandboxes", engine.url))
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // And the spec says so: the body is optional, and the description says what leaving it out
    // means (the one rule OpenAPI 3.0 cannot state).
    let spec: Value = serde_json::from_str(include_str!("../openapi/sandbox-mcp.json")).unwrap();
    let body_spec = &spec["paths"]["/v1/sandboxes"]["post"]["requestBody"];
    assert_eq!(body_spec["required"], false, "{body_spec}");
    assert!(
        body_spec["description"]
            .as_str()
            .is_some_and(|d| d.contains("left out")),
        "{body_spec}"
    );
    let id = body["id"].as_str().unwrap();
    engine
        .client()
        .kill_sandbox()
        .sandbox_id(id)
        .send()
        .await
        .unwrap();
}
