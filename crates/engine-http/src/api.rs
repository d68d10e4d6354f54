//! The engine's HTTP API: one handler per operation of `openapi/sandbox-mcp.json`, on the types
//! generated from it. Request bodies are the client's own types (so both sides validate the same
//! constraints), and every response is built as the generated type the client will parse.
//!
//! Where things are: one module per resource ([`sandboxes`], [`exec`], [`code`], [`jobs`],
//! [`files`], [`network`], [`previews`], [`secrets`], [`snapshots`], [`templates`], [`desktop`]); what every handler takes
//! from a request — state, tenant, body, path, checks shared by resources — in [`request`]; the
//! conversions between the agent's and the manager's types and the API's, as `From`/`TryFrom`
//! impls, in [`convert`]; streamed answers in [`ndjson`]. A new operation is one handler in its resource's
//! module and one line in [`router`]; its errors are [`EngineError`]s.
//!
//! [`EngineError`]: sandbox_mcp_engine::error::EngineError

mod code;
mod convert;
mod desktop;
mod exec;
mod files;
mod jobs;
mod ndjson;
mod network;
mod previews;
pub mod request;
mod sandboxes;
mod secrets;
mod snapshots;
mod templates;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{delete, get, post};

pub use request::keys;
pub(crate) use request::{AppState, BODY_LIMIT, Keys};

/// Every route of the spec. The conformance test walks the spec and checks each one is here.
pub(crate) fn router(state: AppState) -> Router {
    let sandbox = "/v1/sandboxes/{sandbox_id}";
    let at = |suffix: &str| format!("{sandbox}{suffix}");
    Router::new()
        .route("/v1/health", get(sandboxes::health))
        .route(
            "/v1/templates",
            get(templates::list).post(templates::create),
        )
        .route(
            "/v1/templates/{name}",
            get(templates::get).delete(templates::delete),
        )
        .route(
            "/v1/templates/{name}/image",
            // An image is streamed to disk, never held in memory: no body limit here.
            axum::routing::put(templates::import).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(
            sandbox,
            get(sandboxes::get)
                .patch(sandboxes::update)
                .delete(sandboxes::kill),
        )
        .route(&at("/pause"), post(sandboxes::pause))
        .route(&at("/resume"), post(sandboxes::resume))
        .route(&at("/metrics"), get(sandboxes::metrics))
        .route(&at("/network/log"), get(network::log))
        .route(&at("/previews"), post(previews::create).get(previews::list))
        .route(&at("/previews/{port}"), delete(previews::delete))
        .route(
            &at("/snapshots"),
            post(snapshots::create).get(snapshots::list),
        )
        .route(&at("/snapshots/{snapshot_id}"), delete(snapshots::delete))
        .route(
            &at("/snapshots/{snapshot_id}/restore"),
            post(snapshots::restore),
        )
        .route("/v1/computers", post(desktop::create))
        .route(&at("/desktop/screenshot"), get(desktop::screenshot))
        .route(&at("/desktop/actions"), post(desktop::action))
        .route(&at("/desktop/stop"), post(desktop::stop))
        .route(&at("/fork"), post(snapshots::fork))
        .route(&at("/diff"), post(snapshots::diff))
        .route(&at("/merge"), post(snapshots::merge))
        .route(&at("/secrets"), post(secrets::attach))
        .route(&at("/secrets/{env}"), delete(secrets::detach))
        .route("/v1/secrets", get(secrets::list))
        .route(
            "/v1/secrets/{name}",
            axum::routing::put(secrets::set).delete(secrets::delete),
        )
        .route(&at("/exec"), post(exec::exec_command))
        .route(&at("/exec/stream"), post(exec::exec_command_stream))
        .route(&at("/code"), post(code::run_code))
        .route(&at("/code/stream"), post(code::run_code_stream))
        .route(
            &at("/contexts"),
            get(code::list_contexts).post(code::create_context),
        )
        .route(&at("/contexts/{context_id}"), delete(code::delete_context))
        .route(&at("/jobs/{job_id}"), get(jobs::get).delete(jobs::kill))
        .route(
            &at("/files"),
            get(files::read).put(files::write).delete(files::delete),
        )
        .route(&at("/files/list"), get(files::list))
        .route(&at("/files/move"), post(files::rename))
        .route(&at("/files/download"), get(files::download_dir))
        .fallback(request::no_route)
        .method_not_allowed_fallback(request::wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request::authenticate,
        ))
        .with_state(state)
}
