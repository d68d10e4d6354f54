//! The command line's grammar: the top-level parser, its subcommands and their arguments, from
//! which clap derives the parser and every `--help`. What each subcommand does is in a module of
//! its own beside this one; the engine's settings, which `serve` and `engine` share, are in
//! `args/engine.rs`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod engine;

pub(crate) use engine::{AutoOff, DriverArg, EgressArg, EngineArgs, EngineSettings, KubeArgs};

#[derive(Parser, Debug)]
#[command(
    name = "sandbox-mcp",
    version,
    about = "MCP server that gives AI agents isolated Linux sandboxes",
    long_about = "MCP server that gives AI agents isolated Linux sandboxes: create one, run commands in it, \
read and write its files, pause, resume and kill it.\n\n\
With no subcommand it serves MCP on stdin/stdout. Unless SANDBOX_MCP_URL is set, it runs the sandbox \
engine in-process (or shares the one another sandbox-mcp already runs on the same data dir).\n\n\
Add it to Claude Code with: claude mcp add sandbox -- sandbox-mcp",
    after_help = "Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=sandbox_mcp=debug) for more.",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Serve MCP on stdin/stdout (the default).
    Serve(ServeArgs),
    /// Run the sandbox engine (the control plane) alone, over HTTP.
    Engine(EngineArgs),
    /// Print the tools this server offers, for people.
    Tools(ToolsArgs),
    /// Manage the access keys of the HTTP transport (`serve --http`).
    Keys(KeysArgs),
    /// Manage secrets that sandboxes may use without seeing (values are read from stdin).
    Secrets(SecretsArgs),
    /// Manage templates (import an OCI image).
    Template(TemplateArgs),
    /// Run a stdio MCP server in a sandbox of its own, relaying MCP on stdin/stdout: prefix any
    /// client's server command with `sandbox-mcp run [FLAGS] --`. The server sees none of this
    /// machine's files or environment, only the network --allow-out opens, and stand-ins for
    /// --secret values. EOF, its exit or SIGTERM ends it and its sandbox.
    Run(RunArgs),
    /// Manage hosted MCP servers: `serve --http` serves each at /servers/NAME/mcp, one sandbox
    /// per MCP session.
    Servers(ServersArgs),
    /// Review and apply what a sandbox changed in a workspace (a host folder exposed with
    /// --workspace).
    Workspace(WorkspaceArgs),
    /// Manage the built-in OAuth server of `serve --http --oauth`: its clients and the grants
    /// people made to them.
    Oauth(OAuthCommandArgs),
}

#[derive(Args, Debug)]
pub(crate) struct OAuthCommandArgs {
    #[command(flatten)]
    pub(crate) data: DataDirArg,
    #[command(subcommand)]
    pub(crate) command: OAuthCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum OAuthCommand {
    /// Clients: those the operator added, and those that registered themselves.
    #[command(subcommand)]
    Clients(OAuthClients),
    /// Grants: a tenant's consent to a client, with the tokens it issued.
    #[command(subcommand)]
    Grants(OAuthGrants),
}

#[derive(Subcommand, Debug)]
pub(crate) enum OAuthClients {
    /// List the clients.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register a client for people to sign in with (prints its client_id, and its secret once).
    Add {
        /// The name the sign-in page shows.
        #[arg(long)]
        name: String,
        /// A redirect URI, matched exactly; repeatable.
        #[arg(long = "redirect-uri", required = true)]
        redirect_uris: Vec<String>,
        /// Give the client a secret (for a client that runs on a server, such as a web app's
        /// backend); without it the client is public and relies on PKCE alone.
        #[arg(long)]
        confidential: bool,
    },
    /// Revoke a client (by its client_id, or a metadata document's URL) and every grant it holds.
    Revoke { client_id: String },
}

#[derive(Subcommand, Debug)]
pub(crate) enum OAuthGrants {
    /// List the grants.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a grant: its tokens stop working at once.
    Revoke { id: String },
}

#[derive(Args, Debug)]
pub(crate) struct WorkspaceArgs {
    #[command(flatten)]
    pub(crate) control: ControlPlane,
    #[command(flatten)]
    pub(crate) engine: EngineSettings,
    #[command(subcommand)]
    pub(crate) command: WorkspaceCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum WorkspaceCommand {
    /// Print sandbox SANDBOX_ID's changes to workspace NAME as a git patch.
    Changes { sandbox_id: String, name: String },
    /// Write sandbox SANDBOX_ID's changes to workspace NAME into the folder: every file it
    /// changed gets the sandbox's version, every file it removed goes. Prints what changes first.
    Apply {
        sandbox_id: String,
        name: String,
        /// Print what would change and stop.
        #[arg(long)]
        dry_run: bool,
    },
}

/// The engine an operator command talks to: the one at `--url`, or the one that serves the data
/// dir (started for the command if none does).
#[derive(Args, Debug)]
pub(crate) struct ControlPlane {
    /// Control plane to use instead of the embedded engine, e.g. http://10.0.0.5:7070.
    #[arg(long, env = "SANDBOX_MCP_URL", global = true)]
    pub(crate) url: Option<String>,
    /// Bearer key sent to the control plane at SANDBOX_MCP_URL (an operator key: one not bound
    /// to a tenant).
    #[arg(
        long,
        env = "SANDBOX_MCP_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub(crate) api_key: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ServersArgs {
    #[command(flatten)]
    pub(crate) control: ControlPlane,
    #[command(flatten)]
    pub(crate) engine: EngineSettings,
    #[command(subcommand)]
    pub(crate) command: ServersCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ServersCommand {
    /// Register (or replace) server NAME: `servers add time -- uvx mcp-server-time`, or from
    /// source: `servers add mine --from ./my-server --install 'npm ci' --entrypoint 'node index.js'`.
    Add(Box<ServersAdd>),
    /// List the registered servers.
    List {
        /// Print the engine's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove server NAME (open sessions keep running until they end).
    Rm { name: String },
    /// Show server NAME's running sandboxes: their network log and the end of the server's stderr.
    Log { name: String },
}

#[derive(Args, Debug)]
pub(crate) struct ServersAdd {
    /// The server's name: lower-case letters, digits, `.`, `_` and `-`.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) server: ServerFlags,
    /// End a session idle this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub(crate) idle_timeout: u64,
    /// Keep this many sandboxes with the server started and initialized, for new sessions.
    #[arg(long, default_value_t = 0)]
    pub(crate) warm: u32,
    /// The server speaks Streamable HTTP itself on this port inside its sandbox: sessions are
    /// proxied to it instead of spoken to on stdio.
    #[arg(long, value_name = "PORT")]
    pub(crate) http_port: Option<u16>,
    /// With --http-port: the server's MCP path.
    #[arg(long, requires = "http_port", value_name = "PATH")]
    pub(crate) http_path: Option<String>,
    /// Install the server from source: a git URL, or a local directory.
    #[arg(long, value_name = "GIT_URL|DIR")]
    pub(crate) from: Option<String>,
    /// The git branch or tag (with a git URL).
    #[arg(long = "ref", requires = "from")]
    pub(crate) git_ref: Option<String>,
    /// The install command, run in the source's directory, e.g. `npm ci` or `pip install .`.
    #[arg(long, requires = "from")]
    pub(crate) install: Option<String>,
    /// How to start the installed server, run with `sh -c` in the source's directory, e.g.
    /// `node dist/index.js` (instead of a command after `--`).
    #[arg(long, requires = "from")]
    pub(crate) entrypoint: Option<String>,
    /// The server's command and arguments, run inside its sandbox.
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) server: ServerFlags,
    /// The server's name in the sandbox's labels (`sandbox-mcp.server`) and logs; from the
    /// command when omitted.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Control plane to use instead of the embedded engine, e.g. http://10.0.0.5:7070.
    #[arg(long, env = "SANDBOX_MCP_URL")]
    pub(crate) url: Option<String>,
    /// Bearer key sent to the control plane at SANDBOX_MCP_URL.
    #[arg(long, env = "SANDBOX_MCP_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    #[command(flatten)]
    pub(crate) engine: EngineSettings,
    /// The server's command and arguments, run inside the sandbox (looked up on its PATH).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<String>,
}

/// How a hosted server runs: its sandbox's template, network, secrets, environment and shape.
#[derive(Args, Debug, Clone)]
pub(crate) struct ServerFlags {
    /// Template of the server's sandbox (`base`, which shows this machine's /usr, when omitted).
    #[arg(long)]
    pub(crate) template: Option<String>,
    /// A domain (`api.github.com`, `*.github.com`) or CIDR the server may reach; repeat for more.
    /// Everything else is closed.
    #[arg(long = "allow-out", value_name = "PATTERN")]
    pub(crate) allow_out: Vec<String>,
    /// ENV=SECRET: the server's variable ENV holds a stand-in that the engine swaps for the
    /// secret's value on the wire to the secret's hosts (`sandbox-mcp secrets set`); repeatable.
    #[arg(long = "secret", value_name = "ENV=SECRET")]
    pub(crate) secrets: Vec<String>,
    /// K=V: an environment variable of the server; repeatable.
    #[arg(long = "env", value_name = "K=V")]
    pub(crate) env: Vec<String>,
    /// Resources, e.g. `memory_mb=512,vcpus=1` (also `disk_mb`, `max_pids`); the template's when
    /// omitted.
    #[arg(long, value_name = "K=V,…")]
    pub(crate) shape: Option<String>,
    /// Working directory of the server inside its sandbox.
    #[arg(long)]
    pub(crate) cwd: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct TemplateArgs {
    #[command(flatten)]
    pub(crate) data: DataDirArg,
    #[command(subcommand)]
    pub(crate) command: TemplateCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum TemplateCommand {
    /// Import an OCI image as template NAME: a `docker save` tarball, an OCI archive, or an
    /// OCI image layout directory (e.g. `docker save python:3.12-alpine > py.tar`). Goes
    /// through the engine that serves the data dir, or straight into the data dir when none does.
    Import {
        /// The template's name.
        name: String,
        /// The image archive or layout directory.
        image: PathBuf,
    },
}

#[derive(Args, Debug)]
pub(crate) struct SecretsArgs {
    #[command(flatten)]
    pub(crate) data: DataDirArg,
    #[command(subcommand)]
    pub(crate) command: SecretsCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum SecretsCommand {
    /// Create or replace a secret; its value is read from stdin (never an argument, never
    /// echoed), e.g. `printenv OPENAI_API_KEY | sandbox-mcp secrets set openai --host api.openai.com`.
    Set {
        /// Its name, which sandboxes bind it by.
        name: String,
        /// A host (or `*.domain`) its value may be sent to; repeat for more.
        #[arg(long = "host", required = true, value_name = "HOST")]
        hosts: Vec<String>,
        /// A request header its value may go in (default: Authorization); repeat for more. A
        /// stand-in in any other header is refused.
        #[arg(long = "header", value_name = "HEADER")]
        headers: Vec<String>,
        /// The header's whole value, `{value}` replaced (e.g. 'Bearer {value}'); default: the
        /// stand-in alone is replaced.
        #[arg(long)]
        format: Option<String>,
        /// The tenant it belongs to (as `keys create`); none: the untenanted engine's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// List secrets (never their values).
    List {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Delete a secret; sandboxes that bind it get a clear error on their next request.
    Rm {
        name: String,
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Args, Debug)]
pub(crate) struct KeysArgs {
    #[command(flatten)]
    pub(crate) data: DataDirArg,
    #[command(subcommand)]
    pub(crate) command: KeysCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum KeysCommand {
    /// Create a key for a tenant and print its token (shown once, never stored).
    Create {
        /// Tenant the key belongs to: it sees and touches only that tenant's sandboxes.
        #[arg(long)]
        tenant: String,
    },
    /// List keys (ids, tenants, state; never tokens).
    List,
    /// Revoke a key by id; a running server refuses it at once.
    Revoke {
        /// The key's id, as `keys list` shows it.
        id: String,
    },
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ServeArgs {
    /// Control plane to use instead of the embedded engine, e.g. http://10.0.0.5:7070.
    #[arg(long, env = "SANDBOX_MCP_URL")]
    pub(crate) url: Option<String>,
    /// Bearer key sent to the control plane at SANDBOX_MCP_URL. Never shown to the model or logged.
    #[arg(long, env = "SANDBOX_MCP_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Tools to offer: `all`, a toolset (`core`: create, exec, files read/write/list, kill), or a
    /// comma-separated list of tool names.
    #[arg(long, env = "SANDBOX_MCP_TOOLS", default_value = "all")]
    pub(crate) tools: String,
    /// Seconds a tool call may take before it fails with an actionable error. Calls with their own
    /// timeout (sandbox_exec's timeout_ms) get that plus 15 s.
    #[arg(long, env = "SANDBOX_MCP_TIMEOUT", default_value_t = 60)]
    pub(crate) request_timeout: u64,
    /// Give each MCP session its own sandbox, created on first use and killed when the session
    /// ends; tools then take no sandbox_id.
    #[arg(long, env = "SANDBOX_MCP_SESSION_SANDBOX")]
    pub(crate) session_sandbox: bool,
    /// Serve MCP over Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8080).
    #[arg(long, env = "SANDBOX_MCP_HTTP", value_name = "ADDR")]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// HTTP: serve without authentication (refused unless ADDR is loopback).
    #[arg(long)]
    pub(crate) dev: bool,
    /// HTTP: also accept this host name in Host and Origin headers (loopback names always are).
    #[arg(
        long = "allow-host",
        env = "SANDBOX_MCP_ALLOW_HOSTS",
        value_delimiter = ','
    )]
    pub(crate) allow_hosts: Vec<String>,
    /// HTTP: also accept this browser Origin (`https://app.example.com`).
    #[arg(
        long = "allow-origin",
        env = "SANDBOX_MCP_ALLOW_ORIGINS",
        value_delimiter = ','
    )]
    pub(crate) allow_origins: Vec<String>,
    /// HTTP: requests per second per tenant (bursts of twice that); 0 for no limit.
    #[arg(long, env = "SANDBOX_MCP_RATE_LIMIT", default_value_t = 100.0)]
    pub(crate) rate_limit: f64,
    /// HTTP: close a session (and kill its session sandbox) after this many idle seconds.
    #[arg(long, env = "SANDBOX_MCP_SESSION_IDLE", default_value_t = 1800)]
    pub(crate) session_idle_timeout: u64,
    /// Hosted servers (`sandbox-mcp servers add`) whose tools, prompts and resources join ours,
    /// namespaced `NAME__tool`: names separated by commas, or `all`. Each session gets its own
    /// instance of each.
    #[arg(
        long,
        env = "SANDBOX_MCP_MOUNT_SERVERS",
        value_delimiter = ',',
        value_name = "NAME,…|all"
    )]
    pub(crate) mount_servers: Vec<String>,
    #[command(flatten)]
    pub(crate) oauth: OAuthArgs,
    #[command(flatten)]
    pub(crate) engine: EngineSettings,
}

/// OAuth 2.1 on the HTTP transport, beside the access keys.
#[derive(Args, Debug, Clone)]
pub(crate) struct OAuthArgs {
    /// HTTP: also accept OAuth 2.1 tokens from the built-in authorization server, where people
    /// sign in with an access key (`keys create`): for clients that only speak OAuth (Claude.ai,
    /// Claude Desktop's connectors, ChatGPT).
    #[arg(long, env = "SANDBOX_MCP_OAUTH", requires = "http", conflicts_with_all = ["oauth_issuer", "dev"])]
    pub(crate) oauth: bool,
    /// HTTP: also accept JWT access tokens of this external identity provider (Keycloak, Auth0,
    /// Entra, Google…), checked against its published keys.
    #[arg(
        long,
        env = "SANDBOX_MCP_OAUTH_ISSUER",
        value_name = "URL",
        requires = "http",
        conflicts_with = "dev"
    )]
    pub(crate) oauth_issuer: Option<String>,
    /// With --oauth-issuer: also accept these `aud` values (the endpoint's URL always is).
    #[arg(
        long = "oauth-audience",
        env = "SANDBOX_MCP_OAUTH_AUDIENCES",
        value_delimiter = ',',
        requires = "oauth_issuer"
    )]
    pub(crate) oauth_audiences: Vec<String>,
    /// With --oauth-issuer: the claim that names the token's tenant.
    #[arg(long, env = "SANDBOX_MCP_OAUTH_TENANT_CLAIM", default_value = "sub")]
    pub(crate) oauth_tenant_claim: String,
    /// HTTP: the server's public URL (`https://mcp.example.com`) when clients reach it under
    /// another name or through a proxy that ends TLS: OAuth's URLs are made from it, and its host
    /// is accepted.
    #[arg(long, env = "SANDBOX_MCP_PUBLIC_URL", value_name = "URL")]
    pub(crate) public_url: Option<String>,
    /// Extra trust roots (PEM) for what OAuth fetches: client metadata documents, the issuer's
    /// keys.
    #[arg(long, env = "SANDBOX_MCP_OAUTH_CA_FILE", value_name = "FILE")]
    pub(crate) oauth_ca_file: Option<PathBuf>,
    /// With --oauth: a range (CIDR) client metadata documents may come from although it is
    /// private or special-purpose (they never may otherwise); repeatable.
    #[arg(
        long = "oauth-allow-net",
        env = "SANDBOX_MCP_OAUTH_ALLOW_NETS",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub(crate) oauth_allow_nets: Vec<String>,
    /// With --oauth: lifetime of access tokens in seconds (refresh tokens last 30 days and are
    /// rotated at each use).
    #[arg(long, env = "SANDBOX_MCP_OAUTH_TOKEN_TTL", default_value_t = 3600)]
    pub(crate) oauth_token_ttl: u64,
}

/// The data dir, shared by the engine and the key store.
#[derive(Args, Debug, Clone)]
pub(crate) struct DataDirArg {
    /// Where sandboxes, templates, state and keys live [default: $XDG_DATA_HOME/sandbox-mcp, or
    /// /var/lib/sandbox-mcp for root].
    #[arg(long, env = "SANDBOX_MCP_DATA_DIR")]
    pub(crate) data_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ToolsArgs {
    /// Tools to show: `all`, a toolset, or a comma-separated list of tool names.
    #[arg(long, env = "SANDBOX_MCP_TOOLS", default_value = "all")]
    pub(crate) tools: String,
    /// Print the tools/list JSON the model receives instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}
