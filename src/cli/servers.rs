//! `sandbox-mcp servers add|list|rm|log`: hosted MCP servers, registered in the engine that serves
//! the data dir (started here if none does) or the one at `--url`. `serve --http` serves each at
//! /servers/NAME/mcp; `add --from` installs one from source first (see [`source`]).

use serde_json::json;

use sandbox_mcp_api::{ApiKey, Client, types};
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::hosted::SERVER_LABEL;

use super::args::{ServersAdd, ServersArgs, ServersCommand};
use super::process;

mod source;

pub(super) async fn run(args: ServersArgs) -> anyhow::Result<()> {
    process::init_logging("warn");
    let command = args.command;
    args.control
        .with_client(&args.engine, |client| async move {
            match command {
                ServersCommand::Add(add) => self::add(&client, *add).await,
                ServersCommand::List { json } => list(&client, json).await,
                ServersCommand::Rm { name } => rm(&client, &name).await,
                ServersCommand::Log { name } => log(&client, &name).await,
            }
        })
        .await
}

impl super::args::ControlPlane {
    /// Runs `work` with a client of the engine at `--url`, or of the one that serves the data
    /// dir (started for the command if none does, and stopped after it).
    pub(super) async fn with_client<F, Fut>(
        &self,
        engine: &super::args::EngineSettings,
        work: F,
    ) -> anyhow::Result<()>
    where
        F: FnOnce(std::sync::Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let backend = match &self.url {
            Some(url) => Backend::remote(url, self.api_key.clone().map(ApiKey::new))
                .map_err(anyhow::Error::msg)?,
            None => Backend::local(std::sync::Arc::new(crate::local_engine::Embedded::new(
                engine.config(),
            ))),
        };
        let outcome = async {
            let handle = backend
                .client(None)
                .await
                .map_err(|e| anyhow::anyhow!(e.text()))?;
            work(handle.client.clone()).await
        }
        .await;
        backend.shutdown().await;
        outcome
    }
}

pub(super) fn api_error(e: sandbox_mcp_api::Error<types::Error>) -> anyhow::Error {
    anyhow::anyhow!(sandbox_mcp_server::call::error_text(e))
}

#[allow(clippy::print_stdout)] // the summary line is the command's output
async fn add(client: &Client, add: ServersAdd) -> anyhow::Result<()> {
    if add.from.is_some() && !add.command.is_empty() {
        anyhow::bail!("give --entrypoint with --from, not a command after `--`");
    }
    let mut spec = super::run::server_spec(
        &add.server,
        if add.from.is_some() {
            vec!["/bin/sh".into()]
        } else {
            add.command.clone()
        },
    )?;
    spec.http_port = add.http_port;
    spec.http_path = add.http_path.clone();
    let mut request = json!({
        "idle_timeout_seconds": add.idle_timeout.max(10),
        "warm": add.warm,
    });
    if let Some(from) = &add.from {
        let entrypoint = add.entrypoint.as_deref().ok_or_else(|| {
            anyhow::anyhow!("--from needs --entrypoint: how to start the installed server, e.g. `node dist/index.js`")
        })?;
        let built = source::install(client, &add, from, &spec).await?;
        spec.template = Some(built.template);
        spec.cwd = Some(built.dir);
        spec.command = vec!["/bin/sh".into(), "-c".into(), format!("exec {entrypoint}")];
        let shown = source::without_userinfo(from);
        request["source"] = json!({"from": shown, "ref": add.git_ref, "install": add.install});
    }
    let fields = serde_json::to_value(&spec)?;
    for (k, v) in fields.as_object().into_iter().flatten() {
        let key = if k == "env" { "env_vars" } else { k.as_str() };
        request[key] = v.clone();
    }
    let body: types::ServerRequest = serde_json::from_value(request)
        .map_err(|e| anyhow::anyhow!("invalid server settings: {e}"))?;
    let server = client
        .put_server()
        .name(add.name.as_str())
        .body(body)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    println!(
        "registered {}: `{}`; serve --http serves it at /servers/{}/mcp",
        server.name.as_str(),
        server.command.join(" "),
        server.name.as_str()
    );
    Ok(())
}

#[allow(clippy::print_stdout)]
async fn list(client: &Client, json: bool) -> anyhow::Result<()> {
    let servers = client
        .list_servers()
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    if json {
        println!("{}", serde_json::to_string_pretty(&servers)?);
        return Ok(());
    }
    if servers.servers.is_empty() {
        println!("no hosted servers; add one with `sandbox-mcp servers add NAME -- COMMAND`");
        return Ok(());
    }
    println!(
        "{:<24} {:<6} {:>4} {:>7}  COMMAND",
        "NAME", "SHARED", "WARM", "IDLE_S"
    );
    for s in servers.servers {
        println!(
            "{:<24} {:<6} {:>4} {:>7}  {}",
            s.name.as_str(),
            if s.shared { "yes" } else { "no" },
            s.warm,
            s.idle_timeout_seconds,
            s.command.join(" ")
        );
    }
    Ok(())
}

#[allow(clippy::print_stdout)]
async fn rm(client: &Client, name: &str) -> anyhow::Result<()> {
    let result = client
        .delete_server()
        .name(name)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    if result.deleted {
        println!("removed {name}");
        Ok(())
    } else {
        anyhow::bail!("no hosted server named {name}")
    }
}

#[allow(clippy::print_stdout)]
async fn log(client: &Client, name: &str) -> anyhow::Result<()> {
    let filter = format!("{SERVER_LABEL}={name}");
    let sandboxes = client
        .list_sandboxes()
        .metadata(filter.as_str())
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    if sandboxes.sandboxes.is_empty() {
        println!("{name}: no sandbox runs it now (sessions and `run` kill theirs when they end)");
        return Ok(());
    }
    for listed in sandboxes.sandboxes {
        let id = listed.id.to_string();
        let sandbox = client
            .get_sandbox()
            .sandbox_id(id.as_str())
            .send()
            .await
            .map_err(api_error)?
            .into_inner();
        let usage = sandbox
            .usage
            .as_ref()
            .map(|u| format!(", memory {} MiB", u.memory_bytes >> 20))
            .unwrap_or_default();
        println!(
            "== {id} ({:?}, since {}{usage})",
            sandbox.status, sandbox.created_at
        );
        for job in &sandbox.jobs {
            let status = client
                .get_job()
                .sandbox_id(id.as_str())
                .job_id(job.job_id.to_string())
                .send()
                .await
                .map_err(api_error)?
                .into_inner();
            let text = status.output.trim();
            let tail: String = text
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            println!(
                "-- {} `{}` ({:?}), stderr:\n{tail}",
                job.job_id.as_str(),
                job.command,
                job.status
            );
        }
        let log = client
            .get_network_log()
            .sandbox_id(id.as_str())
            .limit(std::num::NonZeroU64::new(50).unwrap_or(std::num::NonZeroU64::MIN))
            .send()
            .await
            .map_err(api_error)?
            .into_inner();
        println!("-- network ({} entries, newest first):", log.entries.len());
        for e in log.entries {
            println!(
                "{} {:?} {}{} {} sent {} B, received {} B{}",
                e.time,
                e.verdict,
                e.host.as_deref().unwrap_or("-"),
                e.port.map(|p| format!(":{p}")).unwrap_or_default(),
                e.rule,
                e.bytes_sent,
                e.bytes_received,
                if e.count.get() > 1 {
                    format!(" (×{})", e.count)
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
