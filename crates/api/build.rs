//! Generates the typed control-plane client (`OUT_DIR/client.rs`) from the spec in the
//! workspace's top-level `openapi/`, with `sandbox-mcp-codegen`.

use std::path::{Path, PathBuf};

const SPEC: &str = "../../openapi/sandbox-mcp.json";

fn main() {
    println!("cargo::rerun-if-changed={SPEC}");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    if let Err(errors) = sandbox_mcp_codegen::generate_client(Path::new(SPEC), &out_dir) {
        for e in &errors {
            build_print::error!("{e}");
        }
        std::process::exit(1);
    }
}
