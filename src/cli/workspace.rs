//! `sandbox-mcp workspace changes|apply`: what a sandbox changed in a workspace (a host folder
//! exposed with `--workspace`), and writing it into the folder once reviewed. Goes through the
//! engine that serves the data dir (started here if none does) or the one at `--url`.

use sandbox_mcp_api::{Client, types};

use super::args::{WorkspaceArgs, WorkspaceCommand};
use super::process;
use super::servers::api_error;

pub(super) async fn run(args: WorkspaceArgs) -> anyhow::Result<()> {
    process::init_logging("warn");
    let command = args.command;
    args.control
        .with_client(&args.engine, |client| async move {
            match command {
                WorkspaceCommand::Changes { sandbox_id, name } => {
                    changes(&client, &sandbox_id, &name, true).await.map(|_| ())
                }
                WorkspaceCommand::Apply {
                    sandbox_id,
                    name,
                    dry_run,
                } => apply(&client, &sandbox_id, &name, dry_run).await,
            }
        })
        .await
}

/// Prints the patch (`patch`) or the list of changed files; returns how many there are.
#[allow(clippy::print_stdout)] // the patch or the list is the command's output
async fn changes(client: &Client, id: &str, name: &str, patch: bool) -> anyhow::Result<usize> {
    let c = client
        .workspace_changes()
        .sandbox_id(id)
        .name(name)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    if patch {
        print!("{}", c.patch);
    } else {
        for f in &c.files {
            let mark = match f.change {
                types::ChangeKind::Added => 'A',
                types::ChangeKind::Removed => 'D',
                types::ChangeKind::Modified => 'M',
            };
            println!("{mark} {}", f.path);
        }
    }
    Ok(c.files.len())
}

#[allow(clippy::print_stdout)]
async fn apply(client: &Client, id: &str, name: &str, dry_run: bool) -> anyhow::Result<()> {
    let files = changes(client, id, name, false).await?;
    if files == 0 {
        println!("sandbox {id} changed nothing in workspace {name}");
        return Ok(());
    }
    if dry_run {
        println!("(dry run: nothing written)");
        return Ok(());
    }
    let done = client
        .apply_workspace()
        .sandbox_id(id)
        .name(name)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    println!(
        "applied sandbox {id}'s changes to workspace {name}: {} paths written or removed",
        done.applied
    );
    Ok(())
}
