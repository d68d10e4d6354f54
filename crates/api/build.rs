//! Generates, from the spec in the workspace's top-level `openapi/` with `sandbox-mcp-codegen`,
//! the typed control-plane client (`OUT_DIR/client.rs`), the engine's side of the same
//! operations (`OUT_DIR/server.rs`, compiled only with the `server` feature) and the limits the
//! spec states (`OUT_DIR/limits.rs`).

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
    let generated = sandbox_mcp_codegen::generate_client(Path::new(SPEC), &out_dir)
        .and_then(|()| sandbox_mcp_codegen::generate_server(Path::new(SPEC), &out_dir));
    if let Err(errors) = generated {
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
