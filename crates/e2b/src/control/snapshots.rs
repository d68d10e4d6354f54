//! E2B's snapshots on the engine's templates: a snapshot is a template captured from the
//! sandbox's files (`create_template` with `from_sandbox`), in the caller's tenant. `Sandbox.create`
//! with its id starts sandboxes from it as from any template, `list_snapshots` lists the
//! tenant's captured templates, and deleting it deletes that template. A snapshot keeps the
//! sandbox's files, not its running processes (the engine's own snapshots and forks carry those
//! where CRIU can).

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::templates::{ShapeRequest, TemplateRequest};

use super::{D, parse_body, view};
use crate::{Failure, caller};

#[derive(Deserialize, Default)]
struct SnapshotRequest {
    name: Option<String>,
}

fn info(name: &str) -> serde_json::Value {
    serde_json::json!({"snapshotID": name, "names": [name]})
}

/// `POST /sandboxes/{id}/snapshots`: the sandbox's files as a new template of the caller's,
/// named as asked or after the sandbox and the time.
pub(super) async fn create(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let req: SnapshotRequest = parse_body(&body)?;
        let (_, tenant) = view(&door, &headers, &id).await?;
        let name = match req.name.filter(|n| !n.is_empty()) {
            Some(n) => n,
            None => format!(
                "snapshot-{}-{}",
                id.trim_start_matches("sbx_"),
                sandbox_mcp_model::ids::now_ms()
            ),
        };
        let request = TemplateRequest {
            name,
            description: Some(format!(
                "Snapshot of sandbox {id}, made through the E2B API."
            )),
            from: None,
            from_sandbox: Some(id.clone()),
            steps: Vec::new(),
            shape: ShapeRequest::default(),
            network: Default::default(),
            warm: 0,
            timeout: None,
        };
        let t = door
            .manager
            .templates
            .create_template(request, tenant.as_deref())
            .await?;
        Ok::<_, Failure>((StatusCode::CREATED, Json(info(&t.name))))
    };
    done.await.into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
}

/// `GET /snapshots`: the caller's snapshots (templates captured from a sandbox), of one sandbox
/// or by name when asked, newest first. One page holds them all.
pub(super) async fn list(
    State(door): D,
    headers: HeaderMap,
    Query(q): Query<SnapshotQuery>,
) -> Response {
    let done = async {
        let tenant = caller(&door, &headers)?;
        let mut found: Vec<_> = door
            .manager
            .catalog
            .templates_of(tenant.as_deref())
            .into_iter()
            .filter(|t| {
                t.file.captured_from.as_ref().is_some_and(|from| {
                    q.sandbox_id.as_ref().is_none_or(|want| want == from)
                        && q.name.as_ref().is_none_or(|want| *want == t.name)
                })
            })
            .collect();
        found.sort_by_key(|t| std::cmp::Reverse(t.file.created_at));
        Ok::<_, Failure>(Json(
            found
                .iter()
                .take(q.limit.unwrap_or(usize::MAX))
                .map(|t| info(&t.name))
                .collect::<Vec<_>>(),
        ))
    };
    done.await.into_response()
}

/// `DELETE /templates/{id}`: deletes the caller's template (a snapshot, or one it built); 404
/// when it has none by that name.
pub(super) async fn delete(
    State(door): D,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let done = async {
        let tenant = caller(&door, &headers)?;
        match door
            .manager
            .templates
            .delete_template(tenant.as_deref(), &name)
            .await
        {
            Ok(()) => Ok(StatusCode::NO_CONTENT),
            Err(e @ EngineError::NotFound(_)) => {
                Err(Failure::new(StatusCode::NOT_FOUND, e.external_message()))
            }
            Err(e) => Err(e.into()),
        }
    };
    done.await.into_response()
}
