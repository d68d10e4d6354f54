//! Preview URLs of a sandbox's ports (served by [`crate::preview`]).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::convert::TryApi;
use super::request::{ApiJson, AppState, Tenant, sandbox_id};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;

/// Shortest and longest `expires_in`, in seconds (a minute; 30 days).
const EXPIRES_IN: std::ops::RangeInclusive<u64> = 60..=2_592_000;

pub(super) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::CreatePreviewRequest>,
) -> Result<(StatusCode, Json<types::Preview>), EngineError> {
    if let Some(s) = body.expires_in
        && !EXPIRES_IN.contains(&s)
    {
        return Err(EngineError::InvalidArgument(format!(
            "expires_in is {s}; give 60 to 2592000 seconds (30 days), or leave it out for a preview that lasts as long as the sandbox"
        )));
    }
    let view = state
        .manager
        .previews
        .preview_create(
            sandbox_id(&id)?,
            tenant.as_deref(),
            body.port.get(),
            body.public,
            body.expires_in,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(view.try_api()?)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<types::PreviewList>, EngineError> {
    let previews = state
        .manager
        .previews
        .previews(sandbox_id(&id)?, tenant.as_deref())?
        .into_iter()
        .map(TryApi::try_api)
        .collect::<Result<_, _>>()?;
    Ok(Json(types::PreviewList { previews }))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, port)): Path<(String, String)>,
) -> Result<Json<types::DeletePreviewResult>, EngineError> {
    let port = port
        .parse::<u16>()
        .ok()
        .and_then(std::num::NonZeroU16::new)
        .ok_or_else(|| {
            EngineError::InvalidArgument(format!("port {port:?} is not a TCP port (1-65535)"))
        })?;
    let deleted = state
        .manager
        .previews
        .preview_delete(sandbox_id(&id)?, tenant.as_deref(), port.get())
        .await?;
    Ok(Json(types::DeletePreviewResult {
        port: port.into(),
        deleted,
    }))
}
