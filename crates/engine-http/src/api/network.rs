//! The sandbox's network: its log (the policy itself is part of the sandbox, see [`super::sandboxes`]).

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;

use super::convert::TryApi;
use super::request::{ApiQuery, AppState, Tenant, sandbox_id};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_network::log::{MAX_LIMIT, Query};

/// Entries returned when no `limit` is given.
const DEFAULT_LIMIT: usize = 50;

#[derive(Deserialize)]
pub(super) struct LogQuery {
    verdict: Option<types::GetNetworkLogVerdict>,
    since: Option<chrono::DateTime<chrono::Utc>>,
    limit: Option<u64>,
    cursor: Option<String>,
}

pub(super) async fn log(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Json<types::NetworkLog>, EngineError> {
    let limit = q.limit.map_or(DEFAULT_LIMIT, |l| l as usize);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(EngineError::InvalidArgument(format!(
            "limit is 1-{MAX_LIMIT}"
        )));
    }
    let before = match &q.cursor {
        Some(c) => Some(c.parse::<i64>().map_err(|_| {
            EngineError::InvalidArgument(
                "cursor is not one this engine gave: pass `next_cursor` from the previous page, or leave it out"
                    .into(),
            )
        })?),
        None => None,
    };
    let page = state
        .manager
        .lifecycle
        .network_log(
            sandbox_id(&id)?,
            tenant.as_deref(),
            Query {
                verdict: q.verdict.map(|v| v.to_string()),
                since: q.since.map(|t| t.timestamp_millis()),
                limit,
                before,
            },
        )
        .await?;
    Ok(Json(page.try_api()?))
}
