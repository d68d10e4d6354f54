//! The engine's HTTP API: the [`EngineApi`] trait generated from `openapi/sandbox-mcp.json`,
//! implemented once, on [`AppState`], and served by the router generated with it. Request and
//! response bodies are the client's own types (so both sides validate the same constraints), and
//! every response is built as the generated type the client will parse.
//!
//! Where things are: the impl below delegates each operation to its handler, one module per
//! resource ([`sandboxes`], [`exec`], [`code`], [`jobs`], [`files`], [`network`], [`previews`],
//! [`secrets`], [`snapshots`], [`templates`], [`desktop`]); the state, keys, authentication and
//! checks shared by resources are in [`request`]; the conversions between the agent's and the
//! services' types and the API's, as `From`/`TryFrom` impls, in [`convert`]; streamed answers in
//! [`ndjson`]. The router extracts the caller, the checked sandbox id, the query and the body
//! before a handler runs. A new operation in the spec is a method this impl lacks until its
//! handler is written; its errors are [`EngineError`]s.

mod attach;
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
mod servers;
mod snapshots;
mod templates;
mod volumes;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::middleware;

use sandbox_mcp_api::server::{self, Caller, EngineApi, Ndjson, Rejection};
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;

pub use request::keys;
pub(crate) use request::{AppState, BODY_LIMIT, Keys};

/// Every operation of the spec (the generated router), behind the bearer-key check, with the
/// spec's `Error` for unknown routes and wrong methods and a body limit (uploads stream past it).
pub(crate) fn router(state: AppState) -> Router {
    server::router::<AppState>()
        .fallback(request::no_route)
        .method_not_allowed_fallback(request::wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request::authenticate,
        ))
        .layer(middleware::from_fn(
            sandbox_mcp_api::unread::close_if_unread,
        ))
        .with_state(state)
}

impl EngineApi for AppState {
    type Error = EngineError;

    fn rejected(rejection: Rejection) -> EngineError {
        request::rejected(rejection)
    }

    async fn health(&self) -> Result<types::Health, EngineError> {
        sandboxes::health(self).await
    }

    async fn list_templates(&self, caller: Caller) -> Result<types::TemplateList, EngineError> {
        templates::list(self, caller).await
    }

    async fn create_template(
        &self,
        caller: Caller,
        body: types::CreateTemplateRequest,
    ) -> Result<types::Template, EngineError> {
        templates::create(self, caller, body).await
    }

    async fn get_template(
        &self,
        caller: Caller,
        name: String,
    ) -> Result<types::Template, EngineError> {
        templates::get(self, caller, name).await
    }

    async fn delete_template(
        &self,
        caller: Caller,
        name: String,
    ) -> Result<types::DeleteTemplateResult, EngineError> {
        templates::delete(self, caller, name).await
    }

    async fn import_template(
        &self,
        caller: Caller,
        name: String,
        body: Body,
    ) -> Result<types::Template, EngineError> {
        templates::import(self, caller, name, body).await
    }

    async fn list_sandboxes(
        &self,
        caller: Caller,
        query: server::ListSandboxesQuery,
    ) -> Result<types::SandboxList, EngineError> {
        sandboxes::list(self, caller, query).await
    }

    async fn create_sandbox(
        &self,
        caller: Caller,
        body: types::CreateSandboxRequest,
    ) -> Result<types::Sandbox, EngineError> {
        sandboxes::create(self, caller, body).await
    }

    async fn get_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::Sandbox, EngineError> {
        sandboxes::get(self, caller, sandbox_id).await
    }

    async fn kill_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::KillResult, EngineError> {
        sandboxes::kill(self, caller, sandbox_id).await
    }

    async fn update_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::UpdateSandboxRequest,
    ) -> Result<types::Sandbox, EngineError> {
        sandboxes::update(self, caller, sandbox_id, body).await
    }

    async fn pause_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::PauseSandboxQuery,
    ) -> Result<types::Sandbox, EngineError> {
        sandboxes::pause(self, caller, sandbox_id, query.hibernate).await
    }

    async fn resume_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::Sandbox, EngineError> {
        sandboxes::resume(self, caller, sandbox_id).await
    }

    async fn get_sandbox_metrics(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::SandboxMetrics, EngineError> {
        sandboxes::metrics(self, caller, sandbox_id).await
    }

    async fn get_network_log(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::GetNetworkLogQuery,
    ) -> Result<types::NetworkLog, EngineError> {
        network::log(self, caller, sandbox_id, query).await
    }

    async fn exec_command(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::ExecRequest,
    ) -> Result<types::ExecResult, EngineError> {
        exec::exec_command(self, caller, sandbox_id, body).await
    }

    async fn exec_command_stream(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::ExecRequest,
    ) -> Result<Ndjson, EngineError> {
        exec::exec_command_stream(self, caller, sandbox_id, body).await
    }

    async fn run_code(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::RunCodeRequest,
    ) -> Result<types::RunCodeResult, EngineError> {
        code::run_code(self, caller, sandbox_id, body).await
    }

    async fn run_code_stream(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::RunCodeRequest,
    ) -> Result<Ndjson, EngineError> {
        code::run_code_stream(self, caller, sandbox_id, body).await
    }

    async fn list_code_contexts(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::CodeContextList, EngineError> {
        code::list_contexts(self, caller, sandbox_id).await
    }

    async fn create_code_context(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::CreateContextRequest,
    ) -> Result<types::CodeContext, EngineError> {
        code::create_context(self, caller, sandbox_id, body).await
    }

    async fn delete_code_context(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        context_id: String,
    ) -> Result<types::DeleteContextResult, EngineError> {
        code::delete_context(self, caller, sandbox_id, context_id).await
    }

    async fn get_job(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        job_id: String,
        query: server::GetJobQuery,
    ) -> Result<types::JobStatus, EngineError> {
        jobs::get(self, caller, sandbox_id, job_id, query).await
    }

    async fn list_servers(&self, caller: Caller) -> Result<types::ServerList, EngineError> {
        servers::list(self, caller).await
    }

    async fn put_server(
        &self,
        caller: Caller,
        name: String,
        body: types::ServerRequest,
    ) -> Result<types::Server, EngineError> {
        servers::put(self, caller, name, body).await
    }

    async fn get_server(&self, caller: Caller, name: String) -> Result<types::Server, EngineError> {
        servers::get(self, caller, name).await
    }

    async fn delete_server(
        &self,
        caller: Caller,
        name: String,
    ) -> Result<types::DeleteServerResult, EngineError> {
        servers::delete(self, caller, name).await
    }

    async fn attach_process(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        upgrade: server::WebSocketUpgrade,
    ) -> Result<axum::response::Response, EngineError> {
        attach::attach(self, caller, sandbox_id, upgrade).await
    }

    async fn kill_job(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        job_id: String,
    ) -> Result<types::JobStatus, EngineError> {
        jobs::kill(self, caller, sandbox_id, job_id).await
    }

    async fn read_file(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::ReadFileQuery,
    ) -> Result<types::FileContent, EngineError> {
        files::read(self, caller, sandbox_id, query).await
    }

    async fn write_file(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::WriteFileRequest,
    ) -> Result<types::WriteResult, EngineError> {
        files::write(self, caller, sandbox_id, body).await
    }

    async fn delete_file(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::DeleteFileQuery,
    ) -> Result<types::DeleteResult, EngineError> {
        files::delete(self, caller, sandbox_id, query).await
    }

    async fn list_files(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::ListFilesQuery,
    ) -> Result<types::FileList, EngineError> {
        files::list(self, caller, sandbox_id, query).await
    }

    async fn move_file(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::MoveFileRequest,
    ) -> Result<types::MoveResult, EngineError> {
        files::rename(self, caller, sandbox_id, body).await
    }

    async fn download_dir(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::DownloadDirQuery,
    ) -> Result<types::DirArchive, EngineError> {
        files::download_dir(self, caller, sandbox_id, query).await
    }

    async fn list_previews(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::PreviewList, EngineError> {
        previews::list(self, caller, sandbox_id).await
    }

    async fn create_preview(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::CreatePreviewRequest,
    ) -> Result<types::Preview, EngineError> {
        previews::create(self, caller, sandbox_id, body).await
    }

    async fn delete_preview(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        port: String,
    ) -> Result<types::DeletePreviewResult, EngineError> {
        previews::delete(self, caller, sandbox_id, port).await
    }

    async fn list_volumes(&self, caller: Caller) -> Result<types::VolumeList, EngineError> {
        volumes::list(self, caller).await
    }

    async fn create_volume(
        &self,
        caller: Caller,
        body: types::CreateVolumeRequest,
    ) -> Result<types::Volume, EngineError> {
        volumes::create(self, caller, body).await
    }

    async fn delete_volume(
        &self,
        caller: Caller,
        name: String,
    ) -> Result<types::DeleteVolumeResult, EngineError> {
        volumes::delete(self, caller, name).await
    }

    async fn workspace_changes(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        name: String,
    ) -> Result<types::WorkspaceChanges, EngineError> {
        volumes::changes(self, caller, sandbox_id, name).await
    }

    async fn apply_workspace(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        name: String,
    ) -> Result<types::ApplyWorkspaceResult, EngineError> {
        volumes::apply(self, caller, sandbox_id, name).await
    }

    async fn list_secrets(&self, caller: Caller) -> Result<types::SecretList, EngineError> {
        secrets::list(self, caller).await
    }

    async fn set_secret(
        &self,
        caller: Caller,
        name: String,
        body: types::SetSecretRequest,
    ) -> Result<types::Secret, EngineError> {
        secrets::set(self, caller, name, body).await
    }

    async fn delete_secret(
        &self,
        caller: Caller,
        name: String,
    ) -> Result<types::DeleteSecretResult, EngineError> {
        secrets::delete(self, caller, name).await
    }

    async fn attach_secret(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::AttachSecretRequest,
    ) -> Result<types::Sandbox, EngineError> {
        secrets::attach(self, caller, sandbox_id, body).await
    }

    async fn detach_secret(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        env: String,
    ) -> Result<types::Sandbox, EngineError> {
        secrets::detach(self, caller, sandbox_id, env).await
    }

    async fn list_snapshots(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
    ) -> Result<types::SnapshotList, EngineError> {
        snapshots::list(self, caller, sandbox_id).await
    }

    async fn create_snapshot(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::CreateSnapshotRequest,
    ) -> Result<types::Snapshot, EngineError> {
        snapshots::create(self, caller, sandbox_id, body).await
    }

    async fn delete_snapshot(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        snapshot_id: String,
    ) -> Result<types::DeleteSnapshotResult, EngineError> {
        snapshots::delete(self, caller, sandbox_id, snapshot_id).await
    }

    async fn restore_snapshot(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        snapshot_id: String,
    ) -> Result<types::RestoreResult, EngineError> {
        snapshots::restore(self, caller, sandbox_id, snapshot_id).await
    }

    async fn fork_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::ForkRequest,
    ) -> Result<types::ForkResult, EngineError> {
        snapshots::fork(self, caller, sandbox_id, body).await
    }

    async fn diff_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::DiffRequest,
    ) -> Result<types::DiffResult, EngineError> {
        snapshots::diff(self, caller, sandbox_id, body).await
    }

    async fn merge_sandbox(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::MergeRequest,
    ) -> Result<types::MergeResult, EngineError> {
        snapshots::merge(self, caller, sandbox_id, body).await
    }

    async fn create_computer(
        &self,
        caller: Caller,
        body: types::CreateComputerRequest,
    ) -> Result<types::Sandbox, EngineError> {
        desktop::create(self, caller, body).await
    }

    async fn take_screenshot(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        query: server::TakeScreenshotQuery,
    ) -> Result<types::Screenshot, EngineError> {
        desktop::screenshot(self, caller, sandbox_id, query).await
    }

    async fn computer_action(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::ComputerActionRequest,
    ) -> Result<types::ComputerActionResult, EngineError> {
        desktop::action(self, caller, sandbox_id, body).await
    }

    async fn stop_computer(
        &self,
        caller: Caller,
        sandbox_id: types::SandboxId,
        body: types::StopComputerRequest,
    ) -> Result<types::StopComputerResult, EngineError> {
        desktop::stop(self, caller, sandbox_id, body).await
    }
}
