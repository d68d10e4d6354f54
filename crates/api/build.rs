//! Generates the typed control-plane client (`OUT_DIR/client.rs`) from the spec in the
//! workspace's top-level `openapi/`, with `sandbox-mcp-codegen`.

use std::path::{Path, PathBuf};

const SPEC: &str = "openapi/sandbox-mcp.json";

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    // From the workspace's root, so that every message names files as a reader finds them.
    let root = workspace_root();
    println!("cargo::rerun-if-changed={}", root.join(SPEC).display());
    if let Err(e) = std::env::set_current_dir(&root) {
        build_print::error!("cannot enter the workspace root {}: {e}", root.display());
        std::process::exit(1);
    }
    if let Err(errors) = sandbox_mcp_codegen::generate_client(Path::new(SPEC), &out_dir) {
        for e in &errors {
            build_print::error!("{e}");
        }
        std::process::exit(1);
    }
}

/// The workspace's root: two levels above this crate.
fn workspace_root() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default()).join("../..")
}
