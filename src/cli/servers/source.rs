//! `servers add --from`: a server installed from source into a template of its own,
//! `mcp-NAME`, before it is registered (SuperBox's test mode).
//!
//! A git URL becomes template build steps (clone, install), cached like any template step. A
//! local directory is packed here, unpacked and installed in a build sandbox that can reach only
//! `--allow-out`, and that sandbox is frozen into the template; the template's description keeps
//! a digest of the directory and the install command, so an unchanged source is not installed
//! twice.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use sandbox_mcp_api::{Client, types};
use sandbox_mcp_server::hosted::ServerSpec;

use super::api_error;
use crate::cli::args::ServersAdd;

/// Where the source goes inside the template.
const SOURCE_ROOT: &str = "/srv/mcp";
/// Largest local directory packed (as a tar).
const MAX_SOURCE: usize = 256 * 1024 * 1024;
/// One upload (the API takes at most 8 MiB per file).
const PART: usize = 6 * 1024 * 1024;

pub(super) struct Built {
    pub template: String,
    pub dir: String,
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A URL as it may be shown and stored: without credentials (`https://user:token@host/…`).
pub(super) fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            if path.is_empty() && !rest.contains('/') {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}/{path}")
            }
        }
        None => url.to_string(),
    }
}

fn is_git_url(from: &str) -> bool {
    ["http://", "https://", "git://", "ssh://", "git@"]
        .iter()
        .any(|p| from.starts_with(p))
}

/// The host a git URL names, so the build may reach it.
fn git_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    let host = rest.split(['/', ':']).next()?;
    (!host.is_empty()).then(|| host.to_string())
}

fn network(spec: &ServerSpec, extra: Option<String>) -> Value {
    let mut allow = spec.allow_out.clone();
    allow.extend(extra);
    json!({"allow_out": allow, "deny_out": ["0.0.0.0/0", "::/0"]})
}

pub(super) async fn install(
    client: &Client,
    add: &ServersAdd,
    from: &str,
    spec: &ServerSpec,
) -> anyhow::Result<Built> {
    let template = format!("mcp-{}", add.name);
    let dir = format!("{SOURCE_ROOT}/{}", add.name);
    let install = add.install.clone().unwrap_or_else(|| "true".into());
    if is_git_url(from) {
        let branch = add
            .git_ref
            .as_deref()
            .map(|r| format!("--branch {} ", sh_quote(r)))
            .unwrap_or_default();
        let steps = json!([
            // Shallow when the server can (a "dumb" HTTP server cannot), else whole.
            {"run": format!(
                "git clone -q --depth 1 {branch}-- {url} {dir} || (rm -rf {dir} && git clone -q {branch}-- {url} {dir})",
                url = sh_quote(from),
                dir = sh_quote(&dir)
            )},
            {"workdir": dir},
            {"run": install},
        ]);
        let description = format!("MCP server {} from {}", add.name, without_userinfo(from));
        let request = json!({
            "name": template, "from": spec.template, "description": description,
            "steps": steps, "network": network(spec, git_host(from)),
        });
        replace_template(client, &template, request, |_| false).await?;
        return Ok(Built { template, dir });
    }
    let path = std::path::Path::new(from);
    if !path.is_dir() {
        anyhow::bail!(
            "--from {from}: not a git URL (http(s)://, git://, ssh://, git@) nor a directory"
        );
    }
    let tar = pack(path)?;
    let digest = hex(&Sha256::digest(
        [
            &tar[..],
            install.as_bytes(),
            spec.template.as_deref().unwrap_or("base").as_bytes(),
        ]
        .concat(),
    ));
    let description = format!("MCP server {} from {from} (sha256:{digest})", add.name);
    if let Ok(existing) = client.get_template().name(template.as_str()).send().await {
        let existing = existing.into_inner();
        if existing.description == description && existing.status == types::TemplateStatus::Ready {
            eprintln!("{template}: the source and install are unchanged; reusing it");
            return Ok(Built { template, dir });
        }
    }
    // A build sandbox: the source unpacked and installed, then frozen into the template.
    let mut sandbox =
        json!({"network": network(spec, None), "metadata": {"sandbox-mcp.build": add.name}});
    if let Some(t) = &spec.template {
        sandbox["template"] = json!(t);
    }
    let body: types::CreateSandboxRequest = serde_json::from_value(sandbox)?;
    let id = client
        .create_sandbox()
        .body(body)
        .send()
        .await
        .map_err(api_error)?
        .into_inner()
        .id
        .to_string();
    let built = build_in(client, &id, &tar, &dir, &install, &template, &description).await;
    let _ = client.kill_sandbox().sandbox_id(id.as_str()).send().await;
    built?;
    Ok(Built { template, dir })
}

async fn build_in(
    client: &Client,
    id: &str,
    tar: &[u8],
    dir: &str,
    install: &str,
    template: &str,
    description: &str,
) -> anyhow::Result<()> {
    let parts = tar.chunks(PART).count();
    for (n, part) in tar.chunks(PART).enumerate() {
        let body: types::WriteFileRequest = serde_json::from_value(json!({
            "path": format!("/tmp/mcp-source.{n:04}"),
            "content": base64::engine::general_purpose::STANDARD.encode(part),
            "encoding": "base64",
        }))?;
        client
            .write_file()
            .sandbox_id(id)
            .body(body)
            .send()
            .await
            .map_err(api_error)?;
    }
    let command = format!(
        "set -e; mkdir -p {d}; cat /tmp/mcp-source.* | tar -x -C {d}; rm -f /tmp/mcp-source.*; cd {d}; {install}",
        d = sh_quote(dir)
    );
    eprintln!("installing from {parts} part(s): {install}");
    let body: types::ExecRequest =
        serde_json::from_value(json!({"command": command, "timeout_ms": 600000}))?;
    let result = client
        .exec_command()
        .sandbox_id(id)
        .body(body)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    if result.exit_code != Some(0) {
        anyhow::bail!(
            "the install failed (exit {:?}):\n{}\n{}",
            result.exit_code,
            result
                .stdout
                .chars()
                .rev()
                .take(2000)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>(),
            result
                .stderr
                .chars()
                .rev()
                .take(2000)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>()
        );
    }
    let request = json!({"name": template, "from_sandbox": id, "description": description});
    replace_template(client, template, request, |_| false).await
}

/// Creates template `name` from `request`, replacing one of that name, and waits until it is ready.
async fn replace_template(
    client: &Client,
    name: &str,
    request: Value,
    _keep: impl Fn(&types::Template) -> bool,
) -> anyhow::Result<()> {
    if client.get_template().name(name).send().await.is_ok() {
        client
            .delete_template()
            .name(name)
            .send()
            .await
            .map_err(api_error)?;
    }
    let body: types::CreateTemplateRequest = serde_json::from_value(request)?;
    client
        .create_template()
        .body(body)
        .send()
        .await
        .map_err(api_error)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(1800);
    loop {
        let t = client
            .get_template()
            .name(name)
            .send()
            .await
            .map_err(api_error)?
            .into_inner();
        match t.status {
            types::TemplateStatus::Ready => return Ok(()),
            types::TemplateStatus::Failed => match t.failure {
                Some(f) => anyhow::bail!(
                    "building {name} failed: {} (`{}`):\n{}",
                    f.message,
                    f.step_text.unwrap_or_default(),
                    f.output_tail.trim_end()
                ),
                None => anyhow::bail!("building {name} failed"),
            },
            types::TemplateStatus::Building if std::time::Instant::now() > deadline => {
                anyhow::bail!("building {name} took over 30 minutes")
            }
            types::TemplateStatus::Building => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// `dir` as a tar, without its `.git`.
fn pack(dir: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            builder.append_dir_all(&name, &path)?;
        } else {
            builder.append_path_with_name(&path, &name)?;
        }
        if builder.get_ref().len() > MAX_SOURCE {
            anyhow::bail!("{} is over {} MiB packed", dir.display(), MAX_SOURCE >> 20);
        }
    }
    Ok(builder.into_inner()?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_hosts_and_quoting() {
        assert_eq!(
            git_host("https://git.example.test/a/b.git").as_deref(),
            Some("git.example.test")
        );
        assert_eq!(
            git_host("git@github.com:o/r.git").as_deref(),
            Some("github.com")
        );
        assert_eq!(sh_quote("a'b"), "'a'\\''b'");
        assert!(is_git_url("https://x/y") && !is_git_url("./dir"));
        assert_eq!(
            without_userinfo("https://u:tok@git.example.test/a.git"),
            "https://git.example.test/a.git"
        );
        assert_eq!(
            without_userinfo("https://git.example.test"),
            "https://git.example.test"
        );
    }
}
