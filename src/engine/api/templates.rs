//! Templates as a resource: list, get, create (build or capture), delete, and import an image.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::request::{ApiJson, AppState, Tenant};
use super::sandboxes::{check_env, rules};
use crate::client::types;
use crate::engine::error::EngineError;
use crate::engine::manager::{ShapeRequest, Step, TemplateRequest};
use crate::engine::templates::{Template, TemplateStatus, check_name};

type ApiResult<T> = Result<Json<T>, EngineError>;

/// A shape asked for (of a template or a sandbox), within the spec's bounds, which the
/// generated type does not check.
pub(super) fn shape_request(s: &types::ShapeRequest) -> Result<ShapeRequest, EngineError> {
    let bad = |f: &str, lo: f64, hi: f64| {
        EngineError::InvalidArgument(format!("shape.{f} must be between {lo} and {hi}"))
    };
    let int = |v: Option<u64>, f: &str, lo: u64, hi: u64| match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(bad(f, lo as f64, hi as f64)),
        _ => Ok(()),
    };
    if let Some(v) = s.vcpus
        && !(0.1..=64.0).contains(&v)
    {
        return Err(bad("vcpus", 0.1, 64.0));
    }
    int(s.memory_mb, "memory_mb", 64, 262_144)?;
    int(s.disk_mb, "disk_mb", 64, 1_048_576)?;
    int(s.max_pids, "max_pids", 16, 65_536)?;
    Ok(ShapeRequest {
        vcpus: s.vcpus,
        memory_mb: s.memory_mb,
        disk_mb: s.disk_mb,
        max_pids: s.max_pids,
    })
}

fn template(t: &Template, default: &str) -> Result<types::Template, EngineError> {
    let bad = |what: &str, e: String| EngineError::Response(format!("template {what}: {e}"));
    let f = &t.file;
    Ok(types::Template {
        name: types::TemplateName::try_from(t.name.clone())
            .map_err(|e| bad("name", e.to_string()))?,
        description: t.file.description.clone(),
        shape: (&t.shape).into(),
        default: t.name == default,
        status: match t.status() {
            TemplateStatus::Building => types::TemplateStatus::Building,
            TemplateStatus::Ready => types::TemplateStatus::Ready,
            TemplateStatus::Failed => types::TemplateStatus::Failed,
        },
        size_bytes: f.size_bytes,
        parent: f.parent.clone(),
        warm: (f.warm > 0).then_some(f.warm),
        failure: f.failure.as_ref().map(|x| types::BuildFailure {
            step: x.step as u64,
            step_text: Some(x.step_text.clone()).filter(|s| !s.is_empty()),
            exit_code: x.exit_code,
            message: x.message.clone(),
            output_tail: x.output_tail.clone(),
        }),
    })
}

pub(super) async fn list(State(state): State<AppState>) -> ApiResult<types::TemplateList> {
    let default = state.manager.default_template();
    let templates = state
        .manager
        .templates()
        .iter()
        .map(|t| template(t, &default))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(types::TemplateList { templates }))
}

fn name_of(name: &str) -> Result<(), EngineError> {
    check_name(name).map_err(EngineError::InvalidArgument)
}

pub(super) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<types::Template> {
    name_of(&name)?;
    let t = state
        .manager
        .templates()
        .into_iter()
        .find(|t| t.name == name)
        .ok_or_else(|| EngineError::NotFound(format!("template {name} does not exist")))?;
    Ok(Json(template(&t, &state.manager.default_template())?))
}

pub(super) async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiJson(body): ApiJson<types::CreateTemplateRequest>,
) -> Result<(StatusCode, Json<types::Template>), EngineError> {
    if body.warm.is_some_and(|w| w > 16) {
        return Err(EngineError::InvalidArgument("warm is at most 16".into()));
    }
    if body.timeout_seconds.is_some_and(|t| t.get() > 86_400) {
        return Err(EngineError::InvalidArgument(
            "timeout_seconds is at most 86400 (a day)".into(),
        ));
    }
    let mut steps = Vec::new();
    for (i, s) in body.steps.iter().flatten().enumerate() {
        match (&s.run, &s.env, &s.workdir) {
            (Some(run), None, None) => steps.push(Step::Run(run.to_string())),
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
        shape: body
            .shape
            .as_ref()
            .map(shape_request)
            .transpose()?
            .unwrap_or_default(),
        network: body.network.as_ref().map(rules).unwrap_or_default(),
        warm: body.warm.unwrap_or(0),
        timeout: body.timeout_seconds.map(|t| Duration::from_secs(t.get())),
    };
    let t = state
        .manager
        .create_template(req, tenant.as_deref())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(template(&t, &state.manager.default_template())?),
    ))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<types::DeleteTemplateResult> {
    name_of(&name)?;
    state.manager.delete_template(&name).await?;
    Ok(Json(types::DeleteTemplateResult {
        name: types::TemplateName::try_from(name)
            .map_err(|e| EngineError::Response(e.to_string()))?,
        deleted: true,
    }))
}

/// Largest image archive accepted (the unpacked files have their own limit).
const MAX_ARCHIVE: u64 = 16 << 30;

/// Streams the archive to a file in the data dir, then imports it.
pub(super) async fn import(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<types::Template>), EngineError> {
    name_of(&name)?;
    let dir = state.manager.config().data_dir.join("uploads");
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(EngineError::Templates)?;
    let path = dir.join(format!("{name}.{}.tar", crate::engine::ids::nonce()));
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
        state.manager.import_template(&name, path.clone()).await
    }
    .await;
    let _ = tokio::fs::remove_file(&path).await;
    let t = result?;
    Ok((
        StatusCode::CREATED,
        Json(template(&t, &state.manager.default_template())?),
    ))
}
