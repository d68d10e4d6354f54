//! `sandbox-mcp template import`: an OCI image as a template, through the engine that serves the
//! data dir, or straight into the data dir when none does.

use std::path::PathBuf;

use sandbox_mcp_model::config::EngineConfig;

use super::args::{DataDirArg, TemplateCommand};

#[allow(clippy::print_stdout)] // the summary line is the command's output
pub(super) async fn run(data: &DataDirArg, cmd: TemplateCommand) -> anyhow::Result<()> {
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
