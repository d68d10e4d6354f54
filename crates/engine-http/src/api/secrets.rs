//! Secrets (the operator's: set, list, delete) and their bindings to sandboxes.

use super::convert::TryApi;
use super::request::AppState;
use super::sandboxes::sandbox;
use sandbox_mcp_api::server::Caller;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_network::secrets::NewSecret;

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
) -> Result<types::SecretList, EngineError> {
    let secrets = state
        .manager
        .secrets
        .secret_list(caller.tenant())
        .await?
        .into_iter()
        .map(TryApi::try_api)
        .collect::<Result<_, _>>()?;
    Ok(types::SecretList { secrets })
}

pub(super) async fn set(
    state: &AppState,
    caller: Caller,
    name: String,
    body: types::SetSecretRequest,
) -> Result<types::Secret, EngineError> {
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
        .secret_set(caller.tenant(), new, body.value.to_string())
        .await?;
    view.try_api()
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    name: String,
) -> Result<types::DeleteSecretResult, EngineError> {
    let deleted = state
        .manager
        .secrets
        .secret_delete(caller.tenant(), &name)
        .await?;
    Ok(types::DeleteSecretResult {
        name: name
            .parse()
            .map_err(|e: types::error::ConversionError| EngineError::Response(e.into()))?,
        deleted,
    })
}

pub(super) async fn attach(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    body: types::AttachSecretRequest,
) -> Result<types::Sandbox, EngineError> {
    let view = state
        .manager
        .secrets
        .attach_secret(&id, caller.tenant(), &body.env, &body.secret)
        .await?;
    sandbox(&view)
}

pub(super) async fn detach(
    state: &AppState,
    caller: Caller,
    id: types::SandboxId,
    env: String,
) -> Result<types::Sandbox, EngineError> {
    let view = state
        .manager
        .secrets
        .detach_secret(&id, caller.tenant(), &env)
        .await?;
    sandbox(&view)
}
