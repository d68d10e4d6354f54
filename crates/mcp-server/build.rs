//! Generates, into `OUT_DIR`, the MCP tool surface derived from the workspace's top-level
//! `tool-defs/` and `openapi/`: the validated tool registry (`tools.json`) and the dispatch from
//! tool name to typed client call (`dispatch.rs`), with `sandbox-mcp-codegen`. A tool bound to
//! an operation the spec no longer has fails here, naming its file.

use std::path::{Path, PathBuf};

const SPEC: &str = "openapi/sandbox-mcp.json";
const TOOL_DEFS: &str = "tool-defs";

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    // From the workspace's root, so that every message names files as a reader finds them.
    let root = workspace_root();
    println!("cargo::rerun-if-changed={}", root.join(SPEC).display());
    println!("cargo::rerun-if-changed={}", root.join(TOOL_DEFS).display());
    if let Err(e) = std::env::set_current_dir(&root) {
        build_print::error!("cannot enter the workspace root {}: {e}", root.display());
        std::process::exit(1);
    }
    match sandbox_mcp_codegen::generate_tools(Path::new(SPEC), Path::new(TOOL_DEFS), &out_dir) {
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

/// The workspace's root: two levels above this crate.
fn workspace_root() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default()).join("../..")
}
