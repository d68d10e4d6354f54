//! `sandbox-mcp secrets`: set (the value read from stdin), list and remove the secrets sandboxes
//! may use without seeing.

use sandbox_mcp_model::config::EngineConfig;

use super::args::{DataDirArg, SecretsCommand};

#[allow(clippy::print_stdout)] // the listing is the command's output
pub(super) fn run(data: &DataDirArg, cmd: SecretsCommand) -> anyhow::Result<()> {
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
