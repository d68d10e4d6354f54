//! The whole build step: read the spec and the tool-defs, validate, and write the generated files.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::{bind, dispatch, limits, model, raw, server, spec};

/// One problem found in the spec or a tool-def, located as precisely as possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodegenError {
    /// `tool-defs/<name>.toml`, or `openapi/...` for spec problems.
    pub file: String,
    /// The tool (or `[[exclude]]` operation) the problem is in, when there is one.
    pub tool: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for CodegenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tool {
            Some(entry) if entry.starts_with("[[") => {
                write!(f, "{}: {entry}: {}", self.file, self.message)
            }
            Some(tool) => write!(f, "{}: tool `{tool}`: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// One tool-def file: its name relative to the crate root and its text.
pub struct ToolDefFile {
    pub name: String,
    pub text: String,
}

/// What [`generate_tools`] wrote.
#[derive(Debug)]
pub struct Generated {
    pub tools: usize,
    pub tool_def_files: usize,
    pub operations: usize,
    pub excluded: usize,
}

impl fmt::Display for Generated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sandbox-mcp: {} tools from {} tool-def files; {} operations ({} excluded)",
            self.tools, self.tool_def_files, self.operations, self.excluded
        )
    }
}

fn one(file: &str, message: impl fmt::Display) -> Vec<CodegenError> {
    vec![CodegenError {
        file: file.to_string(),
        tool: None,
        message: message.to_string(),
    }]
}

/// Reads the spec at `spec_path` and writes into `out_dir` the typed client (`client.rs`,
/// progenitor's). The API crate's build script. Paths in messages are shown as given.
pub fn generate_client(spec_path: &Path, out_dir: &Path) -> Result<(), Vec<CodegenError>> {
    let spec_file = spec_path.display().to_string();
    let spec_text = std::fs::read_to_string(spec_path).map_err(|e| one(&spec_file, e))?;
    let spec = spec::Spec::parse(&spec_file, &spec_text).map_err(|e| vec![e])?;
    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(progenitor::InterfaceStyle::Builder)
        .with_map_type("::std::collections::BTreeMap")
        // How a request reaches the engine (over HTTP, or in this process): the API crate's
        // `Transport`, used by its own `exec` hook.
        .with_inner_type(quote::quote!(crate::Transport))
        .with_hooks(progenitor::HooksMode::Expected);
    let client = progenitor::Generator::new(&settings)
        .generate_tokens(&spec.api)
        .map_err(|e| one(&spec_file, format!("the client generator failed: {e}")))?;
    std::fs::write(out_dir.join("client.rs"), render(client)?).map_err(|e| one("client.rs", e))
}

/// Reads the spec at `spec_path` and writes into `out_dir` the engine's side of the API
/// (`server.rs`: the `EngineApi` trait, its query types, its router) and the limits the spec
/// states (`limits.rs`). The API crate's build script, beside [`generate_client`].
pub fn generate_server(spec_path: &Path, out_dir: &Path) -> Result<(), Vec<CodegenError>> {
    let spec_file = spec_path.display().to_string();
    let spec_text = std::fs::read_to_string(spec_path).map_err(|e| one(&spec_file, e))?;
    let spec = spec::Spec::parse(&spec_file, &spec_text).map_err(|e| vec![e])?;
    let server = server::generate(&spec).map_err(|e| one(&spec_file, e))?;
    let writes = [
        ("server.rs", render(server)?),
        ("limits.rs", render(limits::generate(&spec))?),
    ];
    for (name, content) in writes {
        std::fs::write(out_dir.join(name), content).map_err(|e| one(name, e))?;
    }
    Ok(())
}

/// Reads the spec at `spec_path` and the tool-defs in `tool_defs`, and writes into `out_dir` the
/// validated registry (`tools.json`) and the dispatch from tool name to client call
/// (`dispatch.rs`). The MCP layer's build script. Paths in messages are shown as given.
pub fn generate_tools(
    spec_path: &Path,
    tool_defs: &Path,
    out_dir: &Path,
) -> Result<Generated, Vec<CodegenError>> {
    let spec_file = spec_path.display().to_string();
    let spec_text = std::fs::read_to_string(spec_path).map_err(|e| one(&spec_file, e))?;
    let files = read_tool_defs(tool_defs)?;
    let (spec, registry) = build_registry(&spec_file, &spec_text, &files)?;
    // Compact: the binary parses it at every start (off the start's critical path, but still).
    let registry_json = serde_json::to_string(&registry).map_err(|e| one("tools.json", e))?;
    let names_json =
        serde_json::to_string(&registry.names()).map_err(|e| one("tool-names.json", e))?;
    let writes = [
        ("tools.json", registry_json),
        ("tool-names.json", names_json),
        ("dispatch.rs", render(dispatch::generate(&spec, &registry))?),
    ];
    for (name, content) in writes {
        std::fs::write(out_dir.join(name), content).map_err(|e| one(name, e))?;
    }
    Ok(Generated {
        tools: registry.tools.len(),
        tool_def_files: files.len(),
        operations: registry.inventory.len(),
        excluded: registry
            .inventory
            .iter()
            .filter(|i| i.excluded.is_some())
            .count(),
    })
}

/// Generated tokens as formatted Rust source.
fn render(tokens: proc_macro2::TokenStream) -> Result<String, Vec<CodegenError>> {
    let file =
        syn::parse2(tokens).map_err(|e| one("generated code", format!("does not parse: {e}")))?;
    Ok(format!(
        "// @generated by sandbox-mcp-codegen from openapi/ and tool-defs/. Do not edit.\n\n{}",
        prettyplease::unparse(&file)
    ))
}

/// `<dir>/*.toml`, sorted by name so `tools/list` order is stable; each named
/// `<dir's name>/<file>` in messages.
pub fn read_tool_defs(dir: &Path) -> Result<Vec<ToolDefFile>, Vec<CodegenError>> {
    let shown = dir.display().to_string();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| one(&shown, e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let name = format!(
                "{shown}/{}",
                p.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            );
            let text = std::fs::read_to_string(&p).map_err(|e| one(&name, e))?;
            Ok(ToolDefFile { name, text })
        })
        .collect()
}

/// Builds and validates the registry. Returns every error found, sorted by file.
pub fn build_registry(
    spec_file: &str,
    spec_text: &str,
    files: &[ToolDefFile],
) -> Result<(spec::Spec, model::Registry), Vec<CodegenError>> {
    let spec = spec::Spec::parse(spec_file, spec_text).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut parsed = Vec::new();
    for file in files {
        match raw::parse_file(&file.name, &file.text) {
            Ok(f) => parsed.push(f),
            Err(mut e) => errors.append(&mut e),
        }
    }
    match bind::bind(&spec, &parsed) {
        Ok(registry) if errors.is_empty() => Ok((spec, registry)),
        Ok(_) => Err(errors),
        Err(mut e) => {
            errors.append(&mut e);
            Err(errors)
        }
    }
}

/// " Did you mean `x`?" when a candidate is close enough, else "".
pub(crate) fn did_you_mean<'a>(wrong: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    candidates
        .map(|c| (strsim::levenshtein(wrong, c), c))
        .filter(|(d, c)| *d <= 3.max(c.len() / 3))
        .min()
        .map(|(_, c)| format!(" Did you mean `{c}`?"))
        .unwrap_or_default()
}
