//! Preview URLs of a sandbox's ports (served by [`crate::preview`]).

use super::convert::TryApi;
use super::request::AppState;
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::Caller;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;

/// Shortest and longest `expires_in`, in seconds (a minute; 30 days).
const EXPIRES_IN: std::ops::RangeInclusive<u64> = limits::create_preview_request::EXPIRES_IN_MINIMUM
    ..=limits::create_preview_request::EXPIRES_IN_MAXIMUM;

pub(super) async fn create(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::CreatePreviewRequest,
) -> Result<types::Preview, EngineError> {
    if let Some(s) = body.expires_in
        && !EXPIRES_IN.contains(&s)
    {
        return Err(EngineError::InvalidArgument(format!(
            "expires_in is {s}; give {} to {} seconds (30 days), or leave it out for a preview that lasts as long as the sandbox",
            EXPIRES_IN.start(),
            EXPIRES_IN.end()
        )));
    }
    let view = state
        .manager
        .previews
        .preview_create(
            &id,
            caller.tenant(),
            body.port.get(),
            body.public,
            body.expires_in,
        )
        .await?;
    view.try_api()
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
) -> Result<types::PreviewList, EngineError> {
    let previews = state
        .manager
        .previews
        .previews(&id, caller.tenant())?
        .into_iter()
        .map(TryApi::try_api)
        .collect::<Result<_, _>>()?;
    Ok(types::PreviewList { previews })
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    port: String,
) -> Result<types::DeletePreviewResult, EngineError> {
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
        .preview_delete(&id, caller.tenant(), port.get())
        .await?;
    Ok(types::DeletePreviewResult {
        port: port.into(),
        deleted,
    })
}
