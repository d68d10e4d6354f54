//! Generates, into `OUT_DIR`, the MCP tool surface derived from `tool-defs/` and `openapi/` — the
//! validated tool registry and the dispatch from tool name to typed client call (the client
//! itself is the `sandbox-mcp-api` crate's) — with `sandbox-mcp-codegen` (`crates/codegen/`);
//! and links the binary at a fixed address.

use std::path::{Path, PathBuf};

const SPEC: &str = "openapi/sandbox-mcp.json";
const TOOL_DEFS: &str = "tool-defs";

fn main() {
    println!("cargo::rerun-if-changed={SPEC}");
    println!("cargo::rerun-if-changed={TOOL_DEFS}");
    // The binary is linked at a fixed address (not PIE). Every sandbox's agent is this binary,
    // and a PIE's relocated read-only data (~0.5 MiB of pointer tables: HPACK, SQLite, generated
    // code) becomes private, dirty memory in each process that loads it — half of what an idle
    // sandbox costs — and its relocation takes time at every start. Fixed, those pages stay
    // shared with the page cache. What it costs: the binary's own code and data are not
    // randomized (libraries, heap, stacks and mappings still are); see docs/security.md.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        // A static build (`+crt-static`) is a static PIE unless the code is built for a fixed
        // address too, and `-no-pie` on a static PIE's link makes a binary that crashes at start:
        // refuse the build rather than make that binary.
        let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
        let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
        if features.split(',').any(|f| f == "crt-static")
            && !flags.contains("relocation-model=static")
        {
            build_print::error!(
                "a static build needs `-C relocation-model=static` besides `+crt-static` (alone, \
                 it links a static PIE that crashes at start); build it with `cargo build-static`"
            );
            std::process::exit(1);
        }
        println!("cargo::rustc-link-arg-bins=-no-pie");
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
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
