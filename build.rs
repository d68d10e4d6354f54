//! Generates, into `OUT_DIR`, everything derived from `openapi/` and `tool-defs/`:
//! the typed control-plane client (progenitor), the validated tool registry (`tools.json`) and the
//! dispatch from tool name to client call (`dispatch.rs`). The logic lives in `src/codegen.rs`,
//! which the test suite also runs against broken tool-def fixtures.

#[path = "src/codegen.rs"]
mod codegen;

use std::path::{Path, PathBuf};

const SPEC: &str = "openapi/sandbox-mcp.json";
const TOOL_DEFS: &str = "tool-defs";

fn main() {
    for path in [
        SPEC,
        TOOL_DEFS,
        "src/codegen.rs",
        "src/codegen",
        "src/jsonschema.rs",
        "src/tooldefs/model.rs",
    ] {
        println!("cargo::rerun-if-changed={path}");
    }
    if let Err(errors) = run() {
        for e in &errors {
            build_print::error!("{e}");
        }
        build_print::error!(
            "{} problem(s) in the spec or tool-defs; fix them and rebuild",
            errors.len()
        );
        std::process::exit(1);
    }
}

fn run() -> Result<(), Vec<String>> {
    let one = |e: String| vec![e];
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| one(e.to_string()))?);
    let spec_text = std::fs::read_to_string(SPEC).map_err(|e| one(format!("{SPEC}: {e}")))?;
    let files = read_tool_defs(Path::new(TOOL_DEFS)).map_err(one)?;

    let (spec, registry) = codegen::build_registry(SPEC, &spec_text, &files)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>())?;

    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(progenitor::InterfaceStyle::Builder)
        .with_map_type("::std::collections::BTreeMap");
    let tokens = progenitor::Generator::new(&settings)
        .generate_tokens(&spec.api)
        .map_err(|e| one(format!("{SPEC}: the client generator failed: {e}")))?;
    let ast =
        syn::parse2(tokens).map_err(|e| one(format!("generated client does not parse: {e}")))?;

    let registry_json = serde_json::to_string_pretty(&registry).map_err(|e| one(e.to_string()))?;
    let writes = [
        ("client.rs", prettyplease::unparse(&ast)),
        ("tools.json", registry_json),
        ("dispatch.rs", codegen::dispatch::generate(&spec, &registry)),
    ];
    for (name, content) in writes {
        std::fs::write(out_dir.join(name), content).map_err(|e| one(format!("{name}: {e}")))?;
    }

    let excluded = registry
        .inventory
        .iter()
        .filter(|i| i.excluded.is_some())
        .count();
    build_print::info!(
        "sandbox-mcp: {} tools from {} tool-def files; {} operations ({} excluded)",
        registry.tools.len(),
        files.len(),
        registry.inventory.len(),
        excluded
    );
    Ok(())
}

/// `tool-defs/*.toml`, sorted by name so `tools/list` order is stable.
fn read_tool_defs(dir: &Path) -> Result<Vec<codegen::ToolDefFile>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok(codegen::ToolDefFile {
                name: format!(
                    "{TOOL_DEFS}/{}",
                    p.file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default()
                ),
                text,
            })
        })
        .collect()
}
