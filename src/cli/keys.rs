//! `sandbox-mcp keys`: create, list and revoke the access keys of the HTTP transport.

use super::args::{DataDirArg, KeysCommand};

#[allow(clippy::print_stdout)] // the token is the command's output, alone on stdout
pub(super) fn run(data: &DataDirArg, cmd: KeysCommand) -> anyhow::Result<()> {
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
