//! `sandbox-mcp run [FLAGS] -- COMMAND…`: a stdio MCP server in a sandbox of its own, relayed on
//! stdin/stdout (see the MCP layer's `hosted::run`).

use std::collections::BTreeMap;

use sandbox_mcp_api::ApiKey;
use sandbox_mcp_server::backend::Backend;
use sandbox_mcp_server::hosted::{self, ServerSpec};

use super::args::{RunArgs, ServerFlags};
use super::process;

pub(super) async fn run(args: RunArgs) -> anyhow::Result<i32> {
    // stdout is the MCP stream: logs go to stderr, and only warnings unless asked.
    process::init_logging("warn");
    let spec = server_spec(&args.server, args.command.clone())?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| hosted::name_from_command(&args.command));
    let backend = match &args.url {
        Some(url) => Backend::remote(url, args.api_key.clone().map(ApiKey::new))
            .map_err(anyhow::Error::msg)?,
        None => Backend::local(std::sync::Arc::new(crate::local_engine::Embedded::new(
            args.engine.config(),
        ))),
    };
    // The signals are taken now, before anything is made: a SIGTERM while the sandbox is being
    // created is seen once it is, and the sandbox goes with the rest.
    let mut stop = Box::pin(process::terminated());
    let _ = futures::poll!(stop.as_mut());
    let outcome = hosted::run::run(&backend, &name, &spec, stop).await;
    backend.shutdown().await;
    outcome.map_err(|e| anyhow::anyhow!("{name}: {e}"))
}

/// `K=V` pairs of a repeated flag, as a map; `what` names the flag in errors.
fn pairs(items: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => anyhow::bail!("{what} takes K=V, got {item:?}"),
        })
        .collect()
}

/// The server's settings from its flags.
pub(super) fn server_spec(flags: &ServerFlags, command: Vec<String>) -> anyhow::Result<ServerSpec> {
    if command.is_empty() || command[0].is_empty() {
        anyhow::bail!(
            "no server command: give it after `--`, e.g. `-- npx -y @modelcontextprotocol/server-memory`"
        );
    }
    let shape = match &flags.shape {
        None => None,
        Some(text) => {
            let mut shape = serde_json::Map::new();
            for (k, v) in pairs(
                &text.split(',').map(String::from).collect::<Vec<_>>(),
                "--shape",
            )? {
                let number: f64 = v
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--shape {k}={v}: not a number"))?;
                let value = match k.as_str() {
                    "vcpus" => serde_json::json!(number),
                    "memory_mb" | "disk_mb" | "max_pids" => serde_json::json!(number as u64),
                    other => anyhow::bail!(
                        "--shape has no `{other}`; it takes vcpus, memory_mb, disk_mb and max_pids"
                    ),
                };
                shape.insert(k, value);
            }
            Some(serde_json::Value::Object(shape))
        }
    };
    Ok(ServerSpec {
        command,
        template: flags.template.clone(),
        allow_out: flags.allow_out.clone(),
        secrets: pairs(&flags.secrets, "--secret")?,
        env: pairs(&flags.env, "--env")?,
        shape,
        cwd: flags.cwd.clone(),
        http_port: None,
        http_path: None,
    })
}
