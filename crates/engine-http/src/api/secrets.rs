//! Secrets (the operator's: set, list, delete) and their bindings to sandboxes.

use axum::Json;
use axum::extract::{Path, State};

use super::convert::TryApi;
use super::request::{ApiJson, AppState, Tenant, sandbox_id};
use super::sandboxes::sandbox;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_network::secrets::NewSecret;

type ApiResult<T> = Result<Json<T>, EngineError>;

pub(super) async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
) -> ApiResult<types::SecretList> {
    let secrets = state
        .manager
        .secrets
        .secret_list(tenant.as_deref())
        .await?
        .into_iter()
        .map(TryApi::try_api)
        .collect::<Result<_, _>>()?;
    Ok(Json(types::SecretList { secrets }))
}

pub(super) async fn set(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<types::SetSecretRequest>,
) -> ApiResult<types::Secret> {
    if body.headers.as_ref().is_some_and(|h| h.is_empty()) {
        return Err(EngineError::InvalidArgument(
            "headers is empty: name at least one header its value may go in, or leave it out for Authorization".into(),
        ));
    }
    let new = NewSecret {
        name,
        hosts: body.hosts.iter().map(|h| h.to_string()).collect(),
        headers: body
            .headers
            .iter()
            .flatten()
            .map(|h| h.to_string())
            .collect(),
        format: body.format.map(|f| f.to_string()),
    };
    let view = state
        .manager
        .secrets
        .secret_set(tenant.as_deref(), new, body.value.to_string())
        .await?;
    Ok(Json(view.try_api()?))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(name): Path<String>,
) -> ApiResult<types::DeleteSecretResult> {
    let deleted = state
        .manager
        .secrets
        .secret_delete(tenant.as_deref(), &name)
        .await?;
    Ok(Json(types::DeleteSecretResult {
        name: name
            .parse()
            .map_err(|e: types::error::ConversionError| EngineError::Response(e.into()))?,
        deleted,
    }))
}

pub(super) async fn attach(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<types::AttachSecretRequest>,
) -> ApiResult<types::Sandbox> {
    let view = state
        .manager
        .secrets
        .attach_secret(sandbox_id(&id)?, tenant.as_deref(), &body.env, &body.secret)
        .await?;
    sandbox(&view)
}

pub(super) async fn detach(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, env)): Path<(String, String)>,
) -> ApiResult<types::Sandbox> {
    let view = state
        .manager
        .secrets
        .detach_secret(sandbox_id(&id)?, tenant.as_deref(), &env)
        .await?;
    sandbox(&view)
}
