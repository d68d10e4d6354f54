//! Forks, metrics and templates, and what has no meaning here.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{D, DEFAULT_TIMEOUT, created, parse_body, rfc3339, view};
use crate::{ENVD_VERSION, Failure, caller};

#[derive(Deserialize)]
struct ForkRequest {
    count: Option<u32>,
    timeout: Option<u64>,
}

/// Forks: children made from the sandbox's files at one moment (and its processes where the
/// engine can carry them), each a sandbox of its own with the timeout asked for.
pub(super) async fn fork(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let req: ForkRequest = parse_body(&body)?;
        let count = req.count.unwrap_or(1);
        if count == 0 {
            return Err(Failure::bad("count must be at least 1"));
        }
        let (_, tenant) = view(&door, &headers, &id).await?;
        let forked = door
            .manager
            .snapshots
            .fork(&id, tenant.as_deref(), count, BTreeMap::new(), None, false)
            .await?;
        let mut out = Vec::new();
        for child in &forked.ids {
            let v = door
                .manager
                .lifecycle
                .set_timeout(
                    child,
                    tenant.as_deref(),
                    Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT)),
                )
                .await?;
            out.push(serde_json::json!({"sandbox": created(&door, &v.record, &headers)}));
        }
        Ok::<_, Failure>((StatusCode::CREATED, Json(out)))
    };
    done.await.into_response()
}

#[derive(Deserialize)]
pub(super) struct Range {
    start: Option<i64>,
    end: Option<i64>,
}

/// The sandbox's metrics: one sample, taken now (no history is kept), when the range asked for
/// holds now. CPU use is the average since the sandbox started, over its vCPUs.
pub(super) async fn metrics(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(range): Query<Range>,
) -> Response {
    let done = async {
        let (v, tenant) = view(&door, &headers, &id).await?;
        let m = door
            .manager
            .lifecycle
            .metrics(&id, tenant.as_deref())
            .await?;
        let now = sandbox_mcp_model::ids::now_ms();
        let (start, end) = (
            range.start.unwrap_or(0),
            range.end.unwrap_or(i64::MAX / 1000),
        );
        if start * 1000 > now || end * 1000 < v.record.created_at {
            return Ok::<_, Failure>(Json(Vec::<serde_json::Value>::new()));
        }
        let vcpus = v.record.shape.vcpus.max(0.01);
        let alive = ((now - v.record.created_at) as f64 / 1000.0).max(0.001);
        let cpu = (m.usage.cpu_seconds / alive / vcpus * 100.0).clamp(0.0, 100.0);
        Ok(Json(vec![serde_json::json!({
            "timestamp": rfc3339(now),
            "timestampUnix": now / 1000,
            "cpuCount": v.record.shape.vcpus.ceil().max(1.0) as u64,
            "cpuUsedPct": cpu,
            "memUsed": m.usage.memory_bytes,
            "memTotal": m.usage.memory_limit_bytes,
            "memCache": 0,
            "diskUsed": m.disk_bytes,
            "diskTotal": m.disk_limit_bytes,
        })]))
    };
    done.await.into_response()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TemplateInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    aliases: Vec<String>,
    public: bool,
    cpu_count: u64,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    envd_version: &'static str,
}

pub(super) async fn templates(State(door): D, headers: HeaderMap) -> Response {
    let done = async {
        let tenant = caller(&door, &headers)?;
        let list = door.manager.catalog.templates_of(tenant.as_deref());
        Ok::<_, Failure>(Json(
            list.iter()
                .map(|t| TemplateInfo {
                    template_id: t.name.clone(),
                    aliases: vec![t.name.clone()],
                    public: true,
                    cpu_count: t.shape.vcpus.ceil().max(1.0) as u64,
                    memory_mb: t.shape.memory_mb,
                    disk_size_mb: t.shape.disk_mb,
                    envd_version: ENVD_VERSION,
                })
                .collect::<Vec<_>>(),
        ))
    };
    done.await.into_response()
}

pub(super) async fn unsupported_teams() -> Failure {
    Failure::unsupported("Teams and billing")
}

pub(super) async fn unsupported_volumes() -> Failure {
    Failure::unsupported("E2B's volumes service (the engine's own named volumes are separate)")
}
