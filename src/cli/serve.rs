//! `sandbox-mcp` and `sandbox-mcp serve`: MCP for a client, on stdin/stdout or over Streamable
//! HTTP (`--http`), in front of the embedded engine or the control plane at `--url`.

use std::time::Duration;

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::server::{SandboxMcp, Selection, ServerSettings};
use sandbox_mcp_server::tooldefs::registry;

use super::args::ServeArgs;
use super::process;
use crate::local_engine::Embedded;

pub(super) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // The registry is parsed and the tools built on a thread of their own while the rest starts:
    // an `initialize` needs none of it, and a client's first `tools/list` waits for it if it
    // comes first.
    let profile = args
        .session_sandbox
        .then_some(sandbox_mcp_server::server::SESSION_PROFILE);
    sandbox_mcp_server::tooldefs::check_tools(profile, &args.tools).map_err(anyhow::Error::msg)?;
    let spec = args.tools.clone();
    let selection = Selection::in_background(move || registry().select_in(profile, &spec));
    process::init_logging("warn,rmcp::service=error");
    let backend = match &args.url {
        Some(url) => Backend::remote(url, args.api_key.clone().map(ApiKey::new))
            .map_err(anyhow::Error::msg)?,
        // The stdio server's runtime has one worker (`cli::worker_threads`); an engine it serves
        // runs on a pool of its own (`Embedded::new` sees the runtime).
        None => Backend::local(std::sync::Arc::new(Embedded::new(args.engine.config()))),
    };
    tracing::debug!(
        control_plane = args.url.as_deref().unwrap_or("the local engine"),
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
    selection: Selection,
    settings: ServerSettings,
) -> anyhow::Result<()> {
    let mut server = SandboxMcp::with_selection(backend.clone(), selection, settings);
    if args.session_sandbox {
        server = server.with_session(sandbox_mcp_server::session::SessionSandboxes::default());
    }
    let hosted = sandbox_mcp_server::hosted::sessions::Sessions::new(backend.clone());
    if let Some(set) = sandbox_mcp_server::hosted::mount::MountSet::parse(&args.mount_servers) {
        server = server.with_mounts(sandbox_mcp_server::hosted::mount::Mounted::new(
            hosted.clone(),
            set,
        ));
    }
    let session = server.clone();
    let io = sandbox_mcp_server::stdio::frame(
        tokio::io::stdin(),
        tokio::io::stdout(),
        |transport| async move {
            use rmcp::ServiceExt;
            let running = server.serve(transport).await?;
            running.waiting().await?;
            Ok(())
        },
    );
    let outcome = tokio::select! {
        r = io => r,
        () = process::terminated() => Ok(()),
    };
    // stdin EOF or SIGTERM ends the (only) session.
    session.end_session().await;
    hosted.close_all().await;
    outcome
}

async fn serve_http(
    args: &ServeArgs,
    listen: std::net::SocketAddr,
    backend: Backend,
    selection: Selection,
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
    let oauth = oauth_settings(&args.oauth, &config.data_dir, keys.clone())?;
    // The public URL's host is the server's own name, with OAuth or without (a proxy that ends
    // TLS passes it on in `Host`).
    let mut allowed_hosts = args.allow_hosts.clone();
    if let Some(url) = &args.oauth.public_url {
        allowed_hosts.push(sandbox_mcp_oauth::public_url_host(url).map_err(anyhow::Error::msg)?);
    }
    let opts = HttpOptions {
        listen,
        dev: args.dev,
        allowed_hosts,
        allowed_origins: args.allow_origins.clone(),
        rate_limit: args.rate_limit,
        session_idle: Duration::from_secs(args.session_idle_timeout.max(1)),
        session_sandbox: args.session_sandbox,
        mount_servers: args.mount_servers.clone(),
        oauth,
    };
    let server = HttpServer::start(opts, backend, Some(keys), selection, settings).await?;
    eprintln!("sandbox-mcp: serving MCP on http://{}/mcp", server.addr);
    if args.oauth.oauth {
        eprintln!(
            "sandbox-mcp: OAuth: clients sign in at {}/oauth/authorize with an access key (`sandbox-mcp keys create --tenant NAME`)",
            args.oauth.public_url.as_deref().map_or_else(
                || format!("http://{}", server.addr),
                |u| u.trim_end_matches('/').to_string()
            )
        );
    }
    process::terminated().await;
    tracing::info!("shutting down: finishing in-flight calls");
    server.shutdown(Duration::from_secs(30)).await;
    Ok(())
}

/// The OAuth of `serve --http`: the built-in authorization server (`--oauth`), an external
/// issuer's tokens (`--oauth-issuer`), or none.
fn oauth_settings(
    args: &super::args::OAuthArgs,
    data_dir: &std::path::Path,
    keys: std::sync::Arc<sandbox_mcp_server::keys::KeyStore>,
) -> anyhow::Result<Option<std::sync::Arc<sandbox_mcp_oauth::OAuth>>> {
    use sandbox_mcp_oauth::{Kind, OAuth, Settings};
    let kind = match (&args.oauth_issuer, args.oauth) {
        (Some(issuer), _) => Kind::External {
            issuer: issuer.clone(),
            audiences: args.oauth_audiences.clone(),
            tenant_claim: args.oauth_tenant_claim.clone(),
        },
        (None, true) => Kind::BuiltIn {
            data_dir: data_dir.to_path_buf(),
            accounts: keys,
        },
        (None, false) => return Ok(None),
    };
    let oauth = OAuth::new(Settings {
        kind,
        public_url: args.public_url.clone(),
        ca_file: args.oauth_ca_file.clone(),
        allow_nets: args.oauth_allow_nets.clone(),
        access_ttl: Duration::from_secs(args.oauth_token_ttl.max(1)),
    })
    .map_err(anyhow::Error::msg)?;
    Ok(Some(oauth))
}
