//! The sandbox's network: its log (the policy itself is part of the sandbox, see [`super::sandboxes`]).

use super::convert::TryApi;
use super::request::AppState;
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::{self, Caller};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_network::log::Query;

/// Most entries of one page.
const MAX_LIMIT: usize = limits::parameters::get_network_log::LIMIT_MAXIMUM as usize;
// The log keeps pages to its own maximum: the spec's.
const _: () = assert!(MAX_LIMIT == sandbox_mcp_network::log::MAX_LIMIT);

/// Entries returned when no `limit` is given.
const DEFAULT_LIMIT: usize = 50;

pub(super) async fn log(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    q: server::GetNetworkLogQuery,
) -> Result<types::NetworkLog, EngineError> {
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
            &id,
            caller.tenant(),
            Query {
                verdict: q.verdict.map(|v| v.to_string()),
                since: q.since.map(|t| t.timestamp_millis()),
                limit,
                before,
            },
        )
        .await?;
    page.try_api()
}
