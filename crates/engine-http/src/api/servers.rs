//! Hosted MCP servers' registrations: checked here (name, command, network rules, environment),
//! stored by the engine as the request's JSON, and shown back with the environment's values to
//! the server's owner only.

use super::request::{AppState, check_env};
use sandbox_mcp_api::server::Caller;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::servers::ServerView;
use sandbox_mcp_model::ids;
use sandbox_mcp_network::EgressDefault;
use sandbox_mcp_network::policy::Policy;

/// A session idle this long ends, unless the server says otherwise.
const DEFAULT_IDLE_SECONDS: u64 = 1800;

/// A path's server name; `refuse` is the error for a malformed one.
fn server_name(
    raw: &str,
    refuse: impl FnOnce(String) -> EngineError,
) -> Result<types::ServerName, EngineError> {
    types::ServerName::try_from(raw.to_string()).map_err(|_| {
        refuse(format!(
            "{:?} is not a server name: lower-case letters, digits, `.`, `_` and `-`, at most 63, starting with a letter or digit",
            raw.chars().take(70).collect::<String>()
        ))
    })
}

fn server(view: ServerView) -> Result<types::Server, EngineError> {
    let request: types::ServerRequest = serde_json::from_str(&view.row.settings).map_err(|e| {
        EngineError::Response(format!("a stored server does not parse: {e}").into())
    })?;
    let env_var_names = request
        .env_vars
        .as_ref()
        .map(|e| e.keys().cloned().collect())
        .unwrap_or_default();
    Ok(types::Server {
        name: server_name(&view.row.name, |m| EngineError::Response(m.into()))?,
        shared: view.shared,
        command: request.command.iter().map(|a| a.to_string()).collect(),
        template: request.template.map(|t| t.to_string()),
        allow_out: request.allow_out.iter().map(|r| r.to_string()).collect(),
        secrets: request
            .secrets
            .map(|s| s.0.into_iter().map(|(k, v)| (k, v.to_string())).collect())
            .unwrap_or_default(),
        env_vars: if view.owned { request.env_vars } else { None },
        env_var_names,
        shape: request.shape,
        cwd: request.cwd.map(|c| c.to_string()),
        http_port: request.http_port.map(|p| p.get()),
        http_path: request.http_path.map(|p| p.to_string()),
        idle_timeout_seconds: request.idle_timeout_seconds.unwrap_or(DEFAULT_IDLE_SECONDS),
        warm: request.warm.unwrap_or(0),
        source: request.source,
        created_at: ids::time(view.row.created_at),
        updated_at: ids::time(view.row.updated_at),
    })
}

pub(super) async fn list(
    state: &AppState,
    caller: Caller,
) -> Result<types::ServerList, EngineError> {
    let views = state.manager.servers.list(caller.tenant()).await?;
    Ok(types::ServerList {
        servers: views.into_iter().map(server).collect::<Result<_, _>>()?,
    })
}

pub(super) async fn put(
    state: &AppState,
    caller: Caller,
    name: String,
    body: types::ServerRequest,
) -> Result<types::Server, EngineError> {
    let name = server_name(&name, EngineError::InvalidArgument)?;
    use sandbox_mcp_api::limits::server_request as limit;
    if body.command.len() > limit::COMMAND_MAX_ITEMS
        || body
            .command
            .iter()
            .any(|a| a.len() > limit::COMMAND_ITEMS_MAX_LENGTH)
    {
        return Err(EngineError::InvalidArgument(format!(
            "command has {} parts; at most {} of at most {} bytes each",
            body.command.len(),
            limit::COMMAND_MAX_ITEMS,
            limit::COMMAND_ITEMS_MAX_LENGTH
        )));
    }
    if let Some(idle) = body.idle_timeout_seconds
        && !(limit::IDLE_TIMEOUT_SECONDS_MINIMUM..=limit::IDLE_TIMEOUT_SECONDS_MAXIMUM)
            .contains(&idle)
    {
        return Err(EngineError::InvalidArgument(format!(
            "idle_timeout_seconds is {idle}; give {} to {} (a week)",
            limit::IDLE_TIMEOUT_SECONDS_MINIMUM,
            limit::IDLE_TIMEOUT_SECONDS_MAXIMUM
        )));
    }
    if let Some(warm) = body.warm
        && u64::from(warm) > limit::WARM_MAXIMUM
    {
        return Err(EngineError::InvalidArgument(format!(
            "warm is {warm}; at most {} instances are kept warm per server",
            limit::WARM_MAXIMUM
        )));
    }
    if body.command.first().is_none_or(|c| c.is_empty()) {
        return Err(EngineError::InvalidArgument(
            "command is empty (or command[0] is): give the program to run, e.g. [\"npx\", \"-y\", \"@modelcontextprotocol/server-memory\"]".into(),
        ));
    }
    let allow_out: Vec<String> = body.allow_out.iter().map(|r| r.to_string()).collect();
    Policy::parse(
        &allow_out,
        &["0.0.0.0/0".into(), "::/0".into()],
        EgressDefault::Open,
    )
    .map_err(EngineError::InvalidArgument)?;
    if let Some(path) = &body.http_path
        && (path.contains(['?', '#', '\\']) || path.split('/').any(|seg| seg == ".." || seg == "."))
    {
        return Err(EngineError::InvalidArgument(format!(
            "http_path {:?} must be a plain path: no `.` or `..` segment, `?`, `#` or `\\`",
            path.as_str()
        )));
    }
    if let Some(env) = &body.env_vars {
        check_env(env)?;
    }
    for (env, secret) in body.secrets.iter().flat_map(|s| s.0.iter()) {
        sandbox_mcp_engine::services::secrets::check_binding_name(env)?;
        sandbox_mcp_network::secrets::check_name(secret).map_err(EngineError::from)?;
    }
    let settings = serde_json::to_string(&body)
        .map_err(|e| EngineError::Response(format!("cannot store the server: {e}").into()))?;
    let view = state
        .manager
        .servers
        .put(caller.tenant(), &name, settings)
        .await?;
    server(view)
}

pub(super) async fn get(
    state: &AppState,
    caller: Caller,
    name: String,
) -> Result<types::Server, EngineError> {
    let name = server_name(&name, EngineError::NotFound)?;
    server(state.manager.servers.get(caller.tenant(), &name).await?)
}

pub(super) async fn delete(
    state: &AppState,
    caller: Caller,
    name: String,
) -> Result<types::DeleteServerResult, EngineError> {
    let name = server_name(&name, EngineError::NotFound)?;
    let deleted = state.manager.servers.delete(caller.tenant(), &name).await?;
    Ok(types::DeleteServerResult { name, deleted })
}
