//! The rmcp server handler: tools/list from the registry, tools/call through validation, the
//! generated dispatch and result shaping.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use crate::args::Args;
use crate::backend::Backend;
use crate::call::CallFailure;
pub(crate) use crate::progress::Progress;
use crate::session::{SessionSandbox, SessionSandboxes};
use crate::tooldefs::ToolDef;
use crate::{dispatch, progress, shape};

/// Protocol revisions this server speaks. 2025-06-18 is the oldest with structured tool output.
pub(crate) const PROTOCOL_VERSIONS: [ProtocolVersion; 3] = [
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

const INSTRUCTIONS: &str = "Isolated Linux sandboxes for running code. Call sandbox_create once and \
reuse its id for related work: sandbox_exec runs shell commands, the sandbox_files_* tools read and \
write files. Outbound network follows each sandbox's rules (set `network` on create or with \
sandbox_update; sandbox_network_log shows what was blocked and why). To show the user a server \
running in a sandbox, give them the URL from sandbox_preview_create. Call sandbox_kill when you \
are done.";

/// Settings for one MCP server instance.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Deadline for a call that has no timeout argument of its own.
    pub request_timeout: Duration,
    /// Extra time over a call's own timeout argument (e.g. an exec's `timeout_ms`).
    pub timeout_grace: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(60),
            timeout_grace: Duration::from_secs(15),
        }
    }
}

/// The tools a server offers: their definitions and the MCP tools the model sees.
pub struct Selected {
    pub defs: Vec<&'static ToolDef>,
    pub tools: Vec<Tool>,
}

/// The tools a server offers, possibly still being resolved: parsing the registry and building
/// the tools' schemas takes milliseconds that a server's start need not wait for (an `initialize`
/// needs none of it). Clones share the result, so every session of an HTTP server uses one copy.
#[derive(Clone)]
pub struct Selection(Arc<OnceLock<Result<Selected, String>>>);

impl Selection {
    /// Tools known now.
    pub fn ready(defs: Vec<&'static ToolDef>) -> Selection {
        let cell = OnceLock::new();
        let _ = cell.set(Ok(Self::build(defs)));
        Selection(Arc::new(cell))
    }

    /// Tools resolved by `resolve` on a thread of their own, from now on, at the lowest CPU
    /// priority: on a busy or small machine the server's start goes first, and whoever needs
    /// the tools (a `tools/list`) waits for them then.
    pub fn in_background(
        resolve: impl FnOnce() -> Result<Vec<&'static ToolDef>, String> + Send + 'static,
    ) -> Selection {
        let cell = Arc::new(OnceLock::new());
        let filled = cell.clone();
        let spawned = std::thread::Builder::new()
            .name("tools".into())
            .spawn(move || {
                // This thread only (a thread's nice value is its own on Linux).
                // SAFETY: setpriority with who=0 changes the calling thread and reads no memory.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, 0, 19);
                }
                let _ = filled.set(resolve().map(Self::build));
            });
        if let Err(e) = spawned {
            let _ = cell.set(Err(format!("cannot start a thread: {e}")));
        }
        Selection(cell)
    }

    fn build(defs: Vec<&'static ToolDef>) -> Selected {
        let tools = defs.iter().map(|d| to_mcp_tool(d)).collect();
        Selected { defs, tools }
    }

    /// The tools, once resolved (waits for them the first time), or why they cannot be.
    pub fn get(&self) -> Result<&Selected, &str> {
        self.0.wait().as_ref().map_err(String::as_str)
    }
}

impl From<Vec<&'static ToolDef>> for Selection {
    fn from(defs: Vec<&'static ToolDef>) -> Selection {
        Selection::ready(defs)
    }
}

#[derive(Clone)]
pub struct SandboxMcp {
    backend: Backend,
    selection: Selection,
    settings: ServerSettings,
    /// The session's sandbox, with the `session` profile.
    session: Option<Arc<SessionSandbox>>,
    /// Hosted servers mounted into this session (`--mount-servers`).
    mounts: Option<Arc<crate::hosted::mount::Mounted>>,
}

/// The tool profile a session-sandbox server serves (`tool-defs/80-profiles.toml`).
pub const SESSION_PROFILE: &str = "session";

/// One of the session profile's messages to the model (the build checks they exist).
fn session_message(key: &str) -> String {
    crate::tooldefs::registry()
        .profiles
        .get(SESSION_PROFILE)
        .and_then(|p| p.errors.get(key))
        .cloned()
        .unwrap_or_default()
}

/// What a call needs besides its arguments.
#[derive(Default)]
pub struct CallContext {
    pub ct: CancellationToken,
    pub progress: Option<Progress>,
    /// The tenant the HTTP transport authenticated (None on stdio and in --dev).
    pub tenant: Option<String>,
    /// The call came without an MCP session (a stateless 2026-07-28 request).
    pub stateless: bool,
}

/// The tenant and session of a `tools/call` on the HTTP transport, set by its middleware.
#[derive(Clone, Debug)]
pub(crate) struct RequestTenant(pub Option<String>);

/// The MCP tool as the model sees it: everything comes from the registry (the schemas are the
/// registry's own, shared).
pub fn to_mcp_tool(def: &ToolDef) -> Tool {
    let annotations = ToolAnnotations::new()
        .read_only(def.annotations.read_only)
        .destructive(def.annotations.destructive)
        .idempotent(def.annotations.idempotent)
        .open_world(def.annotations.open_world);
    Tool::new_with_raw(
        def.name.clone(),
        Some(Cow::Owned(def.description.clone())),
        def.input_schema.clone(),
    )
    .with_title(def.title.clone())
    .with_raw_output_schema(def.output_schema.clone())
    .with_annotations(annotations)
}

impl SandboxMcp {
    pub fn new(backend: Backend, defs: Vec<&'static ToolDef>, settings: ServerSettings) -> Self {
        Self::with_selection(backend, Selection::ready(defs), settings)
    }

    /// A server whose tools may still be resolving (see [`Selection`]).
    pub fn with_selection(
        backend: Backend,
        selection: Selection,
        settings: ServerSettings,
    ) -> Self {
        Self {
            backend,
            selection,
            settings,
            session: None,
            mounts: None,
        }
    }

    /// Mounts hosted servers into this session: their tools, prompts and resources join ours.
    pub fn with_mounts(mut self, mounts: crate::hosted::mount::Mounted) -> Self {
        self.mounts = Some(Arc::new(mounts));
        self
    }

    /// A server for one session of the `session` profile: its tools take no sandbox id, and
    /// the session's own sandbox is created on first use.
    pub fn with_session(mut self, sandboxes: SessionSandboxes) -> Self {
        self.session = Some(Arc::new(SessionSandbox::new(
            self.backend.clone(),
            sandboxes,
        )));
        self
    }

    /// Ends the session now: kills its sandbox, if it made one.
    pub async fn end_session(&self) {
        if let Some(s) = &self.session {
            s.end().await;
        }
        if let Some(m) = &self.mounts {
            m.end().await;
        }
    }

    /// The tools the model sees (none when they could not be resolved).
    pub fn tools(&self) -> &[Tool] {
        self.selection
            .get()
            .map(|s| s.tools.as_slice())
            .unwrap_or(&[])
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Runs one tool call to completion, cancellation or deadline. With a progress token, tools
    /// that have a streaming operation send their output as progress notifications as it comes.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        cx: CallContext,
    ) -> Result<CallToolResult, McpError> {
        let defs = self
            .selection
            .get()
            .map(|s| s.defs.as_slice())
            .unwrap_or(&[]);
        let Some(def) = defs.iter().find(|d| d.name == name).copied() else {
            return Err(shape::protocol_error(&CallFailure::unknown_tool(name)));
        };
        let mut args = match Args::prepare(def, arguments) {
            Ok(args) => args,
            Err(problems) => {
                let failure = CallFailure::InvalidArgs(problems.join("; "));
                return Ok(shape::failure_result(def, None, &failure));
            }
        };
        let tenant = cx.tenant.as_deref();
        if let (Some(arg), Some(session)) = (&def.session_arg, &self.session) {
            if cx.stateless {
                let failure = CallFailure::InvalidArgs(session_message("no_session"));
                return Ok(shape::failure_result(def, Some(&args), &failure));
            }
            match session.id(tenant).await {
                Ok(id) => args.set(arg, serde_json::Value::String(id)),
                Err(failure) => return Ok(shape::failure_result(def, Some(&args), &failure)),
            }
        }
        let session_sandbox = def
            .session_arg
            .as_deref()
            .filter(|_| self.session.is_some())
            .and_then(|arg| args.get(arg))
            .and_then(serde_json::Value::as_str)
            .map(String::from);
        let deadline = self.deadline(def, &args);
        let outcome = tokio::select! {
            biased;
            () = cx.ct.cancelled() => Err(CallFailure::Deadline("the call was cancelled".into())),
            r = tokio::time::timeout(deadline, self.dispatch_with_recovery(def, &args, cx.progress, tenant)) => match r {
                Ok(r) => r,
                Err(_) => Err(CallFailure::Deadline(format!("no answer within {} s", deadline.as_secs()))),
            },
        };
        match outcome {
            Ok(value) => Ok(shape::success_result(def, value)),
            Err(CallFailure::UnknownTool(n)) => {
                Err(shape::protocol_error(&CallFailure::UnknownTool(n)))
            }
            Err(CallFailure::Api { code, .. })
                if code == "not_found"
                    && let (Some(id), Some(session)) = (&session_sandbox, &self.session)
                    && session.forget_if_gone(id, tenant).await =>
            {
                Ok(CallToolResult::error(vec![
                    rmcp::model::ContentBlock::text(session_message("session_gone")),
                ]))
            }
            Err(failure) => {
                tracing::debug!(tool = name, ?failure, "tool call failed");
                Ok(shape::failure_result(def, Some(&args), &failure))
            }
        }
    }

    fn deadline(&self, def: &ToolDef, args: &Args) -> Duration {
        let own = def
            .timeout_arg_ms
            .as_deref()
            .and_then(|name| args.get(name))
            .and_then(serde_json::Value::as_u64)
            .map(|ms| Duration::from_millis(ms) + self.settings.timeout_grace);
        own.map_or(self.settings.request_timeout, |d| {
            d.max(self.settings.request_timeout)
        })
    }

    async fn dispatch_with_recovery(
        &self,
        def: &ToolDef,
        args: &Args,
        progress: Option<Progress>,
        tenant: Option<&str>,
    ) -> Result<serde_json::Value, CallFailure> {
        let handle = self.backend.client(tenant).await?;
        let (result, _) = self
            .backend
            .with_recovery(&handle, tenant, |client| {
                let progress = progress.clone();
                async move { self.dispatch_once(&client, def, args, progress).await }
            })
            .await;
        result
    }

    async fn dispatch_once(
        &self,
        client: &sandbox_mcp_api::Client,
        def: &ToolDef,
        args: &Args,
        progress: Option<Progress>,
    ) -> Result<serde_json::Value, CallFailure> {
        if let Some(progress) = progress
            && def.stream_operation.is_some()
            && let Some(events) = dispatch::dispatch_stream(client, &def.name, args).await?
        {
            return progress::relay(events, progress).await;
        }
        dispatch::dispatch(client, &def.name, args).await
    }
}

impl ServerHandler for SandboxMcp {
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.mounts.is_some() {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .build()
        } else {
            ServerCapabilities::builder().enable_tools().build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("sandbox-mcp", env!("CARGO_PKG_VERSION"))
                    .with_title("sandbox-mcp")
                    .with_description(env!("CARGO_PKG_DESCRIPTION")),
            )
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Owned(PROTOCOL_VERSIONS.to_vec())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = self.tools().to_vec();
        if let Some(mounts) = &self.mounts {
            mounts.seen(&context.peer);
            tools.extend(mounts.tools(tenant_of(&context).as_deref()).await);
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, McpError> {
        let Some(mounts) = &self.mounts else {
            return Ok(Default::default());
        };
        mounts.seen(&context.peer);
        let prompts = mounts.prompts(tenant_of(&context).as_deref()).await;
        Ok(rmcp::model::ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        let Some(mounts) = &self.mounts else {
            return Err(McpError::invalid_params("no prompts here", None));
        };
        mounts.seen(&context.peer);
        let arguments = request
            .arguments
            .map(|a| serde_json::Value::Object(a.into_iter().collect()));
        mounts
            .get_prompt(tenant_of(&context).as_deref(), &request.name, arguments)
            .await
            .map(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        let Some(mounts) = &self.mounts else {
            return Ok(Default::default());
        };
        mounts.seen(&context.peer);
        let resources = mounts.resources(tenant_of(&context).as_deref()).await;
        Ok(rmcp::model::ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        let Some(mounts) = &self.mounts else {
            return Err(McpError::resource_not_found("no resources here", None));
        };
        mounts.seen(&context.peer);
        mounts
            .read_resource(tenant_of(&context).as_deref(), &request.uri)
            .await
            .map(Into::into)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(mounts) = &self.mounts {
            mounts.seen(&context.peer);
            let meta = serde_json::to_value(&context.meta)
                .ok()
                .filter(|m| m.as_object().is_some_and(|o| !o.is_empty()));
            let arguments = request.arguments.clone().map(serde_json::Value::Object);
            let tenant = tenant_of(&context);
            if let Some(result) = mounts
                .call(tenant.as_deref(), &request.name, arguments, meta)
                .await
            {
                return result.map(CallToolResponse::from);
            }
        }
        let progress = context.meta.get_progress_token().map(|token| Progress {
            peer: context.peer.clone(),
            token,
        });
        let parts = context.extensions.get::<http::request::Parts>();
        let tenant = parts
            .and_then(|p| p.extensions.get::<RequestTenant>())
            .and_then(|t| t.0.clone());
        let stateless = parts.is_some_and(|p| !p.headers.contains_key("mcp-session-id"));
        let cx = CallContext {
            ct: context.ct,
            progress,
            tenant,
            stateless,
        };
        self.call(&request.name, request.arguments, cx)
            .await
            .map(CallToolResponse::from)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().iter().find(|t| t.name == name).cloned()
    }
}

/// The tenant an HTTP request came as (none over stdio).
fn tenant_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<RequestTenant>())
        .and_then(|t| t.0.clone())
}
