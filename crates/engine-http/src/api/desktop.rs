//! Desktop sandboxes (computer use): create one, screenshot it, act on it, stop it
//! (`services::desktop`).

use super::convert::{api_sandbox_id, internal};
use super::request::AppState;
use super::sandboxes::{create_request, sandbox};
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::{self, Caller};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{ActionRequest, parse_resolution};
use sandbox_mcp_protocol::{Screen, Shot};

pub(super) async fn create(
    state: &AppState,
    caller: Caller,
    body: types::CreateComputerRequest,
) -> Result<types::Sandbox, EngineError> {
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
        .create_computer(create_request(&plain, caller)?, screen)
        .await?;
    sandbox(&view)
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

/// Smallest and largest `scale` of a screenshot.
const SCALE: std::ops::RangeInclusive<f64> = limits::parameters::take_screenshot::SCALE_MINIMUM
    ..=limits::parameters::take_screenshot::SCALE_MAXIMUM;
// An action's screenshot is scaled within the same bounds.
const _: () = assert!(
    limits::computer_action_request::SCALE_MINIMUM == *SCALE.start()
        && limits::computer_action_request::SCALE_MAXIMUM == *SCALE.end()
);

/// `scale` from a query or a body: 0.1-1.
fn check_scale(scale: f64) -> Result<f64, EngineError> {
    if scale.is_finite() && SCALE.contains(&scale) {
        Ok(scale)
    } else {
        Err(EngineError::InvalidArgument(format!(
            "scale {scale} is not between {} and {}",
            SCALE.start(),
            SCALE.end()
        )))
    }
}

pub(super) async fn screenshot(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    query: server::TakeScreenshotQuery,
) -> Result<types::Screenshot, EngineError> {
    let scale = check_scale(query.scale.unwrap_or(1.0))?;
    let (screen, shot) = state
        .manager
        .desktops
        .screenshot(&id, caller.tenant(), scale, false)
        .await?;
    Ok(api_screenshot(screen, shot))
}

pub(super) async fn action(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::ComputerActionRequest,
) -> Result<types::ComputerActionResult, EngineError> {
    let id: &str = &id;
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
        .computer_action(id, caller.tenant(), &request)
        .await?;
    let screenshot = if body.screenshot {
        let (screen, shot) = state
            .manager
            .desktops
            .screenshot(id, caller.tenant(), scale, true)
            .await?;
        Some(api_screenshot(screen, shot))
    } else {
        None
    };
    Ok(types::ComputerActionResult {
        action: body.action,
        cursor_x,
        cursor_y,
        screenshot,
    })
}

pub(super) async fn stop(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::StopComputerRequest,
) -> Result<types::StopComputerResult, EngineError> {
    let id: &str = &id;
    state.manager.desktops.desktop_of(id, caller.tenant())?;
    let status = if body.kill {
        state.manager.lifecycle.kill(id, caller.tenant()).await?;
        types::StopComputerResultStatus::Killed
    } else {
        state.manager.lifecycle.pause(id, caller.tenant()).await?;
        types::StopComputerResultStatus::Paused
    };
    Ok(types::StopComputerResult {
        id: api_sandbox_id(id)?,
        status,
    })
}
