//! Templates as a resource: list, get, create (build or capture), delete, and import an image.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::convert::{Api, TryApi};
use super::request::{AppState, check_env};
use sandbox_mcp_api::limits;
use sandbox_mcp_api::server::Caller;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{Step, TemplateRequest};
use sandbox_mcp_storage::templates::{Template, check_name};

/// Most warm sandboxes a template keeps.
const MAX_WARM: u64 = limits::create_template_request::WARM_MAXIMUM;
/// Longest build.
const MAX_TIMEOUT_SECONDS: u64 = limits::create_template_request::TIMEOUT_SECONDS_MAXIMUM;

/// A template as the API shows it (whether it is the engine's default is part of that).
fn shown(state: &AppState, t: &Template) -> Result<types::Template, EngineError> {
    (t, state.manager.catalog.default_template().as_str()).try_api()
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
) -> Result<types::TemplateList, EngineError> {
    let default = state.manager.catalog.default_template();
    let templates = state
        .manager
        .catalog
        .templates_of(caller.tenant())
        .iter()
        .map(|t| (&**t, default.as_str()).try_api())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(types::TemplateList { templates })
}

fn name_of(name: &str) -> Result<(), EngineError> {
    check_name(name).map_err(EngineError::InvalidArgument)
}

pub(super) async fn get(
    state: &AppState,
    caller: Caller,
    name: String,
) -> Result<types::Template, EngineError> {
    name_of(&name)?;
    let t = state.manager.catalog.template_for(caller.tenant(), &name)?;
    shown(state, &t)
}

pub(super) async fn create(
    state: &AppState,
    caller: Caller,
    body: types::CreateTemplateRequest,
) -> Result<types::Template, EngineError> {
    if body.warm.is_some_and(|w| u64::from(w) > MAX_WARM) {
        return Err(EngineError::InvalidArgument(format!(
            "warm is at most {MAX_WARM}"
        )));
    }
    if body
        .timeout_seconds
        .is_some_and(|t| t.get() > MAX_TIMEOUT_SECONDS)
    {
        return Err(EngineError::InvalidArgument(format!(
            "timeout_seconds is at most {MAX_TIMEOUT_SECONDS} (a day)"
        )));
    }
    let mut steps = Vec::new();
    for (i, s) in body.steps.iter().flatten().enumerate() {
        match (&s.run, &s.env, &s.workdir) {
            (Some(run), None, None) => steps.push(Step::Run(run.to_string())),
            (None, Some(env), None) if env.is_empty() => {
                return Err(EngineError::InvalidArgument(format!(
                    "step {} sets no variables: give env at least one, or leave the step out",
                    i + 1
                )));
            }
            // One step per variable: each step's cache key is about one change.
            (None, Some(env), None) => {
                steps.extend(check_env(env)?.into_iter().map(|(k, v)| Step::Env(k, v)))
            }
            (None, None, Some(dir)) => steps.push(Step::Workdir(dir.to_string())),
            _ => {
                return Err(EngineError::InvalidArgument(format!(
                    "step {} must have exactly one of run, env, workdir",
                    i + 1
                )));
            }
        }
    }
    let req = TemplateRequest {
        name: body.name.to_string(),
        description: body.description.as_ref().map(|d| d.to_string()),
        from: body.from.as_ref().map(|f| f.to_string()),
        from_sandbox: body.from_sandbox.as_ref().map(|s| s.to_string()),
        steps,
        shape: (&body.shape).try_api()?,
        network: body.network.as_ref().map(Api::api).unwrap_or_default(),
        warm: body.warm.unwrap_or(0),
        timeout: body.timeout_seconds.map(|t| Duration::from_secs(t.get())),
    };
    let t = state
        .manager
        .templates
        .create_template(req, caller.tenant())
        .await?;
    shown(state, &t)
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    name: String,
) -> Result<types::DeleteTemplateResult, EngineError> {
    name_of(&name)?;
    state
        .manager
        .templates
        .delete_template(caller.tenant(), &name)
        .await?;
    Ok(types::DeleteTemplateResult {
        name: types::TemplateName::try_from(name).map_err(|e| EngineError::Response(e.into()))?,
        deleted: true,
    })
}

/// Largest image archive accepted (the unpacked files have their own limit).
const MAX_ARCHIVE: u64 = 16 << 30;

/// Streams the archive to a file in the data dir, then imports it.
pub(super) async fn import(
    state: &AppState,
    caller: Caller,
    name: String,
    body: axum::body::Body,
) -> Result<types::Template, EngineError> {
    name_of(&name)?;
    let dir = state.manager.config().data_dir.join("uploads");
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(EngineError::Templates)?;
    let path = dir.join(format!("{name}.{}.tar", sandbox_mcp_model::ids::nonce()));
    let result = async {
        let mut file = tokio::fs::File::create(&path)
            .await
            .map_err(EngineError::Templates)?;
        let mut stream = body.into_data_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| EngineError::InvalidArgument(format!("the upload broke off: {e}")))?;
            total += chunk.len() as u64;
            if total > MAX_ARCHIVE {
                return Err(EngineError::PayloadTooLarge(format!(
                    "image archives are at most {} GiB",
                    MAX_ARCHIVE >> 30
                )));
            }
            file.write_all(&chunk)
                .await
                .map_err(EngineError::Templates)?;
        }
        file.flush().await.map_err(EngineError::Templates)?;
        state
            .manager
            .templates
            .import_template(caller.tenant(), &name, path.clone())
            .await
    }
    .await;
    let _ = tokio::fs::remove_file(&path).await;
    let t = result?;
    shown(state, &t)
}
