//! Tenants: templates belong to their tenant, and shared ones are read-only to the others.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::TestEngine;
use crate::require_sandboxes;

/// Builds `name` as `tenant` from `steps` and waits until it is ready.
async fn build_as(engine: &TestEngine, tenant: Option<&str>, name: &str, steps: Value) {
    let (status, t) = engine
        .as_tenant(
            tenant,
            "POST",
            "/v1/templates",
            Some(json!({"name": name, "steps": steps})),
        )
        .await;
    assert_eq!(status, 201, "{name}: {t}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, t) = engine
            .as_tenant(tenant, "GET", &format!("/v1/templates/{name}"), None)
            .await;
        if t["status"] != "building" {
            assert_eq!(t["status"], "ready", "{t}");
            return;
        }
        assert!(Instant::now() < deadline, "{name} still building");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sandbox of `tenant` from `template`: its id, or the refusal.
async fn start_as(
    engine: &TestEngine,
    tenant: Option<&str>,
    template: &str,
) -> Result<String, Value> {
    let (status, r) = engine
        .as_tenant(
            tenant,
            "POST",
            "/v1/sandboxes",
            Some(json!({"template": template})),
        )
        .await;
    if status == 201 {
        Ok(r["id"].as_str().unwrap().to_string())
    } else {
        Err(r)
    }
}

async fn cat_as(engine: &TestEngine, tenant: Option<&str>, id: &str, path: &str) -> String {
    let (_, r) = engine
        .as_tenant(
            tenant,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": format!("cat {path} 2>&1")})),
        )
        .await;
    r["stdout"].as_str().unwrap_or("").to_string()
}

/// Templates belong to the tenant that made them: another tenant cannot list, read, start from,
/// build on, capture into, delete or shadow them, and its own template of the same name is its
/// own. Shared ones (built in, the operator's) are usable by every tenant and deletable by none.
/// Build caches are never shared between tenants.
#[tokio::test]
async fn templates_belong_to_their_tenant_and_shared_ones_are_read_only() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let (a, b) = (Some("tenant-a"), Some("tenant-b"));
    // The same steps for everyone: a file only the builder's run can have written.
    let steps =
        json!([{"run": "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /root/rand"}]);
    build_as(&engine, a, "team", steps.clone()).await;
    let ida = start_as(&engine, a, "team").await.unwrap();
    let a_rand = cat_as(&engine, a, &ida, "/root/rand").await;
    assert_eq!(a_rand.len(), 32, "{a_rand}");
    // A capture of A's sandbox is A's too.
    let (status, r) = engine
        .as_tenant(
            a,
            "POST",
            "/v1/templates",
            Some(json!({"name": "snap-a", "from_sandbox": ida})),
        )
        .await;
    assert_eq!(status, 201, "{r}");
    assert_eq!(r["shared"], false, "{r}");
    // B sees neither, and every way to reach them answers as for a template that does not exist.
    let (_, list) = engine.as_tenant(b, "GET", "/v1/templates", None).await;
    let names: Vec<&str> = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"team") && !names.contains(&"snap-a"),
        "{list}"
    );
    assert!(names.contains(&"base"), "{list}");
    assert!(
        list["templates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["shared"] == true)
    );
    for name in ["team", "snap-a"] {
        let (status, r) = engine
            .as_tenant(b, "GET", &format!("/v1/templates/{name}"), None)
            .await;
        assert_eq!(status, 404, "{r}");
        let e = start_as(&engine, b, name).await.unwrap_err();
        assert!(
            e["message"].as_str().unwrap().contains("does not exist"),
            "{e}"
        );
        let (status, r) = engine
            .as_tenant(b, "DELETE", &format!("/v1/templates/{name}"), None)
            .await;
        assert_eq!(status, 404, "{r}");
        let (status, r) = engine
            .as_tenant(
                b,
                "POST",
                "/v1/templates",
                Some(json!({"name": "on-top", "from": name, "steps": [{"run": "true"}]})),
            )
            .await;
        assert_eq!(status, 404, "{r}");
    }
    // Nor the operator: a tenant's template is in the tenant's namespace only.
    let (_, list) = engine.as_tenant(None, "GET", "/v1/templates", None).await;
    assert!(!list.to_string().contains("\"team\""), "{list}");
    // B's own "team", from the same steps: its own build (never A's cached layer), its own files.
    build_as(&engine, b, "team", steps.clone()).await;
    let idb = start_as(&engine, b, "team").await.unwrap();
    let b_rand = cat_as(&engine, b, &idb, "/root/rand").await;
    assert_eq!(b_rand.len(), 32, "{b_rand}");
    assert_ne!(a_rand, b_rand, "B's build reused A's layer");
    let again = start_as(&engine, a, "team").await.unwrap();
    assert_eq!(cat_as(&engine, a, &again, "/root/rand").await, a_rand);
    // Within one namespace the cache still works: the operator's two builds of the same steps
    // share their layer.
    build_as(&engine, None, "ops-1", steps.clone()).await;
    build_as(&engine, None, "ops-2", steps.clone()).await;
    let o1 = start_as(&engine, None, "ops-1").await.unwrap();
    let o2 = start_as(&engine, None, "ops-2").await.unwrap();
    assert_eq!(
        cat_as(&engine, None, &o1, "/root/rand").await,
        cat_as(&engine, None, &o2, "/root/rand").await
    );
    // The operator's templates are shared: B starts from one, but cannot delete, rebuild or
    // shadow it; nor a built-in one.
    let idops = start_as(&engine, b, "ops-1").await.unwrap();
    assert_eq!(cat_as(&engine, b, &idops, "/root/rand").await.len(), 32);
    for name in ["ops-1", "base"] {
        let (status, r) = engine
            .as_tenant(b, "DELETE", &format!("/v1/templates/{name}"), None)
            .await;
        assert_eq!(status, 403, "{name}: {r}");
        assert!(r["message"].as_str().unwrap().contains("shared"), "{r}");
    }
    let (status, r) = engine
        .as_tenant(
            b,
            "POST",
            "/v1/templates",
            Some(json!({"name": "ops-1", "steps": [{"run": "true"}]})),
        )
        .await;
    assert_eq!(status, 409, "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("shared template"),
        "{r}"
    );
    // B's sandboxes show the name B gave; A deletes its own once its sandboxes are gone.
    let (_, view) = engine
        .as_tenant(b, "GET", &format!("/v1/sandboxes/{idb}"), None)
        .await;
    assert_eq!(view["template"], "team", "{view}");
    for id in [&ida, &again] {
        engine
            .as_tenant(a, "DELETE", &format!("/v1/sandboxes/{id}"), None)
            .await;
    }
    let (status, r) = engine
        .as_tenant(a, "DELETE", "/v1/templates/team", None)
        .await;
    assert_eq!(status, 200, "{r}");
    // B's "team" is untouched, and survives a restart as B's.
    let dir = engine.stop().await;
    let config = TestEngine::config_for(dir.path());
    let engine = TestEngine::start_on(dir, config).await;
    let (status, r) = engine.as_tenant(b, "GET", "/v1/templates/team", None).await;
    assert_eq!((status, r["shared"].clone()), (200, json!(false)), "{r}");
    let (status, _) = engine.as_tenant(a, "GET", "/v1/templates/team", None).await;
    assert_eq!(status, 404);
    let (status, _) = engine
        .as_tenant(a, "GET", "/v1/templates/snap-a", None)
        .await;
    assert_eq!(status, 200);
}
