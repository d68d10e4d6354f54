//! Command line: `sandbox-mcp` (stdio MCP server, the default), `sandbox-mcp engine` (the control
//! plane alone), `sandbox-mcp tools` (the tool table) and `sandbox-mcp keys` (HTTP access keys).
//! Every setting also has an environment variable, so MCP client configs can set them without
//! arguments. Each subcommand takes only its own flags: `engine --http` is an error, not ignored,
//! and a serve flag before a subcommand is refused too (environment variables never conflict).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_model::config::{EngineConfig, default_data_dir};
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::{SandboxMcp, ServerSettings};
use sandbox_mcp_server::tooldefs::registry;

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
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
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
}

#[derive(Args, Debug)]
struct TemplateArgs {
    #[command(flatten)]
    data: DataDirArg,
    #[command(subcommand)]
    command: TemplateCommand,
}

#[derive(Subcommand, Debug)]
enum TemplateCommand {
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
struct SecretsArgs {
    #[command(flatten)]
    data: DataDirArg,
    #[command(subcommand)]
    command: SecretsCommand,
}

#[derive(Subcommand, Debug)]
enum SecretsCommand {
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
struct KeysArgs {
    #[command(flatten)]
    data: DataDirArg,
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Subcommand, Debug)]
enum KeysCommand {
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
struct ServeArgs {
    /// Control plane to use instead of the embedded engine, e.g. http://10.0.0.5:7070.
    #[arg(long, env = "SANDBOX_MCP_URL")]
    url: Option<String>,
    /// Bearer key sent to the control plane at SANDBOX_MCP_URL. Never shown to the model or logged.
    #[arg(long, env = "SANDBOX_MCP_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Tools to offer: `all`, a toolset (`core`: create, exec, files read/write/list, kill), or a
    /// comma-separated list of tool names.
    #[arg(long, env = "SANDBOX_MCP_TOOLS", default_value = "all")]
    tools: String,
    /// Seconds a tool call may take before it fails with an actionable error. Calls with their own
    /// timeout (sandbox_exec's timeout_ms) get that plus 15 s.
    #[arg(long, env = "SANDBOX_MCP_TIMEOUT", default_value_t = 60)]
    request_timeout: u64,
    /// Give each MCP session its own sandbox, created on first use and killed when the session
    /// ends; tools then take no sandbox_id.
    #[arg(long, env = "SANDBOX_MCP_SESSION_SANDBOX")]
    session_sandbox: bool,
    /// Serve MCP over Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8080).
    #[arg(long, env = "SANDBOX_MCP_HTTP", value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// HTTP: serve without authentication (refused unless ADDR is loopback).
    #[arg(long)]
    dev: bool,
    /// HTTP: also accept this host name in Host and Origin headers (loopback names always are).
    #[arg(
        long = "allow-host",
        env = "SANDBOX_MCP_ALLOW_HOSTS",
        value_delimiter = ','
    )]
    allow_hosts: Vec<String>,
    /// HTTP: also accept this browser Origin (`https://app.example.com`).
    #[arg(
        long = "allow-origin",
        env = "SANDBOX_MCP_ALLOW_ORIGINS",
        value_delimiter = ','
    )]
    allow_origins: Vec<String>,
    /// HTTP: requests per second per tenant (bursts of twice that); 0 for no limit.
    #[arg(long, env = "SANDBOX_MCP_RATE_LIMIT", default_value_t = 100.0)]
    rate_limit: f64,
    /// HTTP: close a session (and kill its session sandbox) after this many idle seconds.
    #[arg(long, env = "SANDBOX_MCP_SESSION_IDLE", default_value_t = 1800)]
    session_idle_timeout: u64,
    #[command(flatten)]
    engine: EngineSettings,
}

/// The data dir, shared by the engine and the key store.
#[derive(Args, Debug, Clone)]
struct DataDirArg {
    /// Where sandboxes, templates, state and keys live [default: $XDG_DATA_HOME/sandbox-mcp, or
    /// /var/lib/sandbox-mcp for root].
    #[arg(long, env = "SANDBOX_MCP_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

impl DataDirArg {
    fn path(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }
}

/// Settings of the embedded or standalone engine.
#[derive(Args, Debug, Clone)]
struct EngineSettings {
    #[command(flatten)]
    data: DataDirArg,
    /// Most sandboxes that may exist at once.
    #[arg(long, env = "SANDBOX_MCP_MAX_SANDBOXES", default_value_t = 100)]
    max_sandboxes: usize,
    /// Pause a sandbox after this many seconds without exec or file operations (0: never).
    #[arg(long, env = "SANDBOX_MCP_IDLE_PAUSE", default_value_t = 900)]
    idle_pause: u64,
    /// Cap each sandbox's disk use at its template's size (`auto`: when running as root with
    /// btrfs available, via a loop-mounted btrfs store; `off`: plain directories, use only
    /// reported).
    #[arg(
        long,
        env = "SANDBOX_MCP_DISK_LIMITS",
        value_enum,
        default_value = "auto"
    )]
    disk_limits: AutoOff,
    /// `auto`: as root, turn on the kernel's `favordynmods` option of the host's cgroup2 mount
    /// (a remount keeping its other options), so a sandbox's start does not wait for an RCU
    /// grace period to join its cgroups (5-9 ms); the kernel's price is slightly dearer forks
    /// and exits host-wide. `off`: leave the host's cgroup mounts as they are.
    #[arg(
        long,
        env = "SANDBOX_MCP_FAVORDYNMODS",
        value_enum,
        default_value = "auto"
    )]
    favordynmods: AutoOff,
    /// What sandboxes may reach when their own rules do not say: `open` (the public internet)
    /// or `closed` (only what a sandbox's `allow_out` names). The host, loopback, link-local
    /// and private ranges are closed either way.
    #[arg(long, env = "SANDBOX_MCP_EGRESS", value_enum, default_value = "open")]
    egress: EgressArg,
    /// A range sandboxes may reach although the engine forbids it by default (a private
    /// network, a documentation range), as a CIDR; repeat or separate with commas.
    #[arg(
        long = "egress-allow",
        env = "SANDBOX_MCP_EGRESS_ALLOW",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = sandbox_mcp_network::parse_egress_allow
    )]
    egress_allow: Vec<String>,
    /// A resolver the engine asks for sandboxes, as IP or IP:PORT; repeat or separate with
    /// commas [default: the host's, from /etc/resolv.conf].
    #[arg(
        long = "dns-upstream",
        env = "SANDBOX_MCP_DNS_UPSTREAM",
        value_name = "IP[:PORT]",
        value_delimiter = ',',
        value_parser = sandbox_mcp_network::parse_dns_upstream
    )]
    dns_upstream: Vec<std::net::SocketAddr>,
    /// Outbound connections one sandbox may hold open at once; beyond it, new ones are reset
    /// and logged as blocked.
    #[arg(long, env = "SANDBOX_MCP_MAX_CONNECTIONS", default_value_t = sandbox_mcp_network::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// A CA certificate (PEM file) trusted, beside the system's roots, for hosts whose requests
    /// get a secret swapped in (a private API behind an internal CA); repeat for more.
    #[arg(
        long = "egress-ca",
        env = "SANDBOX_MCP_EGRESS_CA",
        value_name = "FILE",
        value_delimiter = ','
    )]
    egress_ca: Vec<PathBuf>,
    /// Where sandbox ports are served as preview URLs, or `off`. When the default address is
    /// taken (another engine), a free port is used; the URLs the engine hands out carry it.
    #[arg(
        long = "preview-listen",
        env = "SANDBOX_MCP_PREVIEW_LISTEN",
        value_name = "ADDR|off",
        value_parser = |s: &str| sandbox_mcp_engine_http::preview::parse_listen(s).map(PreviewListen)
    )]
    preview_listen: Option<PreviewListen>,
    /// The domain of preview host names, `{port}-{sandbox id}.{domain}`: `localhost` needs no
    /// DNS on the same machine; elsewhere, a wildcard DNS name pointing at the engine.
    #[arg(
        long = "preview-domain",
        env = "SANDBOX_MCP_PREVIEW_DOMAIN",
        value_name = "DOMAIN",
        default_value = "localhost",
        value_parser = sandbox_mcp_engine_http::preview::parse_domain
    )]
    preview_domain: String,
    /// The template sandboxes start from when a request names none (it must exist and be
    /// ready when the engine starts).
    #[arg(long = "default-template", env = "SANDBOX_MCP_DEFAULT_TEMPLATE", value_name = "NAME",
          value_parser = |s: &str| sandbox_mcp_storage::templates::check_name(s).map(|()| s.to_string()))]
    default_template: Option<String>,
}

/// `--preview-listen`: an address, or `None` for `off`.
#[derive(Debug, Clone)]
struct PreviewListen(Option<std::net::SocketAddr>);

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum EgressArg {
    Open,
    Closed,
}

/// `auto` or `off`, for settings the engine applies when the host allows.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum AutoOff {
    Auto,
    Off,
}

#[derive(Args, Debug)]
struct EngineArgs {
    #[command(flatten)]
    settings: EngineSettings,
    /// Address to listen on.
    #[arg(long, env = "SANDBOX_MCP_LISTEN", default_value = "127.0.0.1:7070")]
    listen: String,
    /// Comma-separated bearer keys accepted by the engine.
    #[arg(long, env = "SANDBOX_MCP_ENGINE_KEYS", hide_env_values = true)]
    keys: Option<String>,
    /// File with one accepted key per line (`#` comments allowed); re-read when it changes.
    #[arg(long, env = "SANDBOX_MCP_ENGINE_KEYS_FILE")]
    keys_file: Option<PathBuf>,
    #[command(flatten)]
    kubernetes: KubeArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum DriverArg {
    /// Linux namespaces on this machine.
    Namespaces,
    /// Pods in a Kubernetes cluster (credentials from KUBECONFIG or the pod's service account).
    Kubernetes,
}

#[derive(Args, Debug)]
struct KubeArgs {
    /// Where sandboxes run: `namespaces` (this machine) or `kubernetes` (pods in a cluster).
    #[arg(
        long,
        env = "SANDBOX_MCP_DRIVER",
        value_enum,
        default_value = "namespaces"
    )]
    driver: DriverArg,
    /// kubernetes: the namespace sandbox pods are made in.
    #[arg(long, env = "SANDBOX_MCP_K8S_NAMESPACE", default_value = "default")]
    namespace: String,
    /// kubernetes: an image holding the static sandbox-mcp binary at /sandbox-mcp (each pod's
    /// init container copies it in, so any template image works).
    #[arg(long, env = "SANDBOX_MCP_AGENT_IMAGE")]
    agent_image: Option<String>,
    /// kubernetes: the image of the `base` template.
    #[arg(long, env = "SANDBOX_MCP_DEFAULT_IMAGE")]
    default_image: Option<String>,
    /// kubernetes: another template, as NAME=IMAGE (repeat, or comma-separate).
    #[arg(long, env = "SANDBOX_MCP_TEMPLATE_IMAGES", value_delimiter = ',')]
    template_image: Vec<String>,
    /// kubernetes: a runtimeClassName (gVisor, Kata) for a template, as TEMPLATE=CLASS; `*=CLASS`
    /// for every template (repeat, or comma-separate).
    #[arg(long, env = "SANDBOX_MCP_RUNTIME_CLASSES", value_delimiter = ',')]
    runtime_class: Vec<String>,
    /// kubernetes: run sandboxes as this uid and gid (non-root when not 0) [default: the image's
    /// user].
    #[arg(long, env = "SANDBOX_MCP_RUN_AS_USER")]
    run_as_user: Option<u32>,
    /// kubernetes: imagePullPolicy of sandbox pods (`Always`, `IfNotPresent`, `Never`).
    #[arg(long, env = "SANDBOX_MCP_IMAGE_PULL_POLICY")]
    image_pull_policy: Option<String>,
    /// kubernetes: pods request 1/RATIO of their shape's CPU (still limited to all of it), so
    /// RATIO times more sandboxes fit a node's cores; 1 keeps requests equal to limits.
    #[arg(long, env = "SANDBOX_MCP_CPU_OVERCOMMIT", default_value_t = 1.0)]
    cpu_overcommit: f64,
}

impl KubeArgs {
    /// The kubernetes driver's options, or `None` for the namespaces driver.
    fn options(&self) -> anyhow::Result<Option<sandbox_mcp_kube::pod::PodOptions>> {
        if self.driver != DriverArg::Kubernetes {
            return Ok(None);
        }
        let need = |v: &Option<String>, flag: &str| {
            v.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
                anyhow::anyhow!("--driver kubernetes needs {flag} IMAGE (see README, Kubernetes)")
            })
        };
        let pairs = |items: &[String],
                     flag: &str|
         -> anyhow::Result<std::collections::BTreeMap<String, String>> {
            items
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| match s.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                        Ok((k.trim().to_string(), v.trim().to_string()))
                    }
                    _ => anyhow::bail!("{flag} takes NAME=VALUE, not {s:?}"),
                })
                .collect()
        };
        let images = pairs(&self.template_image, "--template-image")?;
        for name in images.keys() {
            sandbox_mcp_storage::templates::check_name(name)
                .map_err(|e| anyhow::anyhow!("--template-image {name}: {e}"))?;
        }
        if let Some(p) = &self.image_pull_policy
            && !["Always", "IfNotPresent", "Never"].contains(&p.as_str())
        {
            anyhow::bail!("--image-pull-policy is Always, IfNotPresent or Never, not {p:?}");
        }
        if !(1.0..=100.0).contains(&self.cpu_overcommit) {
            anyhow::bail!(
                "--cpu-overcommit is a ratio from 1 (requests equal limits) to 100, not {}",
                self.cpu_overcommit
            );
        }
        Ok(Some(sandbox_mcp_kube::pod::PodOptions {
            namespace: self.namespace.clone(),
            agent_image: need(&self.agent_image, "--agent-image")?,
            default_image: need(&self.default_image, "--default-image")?,
            images,
            runtime_classes: pairs(&self.runtime_class, "--runtime-class")?,
            run_as_user: self.run_as_user,
            pull_policy: self.image_pull_policy.clone(),
            cpu_overcommit: self.cpu_overcommit,
        }))
    }
}

#[derive(Args, Debug)]
struct ToolsArgs {
    /// Tools to show: `all`, a toolset, or a comma-separated list of tool names.
    #[arg(long, env = "SANDBOX_MCP_TOOLS", default_value = "all")]
    tools: String,
    /// Print the tools/list JSON the model receives instead of a table.
    #[arg(long)]
    json: bool,
}

impl EngineSettings {
    fn config(&self) -> EngineConfig {
        let mut config = EngineConfig::new(self.data.path());
        config.max_sandboxes = self.max_sandboxes;
        config.idle_pause = (self.idle_pause > 0).then(|| Duration::from_secs(self.idle_pause));
        config.disk_limits = match self.disk_limits {
            AutoOff::Auto => sandbox_mcp_model::config::DiskLimits::Auto,
            AutoOff::Off => sandbox_mcp_model::config::DiskLimits::Off,
        };
        config.favordynmods = matches!(self.favordynmods, AutoOff::Auto);
        config.network = sandbox_mcp_network::NetworkConfig {
            egress: match self.egress {
                EgressArg::Open => sandbox_mcp_network::EgressDefault::Open,
                EgressArg::Closed => sandbox_mcp_network::EgressDefault::Closed,
            },
            egress_allow: self.egress_allow.clone(),
            dns_upstream: self.dns_upstream.clone(),
            max_connections: self.max_connections.max(1),
            egress_ca: self.egress_ca.clone(),
        };
        let default = sandbox_mcp_model::config::PreviewConfig::default();
        config.preview = sandbox_mcp_model::config::PreviewConfig {
            // An address given explicitly is the operator's choice: taken means fail, not move.
            fallback: self.preview_listen.is_none(),
            listen: self.preview_listen.clone().map_or(default.listen, |l| l.0),
            domain: self.preview_domain.clone(),
        };
        config.default_template = self.default_template.clone();
        config
    }
}

fn init_logging(default: &str) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    // `Targets` takes RUST_LOG's `level` and `target=level,…` forms, which is all we document;
    // EnvFilter's span and field filters would link a regex engine into every sandbox's agent.
    let default: Targets = default.parse().unwrap_or_default();
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec.parse().unwrap_or_else(|e| {
            eprintln!(
                "sandbox-mcp: RUST_LOG={spec:?} ignored ({e}); use a level or target=level,…"
            );
            default
        }),
        _ => default,
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .with(filter)
        .try_init();
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox-mcp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        None => runtime.block_on(serve(cli.serve)),
        Some(Command::Serve(args)) => runtime.block_on(serve(args)),
        Some(Command::Engine(args)) => runtime.block_on(engine(args)),
        Some(Command::Tools(args)) => tools(&args.tools, args.json),
        Some(Command::Keys(args)) => keys(&args.data, args.command),
        Some(Command::Secrets(args)) => secrets(&args.data, args.command),
        Some(Command::Template(args)) => runtime.block_on(template(&args.data, args.command)),
    };
    // Sandboxes and sockets are shut down already; don't wait for idle blocking threads.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-mcp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging("warn,rmcp::service=error");
    let profile = args
        .session_sandbox
        .then_some(sandbox_mcp_server::server::SESSION_PROFILE);
    let selection = registry()
        .select_in(profile, &args.tools)
        .map_err(anyhow::Error::msg)?;
    let backend = match &args.url {
        Some(url) => Backend::remote(url, args.api_key.clone().map(ApiKey::new))
            .map_err(anyhow::Error::msg)?,
        None => Backend::local(std::sync::Arc::new(crate::local_engine::Embedded::new(
            args.engine.config(),
        ))),
    };
    tracing::debug!(
        control_plane = args.url.as_deref().unwrap_or("the local engine"),
        tools = selection.len(),
        "serving MCP"
    );
    let settings = ServerSettings {
        request_timeout: Duration::from_secs(args.request_timeout.max(1)),
        ..ServerSettings::default()
    };
    let outcome = match args.http {
        Some(listen) => serve_http(&args, listen, backend.clone(), selection, settings).await,
        None => serve_stdio(&args, backend.clone(), selection, settings).await,
    };
    backend.shutdown().await;
    outcome
}

async fn serve_stdio(
    args: &ServeArgs,
    backend: Backend,
    selection: Vec<&'static sandbox_mcp_server::tooldefs::ToolDef>,
    settings: ServerSettings,
) -> anyhow::Result<()> {
    let mut server = SandboxMcp::new(backend, selection, settings);
    if args.session_sandbox {
        server = server.with_session(sandbox_mcp_server::session::SessionSandboxes::default());
    }
    let session = server.clone();
    let io = sandbox_mcp_server::stdio::frame(
        tokio::io::stdin(),
        tokio::io::stdout(),
        |input, output| async move {
            use rmcp::ServiceExt;
            let running = server.serve((input, output)).await?;
            running.waiting().await?;
            Ok(())
        },
    );
    let outcome = tokio::select! {
        r = io => r,
        () = terminated() => Ok(()),
    };
    // stdin EOF or SIGTERM ends the (only) session.
    session.end_session().await;
    outcome
}

async fn serve_http(
    args: &ServeArgs,
    listen: std::net::SocketAddr,
    backend: Backend,
    selection: Vec<&'static sandbox_mcp_server::tooldefs::ToolDef>,
    settings: ServerSettings,
) -> anyhow::Result<()> {
    use sandbox_mcp_server::http::{HttpOptions, HttpServer};
    let config = args.engine.config();
    let keys = std::sync::Arc::new(sandbox_mcp_server::keys::KeyStore::open(&config.data_dir));
    if !args.dev
        && keys
            .list()
            .map(|k| k.iter().all(|k| k.revoked_at.is_some()))
            .unwrap_or(true)
    {
        tracing::warn!(
            "no access keys yet: every request will get 401. Create one with `sandbox-mcp keys create --tenant NAME` (it works without a restart)"
        );
    }
    let opts = HttpOptions {
        listen,
        dev: args.dev,
        allowed_hosts: args.allow_hosts.clone(),
        allowed_origins: args.allow_origins.clone(),
        rate_limit: args.rate_limit,
        session_idle: Duration::from_secs(args.session_idle_timeout.max(1)),
        session_sandbox: args.session_sandbox,
    };
    let server = HttpServer::start(opts, backend, Some(keys), selection, settings).await?;
    eprintln!("sandbox-mcp: serving MCP on http://{}/mcp", server.addr);
    terminated().await;
    tracing::info!("shutting down: finishing in-flight calls");
    server.shutdown(Duration::from_secs(30)).await;
    Ok(())
}

#[allow(clippy::print_stdout)] // the summary line is the command's output
async fn template(data: &DataDirArg, cmd: TemplateCommand) -> anyhow::Result<()> {
    use sandbox_mcp_engine_http::local;
    let TemplateCommand::Import { name, image } = cmd;
    sandbox_mcp_storage::templates::check_name(&name).map_err(anyhow::Error::msg)?;
    if !image.exists() {
        anyhow::bail!("{}: no such file or directory", image.display());
    }
    let config = EngineConfig::new(data.path());
    local::prepare_data_dir(&config)?;
    let lock = local::try_lock(&config)?;
    let started = std::time::Instant::now();
    let (size, status) = match lock {
        // No engine serves the data dir: import into it directly, holding its lock (nothing
        // else of an engine is started).
        Some(_lock) => {
            let (tdir, ldir) = (
                config.templates_dir(),
                sandbox_mcp_sys::layers::dir(&config.data_dir),
            );
            let templates = sandbox_mcp_storage::templates::load(&tdir, &ldir)?;
            // The egress CA the image's trust store gets (made here if no engine ran yet).
            sandbox_mcp_network::intercept::Interceptor::open(&config.data_dir, &[])?;
            let existing: Vec<_> = templates.iter().collect();
            let file =
                sandbox_mcp_engine::services::import(&config, &existing, None, &name, &image)?;
            sandbox_mcp_storage::templates::save(&tdir, &file)?;
            (file.size_bytes, "ready".to_string())
        }
        None => {
            let endpoint = local::endpoint(&config).ok_or_else(|| {
                anyhow::anyhow!(
                    "an engine holds {} but published no address; retry in a moment",
                    config.data_dir.display()
                )
            })?;
            let (archive, _tmp) = if image.is_dir() {
                // The API takes one archive: pack the layout directory first.
                let tmp = tempfile_in(&config.data_dir)?;
                let mut builder = tar::Builder::new(std::fs::File::create(&tmp.0)?);
                builder.append_dir_all(".", &image)?;
                builder.into_inner()?;
                (tmp.0.clone(), Some(tmp))
            } else {
                (image.clone(), None)
            };
            let file = tokio::fs::File::open(&archive).await?;
            let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
            let response = sandbox_mcp_api::http_builder()
                .no_proxy()
                .build()?
                .put(format!("{}/v1/templates/{name}/image", endpoint.url))
                .bearer_auth(&endpoint.key)
                .body(body)
                .send()
                .await?;
            let status = response.status();
            let json: serde_json::Value = response.json().await.unwrap_or_default();
            if !status.is_success() {
                anyhow::bail!(
                    "{}",
                    json["message"]
                        .as_str()
                        .unwrap_or("the engine refused the image")
                );
            }
            (
                json["size_bytes"].as_u64().unwrap_or(0),
                json["status"].as_str().unwrap_or("").to_string(),
            )
        }
    };
    println!(
        "template {name}: {status}, {} MB of files, imported in {:.1} s",
        size.div_ceil(1 << 20),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A scratch file in the data dir, deleted when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn tempfile_in(dir: &std::path::Path) -> std::io::Result<TempFile> {
    Ok(TempFile(dir.join(format!(
        ".image-{}.tar",
        sandbox_mcp_model::ids::nonce()
    ))))
}

#[allow(clippy::print_stdout)] // the listing is the command's output
fn secrets(data: &DataDirArg, cmd: SecretsCommand) -> anyhow::Result<()> {
    use sandbox_mcp_network::secrets::{NewSecret, SecretStore, Value};
    let config = EngineConfig::new(data.path());
    sandbox_mcp_engine_http::local::prepare_data_dir(&config)?;
    let store = SecretStore::open(&config.state_db(), &config.data_dir.join("secrets.key"))?;
    match cmd {
        SecretsCommand::Set {
            name,
            hosts,
            headers,
            format,
            tenant,
        } => {
            use std::io::Read;
            let mut raw = Vec::new();
            std::io::stdin()
                .take(sandbox_mcp_network::secrets::MAX_VALUE as u64 + 2)
                .read_to_end(&mut raw)?;
            // One trailing newline is what `echo` and `printenv` add, not part of the value.
            if raw.ends_with(b"\n") {
                raw.pop();
                if raw.ends_with(b"\r") {
                    raw.pop();
                }
            }
            let value = Value::from(
                String::from_utf8(raw)
                    .map_err(|_| anyhow::anyhow!("the value on stdin is not UTF-8 text"))?,
            );
            let new = NewSecret {
                name,
                hosts,
                headers,
                format,
            };
            let meta = store.set(tenant.as_deref(), &new, value.as_bytes())?;
            eprintln!(
                "set {} (hosts: {}; header: {}); bind it with sandbox_attach_secret or sandbox_create's `secrets`",
                meta.name,
                meta.hosts.join(", "),
                meta.headers.join(", ")
            );
        }
        SecretsCommand::List { tenant } => {
            println!("{:<24} {:<40} {:<16} UPDATED", "NAME", "HOSTS", "HEADER");
            for m in store.list(tenant.as_deref())? {
                println!(
                    "{:<24} {:<40} {:<16} {}",
                    m.name,
                    m.hosts.join(","),
                    m.headers.join(","),
                    sandbox_mcp_model::ids::time(m.updated_at).to_rfc3339()
                );
            }
        }
        SecretsCommand::Rm { name, tenant } => {
            if store.remove(tenant.as_deref(), &name)? {
                eprintln!("removed {name}");
            } else {
                anyhow::bail!("no secret named {name}");
            }
        }
    }
    Ok(())
}

#[allow(clippy::print_stdout)] // the token is the command's output, alone on stdout
fn keys(data: &DataDirArg, cmd: KeysCommand) -> anyhow::Result<()> {
    let data_dir = data.path();
    std::fs::create_dir_all(&data_dir)?;
    let store = sandbox_mcp_server::keys::KeyStore::open(&data_dir);
    match cmd {
        KeysCommand::Create { tenant } => {
            let (record, token) = store.create(&tenant)?;
            eprintln!(
                "created {} for tenant {}; the token below is shown only once",
                record.id, record.tenant
            );
            println!("{token}");
        }
        KeysCommand::List => {
            println!("{:<14} {:<24} {:<22} STATE", "ID", "TENANT", "CREATED");
            for k in store.list()? {
                let state = k
                    .revoked_at
                    .as_deref()
                    .map_or("active".to_string(), |t| format!("revoked {t}"));
                println!("{:<14} {:<24} {:<22} {state}", k.id, k.tenant, k.created_at);
            }
        }
        KeysCommand::Revoke { id } => {
            let record = store.revoke(&id)?;
            eprintln!("revoked {} (tenant {})", record.id, record.tenant);
        }
    }
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn engine(args: EngineArgs) -> anyhow::Result<()> {
    use sandbox_mcp_engine_http::local;
    init_logging("info");
    let mut config = args.settings.config();
    config.kubernetes = args.kubernetes.options()?;
    if config.kubernetes.is_some() {
        // Pods cannot be paused (see the driver): idle sandboxes keep running until their
        // timeout or a kill, rather than failing a pause on every tick.
        config.idle_pause = None;
    }
    let keys: Vec<String> = args
        .keys
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    if keys.is_empty() && args.keys_file.is_none() {
        anyhow::bail!(
            "no keys: set SANDBOX_MCP_ENGINE_KEYS (comma-separated) or --keys-file, so that only clients with a key can create sandboxes"
        );
    }
    if let Some(file) = &args.keys_file
        && !file.is_file()
    {
        anyhow::bail!("keys file {} does not exist", file.display());
    }
    local::prepare_data_dir(&config)?;
    let Some(lock) = local::try_lock(&config)? else {
        let owner = match local::endpoint(&config) {
            Some(endpoint) => format!(" at {}, process {}", endpoint.url, endpoint.pid),
            None => String::new(),
        };
        anyhow::bail!(
            "another engine already serves {}{owner}; stop it first or use another SANDBOX_MCP_DATA_DIR",
            config.data_dir.display(),
        );
    };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    // `serve` adds a key only local MCP servers know (from engine.json), so they can share it.
    let driver = crate::wiring::driver_for(&config)
        .await
        .map_err(local::LocalError::from)?;
    let serving = local::serve(
        &config,
        lock,
        listener,
        keys,
        args.keys_file.clone(),
        driver,
    )
    .await?;
    terminated().await;
    tracing::info!("shutting down: finishing requests, pausing sandboxes");
    serving.shutdown().await;
    Ok(())
}

/// `sandbox-mcp tools`: the table (or the JSON) is written in one go, and a reader that stops
/// early (`| head`) is not an error.
fn tools(selection: &str, json: bool) -> anyhow::Result<()> {
    let out = tools_text(selection, json)?;
    match std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn tools_text(selection: &str, json: bool) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    let registry = registry();
    let selected = registry.select(selection).map_err(anyhow::Error::msg)?;
    if json {
        let tools: Vec<_> = selected
            .iter()
            .map(|d| sandbox_mcp_server::server::to_mcp_tool(d))
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "tools": tools }))?
        )?;
        return Ok(out);
    }
    writeln!(
        out,
        "{} — {} tools (from {} v{})\n",
        env!("CARGO_PKG_NAME"),
        selected.len(),
        registry.api_title,
        registry.api_version
    )?;
    writeln!(
        out,
        "{:<28} {:<12} {:<7} {:<44} SOURCE",
        "TOOL", "HINTS", "METHOD", "PATH"
    )?;
    for t in &selected {
        let a = t.annotations;
        let hints = [
            (a.read_only, "ro"),
            (a.destructive, "destr"),
            (a.idempotent, "idem"),
            (a.open_world, "open"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, s)| *s)
        .collect::<Vec<_>>()
        .join(",");
        writeln!(
            out,
            "{:<28} {:<12} {:<7} {:<44} {}",
            t.name, hints, t.method, t.path, t.source
        )?;
    }
    let excluded: Vec<_> = registry
        .inventory
        .iter()
        .filter(|i| i.excluded.is_some())
        .collect();
    if !excluded.is_empty() {
        writeln!(out, "\nOperations not offered as tools:")?;
        for i in excluded {
            writeln!(
                out,
                "  {} ({} {}): {}",
                i.operation,
                i.method,
                i.path,
                i.excluded.as_deref().unwrap_or("")
            )?;
        }
    }
    if !registry.toolsets.is_empty() {
        writeln!(
            out,
            "\nToolsets (--tools): all, {}",
            registry
                .toolsets
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    Ok(out)
}
