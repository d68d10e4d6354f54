//! Desktop sandboxes (computer use): create one, screenshot it, act on it, stop it
//! (`services::desktop`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::convert::{api_sandbox_id, internal};
use super::request::{ApiJson, ApiJsonOrEmpty, ApiQuery, AppState, Tenant, sandbox_id};
use super::sandboxes::{create_request, sandbox};
use crate::error::EngineError;
use crate::services::{ActionRequest, parse_resolution};
use sandbox_mcp_api::types;
use sandbox_mcp_protocol::{Screen, Shot};

pub(super) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<types::CreateComputerRequest>,
) -> Result<(StatusCode, Json<types::Sandbox>), EngineError> {
    let screen = parse_resolution(&body.resolution)?;
    // The rest of the body is create_sandbox's: the same checks apply.
    let mut fields = serde_json::to_value(&body).map_err(internal)?;
    if let Some(o) = fields.as_object_mut() {
        o.remove("resolution");
    }
    let plain: types::CreateSandboxRequest = serde_json::from_value(fields).map_err(internal)?;
    let view = state
        .manager
        .desktops
        .create_computer(create_request(&plain, tenant)?, screen)
        .await?;
    Ok((StatusCode::CREATED, sandbox(&view)?))
}

fn api_screenshot(screen: Screen, shot: Shot) -> types::Screenshot {
    types::Screenshot {
        width: shot.width,
        height: shot.height,
        screen_width: screen.width.into(),
        screen_height: screen.height.into(),
        cursor_x: shot.cursor_x,
        cursor_y: shot.cursor_y,
        png_base64: shot.png_b64,
    }
}

/// `scale` from a query or a body: 0.1-1.
fn check_scale(scale: f64) -> Result<f64, EngineError> {
    if scale.is_finite() && (0.1..=1.0).contains(&scale) {
        Ok(scale)
    } else {
        Err(EngineError::InvalidArgument(format!(
            "scale {scale} is not between 0.1 and 1"
        )))
    }
}

#[derive(Deserialize)]
pub(super) struct ScreenshotQuery {
    scale: Option<f64>,
}

pub(super) async fn screenshot(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ScreenshotQuery>,
) -> Result<Json<types::Screenshot>, EngineError> {
    let scale = check_scale(query.scale.unwrap_or(1.0))?;
    let (screen, shot) = state
        .manager
        .desktops
        .screenshot(sandbox_id(&id)?, tenant.as_deref(), scale, false)
        .await?;
    Ok(Json(api_screenshot(screen, shot)))
}

pub(super) async fn action(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::ComputerActionRequest>,
) -> Result<Json<types::ComputerActionResult>, EngineError> {
    let id = sandbox_id(&id)?;
    let scale = check_scale(body.scale)?;
    // The generated enums print as the spec writes them.
    let (action, button, direction) = (
        body.action.to_string(),
        body.button.as_ref().map(ToString::to_string),
        body.direction.as_ref().map(ToString::to_string),
    );
    let request = ActionRequest {
        action: &action,
        x: body.x,
        y: body.y,
        to_x: body.to_x,
        to_y: body.to_y,
        text: body.text.as_deref().map(String::as_str),
        keys: body.keys.as_deref().map(String::as_str),
        button: button.as_deref(),
        direction: direction.as_deref(),
        amount: body.amount.map(|a| a.get()),
    };
    let (cursor_x, cursor_y) = state
        .manager
        .desktops
        .computer_action(id, tenant.as_deref(), &request)
        .await?;
    let screenshot = if body.screenshot {
        let (screen, shot) = state
            .manager
            .desktops
            .screenshot(id, tenant.as_deref(), scale, true)
            .await?;
        Some(api_screenshot(screen, shot))
    } else {
        None
    };
    Ok(Json(types::ComputerActionResult {
        action: body.action,
        cursor_x,
        cursor_y,
        screenshot,
    }))
}

pub(super) async fn stop(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<types::StopComputerRequest>,
) -> Result<Json<types::StopComputerResult>, EngineError> {
    let id = sandbox_id(&id)?;
    state.manager.desktops.desktop_of(id, tenant.as_deref())?;
    let status = if body.kill {
        state.manager.lifecycle.kill(id, tenant.as_deref()).await?;
        types::StopComputerResultStatus::Killed
    } else {
        state.manager.lifecycle.pause(id, tenant.as_deref()).await?;
        types::StopComputerResultStatus::Paused
    };
    Ok(Json(types::StopComputerResult {
        id: api_sandbox_id(id)?,
        status,
    }))
}
