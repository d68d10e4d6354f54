//! Generates, into `OUT_DIR`, everything derived from `openapi/` and `tool-defs/` — the typed
//! control-plane client, the validated tool registry and the dispatch from tool name to client
//! call — with the `sandbox-mcp-codegen` crate (`codegen/`).

use std::path::{Path, PathBuf};

const SPEC: &str = "openapi/sandbox-mcp.json";
const TOOL_DEFS: &str = "tool-defs";

fn main() {
    println!("cargo::rerun-if-changed={SPEC}");
    println!("cargo::rerun-if-changed={TOOL_DEFS}");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    match sandbox_mcp_codegen::generate(Path::new(SPEC), Path::new(TOOL_DEFS), &out_dir) {
        Ok(generated) => build_print::info!("{generated}"),
        Err(errors) => {
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
}
