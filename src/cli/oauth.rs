//! `sandbox-mcp oauth`: the built-in authorization server's clients and grants, read and changed
//! in its database under the data dir (a running server sees each change at its next request).

use sandbox_mcp_oauth::Store;
use sandbox_mcp_oauth::clients::check_redirect_uri;

use super::args::{DataDirArg, OAuthClients, OAuthCommand, OAuthGrants};

#[allow(clippy::print_stdout)] // the listings and the new client's credentials are the output
pub(super) fn run(data: &DataDirArg, cmd: OAuthCommand) -> anyhow::Result<()> {
    let store = Store::open(&data.path()).map_err(anyhow::Error::msg)?;
    match cmd {
        OAuthCommand::Clients(OAuthClients::List { json }) => {
            let clients = store.clients().map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&clients)?);
                return Ok(());
            }
            println!(
                "{:<32} {:<10} {:<20} {:<22} REDIRECT URIS",
                "CLIENT ID", "KIND", "NAME", "STATE"
            );
            for c in clients {
                let state = c
                    .revoked_at
                    .map_or("active".to_string(), |t| format!("revoked {t}"));
                println!(
                    "{:<32} {:<10} {:<20} {:<22} {}",
                    c.client_id,
                    c.kind,
                    c.name,
                    state,
                    c.redirect_uris.join(" ")
                );
            }
        }
        OAuthCommand::Clients(OAuthClients::Add {
            name,
            redirect_uris,
            confidential,
        }) => {
            for u in &redirect_uris {
                check_redirect_uri(u).map_err(anyhow::Error::msg)?;
            }
            let method = if confidential {
                "client_secret_basic"
            } else {
                "none"
            };
            let (client, secret) = store
                .add_client("registered", &name, &redirect_uris, method)
                .map_err(anyhow::Error::msg)?;
            eprintln!("registered {name}; give the client these (a secret is shown only now)");
            println!("client_id: {}", client.client_id);
            if let Some(s) = secret {
                println!("client_secret: {s}");
            }
        }
        OAuthCommand::Clients(OAuthClients::Revoke { client_id }) => {
            let grants = store
                .revoke_client(&client_id)
                .map_err(anyhow::Error::msg)?;
            eprintln!("revoked {client_id} and {grants} grant(s) it held");
        }
        OAuthCommand::Grants(OAuthGrants::List { json }) => {
            let grants = store.grants().map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&grants)?);
                return Ok(());
            }
            println!(
                "{:<22} {:<16} {:<14} {:<24} {:<22} CLIENT",
                "GRANT", "TENANT", "KEY", "SCOPE", "STATE"
            );
            for g in grants {
                let state = match (&g.revoked_at, &g.used_at) {
                    (Some(t), _) => format!("revoked {t}"),
                    (None, Some(t)) => format!("used {t}"),
                    (None, None) => "unused".to_string(),
                };
                println!(
                    "{:<22} {:<16} {:<14} {:<24} {:<22} {} ({})",
                    g.id, g.tenant, g.key_id, g.scope, state, g.client_name, g.client_id
                );
            }
        }
        OAuthCommand::Grants(OAuthGrants::Revoke { id }) => {
            if !store
                .revoke_grant(&id, "revoked by the operator")
                .map_err(anyhow::Error::msg)?
            {
                anyhow::bail!("no grant {id}; `sandbox-mcp oauth grants list` shows them");
            }
            eprintln!("revoked {id}: its tokens stop working at once");
        }
    }
    Ok(())
}
