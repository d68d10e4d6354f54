//! Preview URLs of a sandbox's ports (served by `engine::preview`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::request::{ApiJson, AppState, Tenant, sandbox_id};
use crate::client::types;
use crate::engine::error::EngineError;
use crate::engine::manager::PreviewView;

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
        .preview_create(
            sandbox_id(&id)?,
            tenant.as_deref(),
            body.port.get(),
            body.public,
            body.expires_in,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(view.try_into()?)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<types::PreviewList>, EngineError> {
    let previews = state
        .manager
        .previews(sandbox_id(&id)?, tenant.as_deref())?
        .into_iter()
        .map(types::Preview::try_from)
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
        .preview_delete(sandbox_id(&id)?, tenant.as_deref(), port.get())
        .await?;
    Ok(Json(types::DeletePreviewResult {
        port: port.into(),
        deleted,
    }))
}

impl TryFrom<PreviewView> for types::Preview {
    type Error = EngineError;

    fn try_from(v: PreviewView) -> Result<Self, EngineError> {
        let p = &v.preview;
        let port = std::num::NonZeroU16::new(p.port)
            .ok_or_else(|| EngineError::Response("a preview of port 0".into()))?;
        let time = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .ok_or_else(|| EngineError::Response(format!("time {ms} out of range")))
        };
        Ok(types::Preview {
            port: port.into(),
            url: v.url,
            path_url: v.path_url,
            public: p.public,
            token: (!p.public).then(|| p.token.clone()),
            created_at: time(p.created_at)?,
            expires_at: p.expires_at.map(time).transpose()?,
            expired: p
                .expires_at
                .is_some_and(|at| at <= crate::engine::ids::now_ms()),
        })
    }
}
