//! The tool registry generated at build time from `tool-defs/*.toml` and `openapi/`.
//!
//! This crate's `build.rs` validates every tool-def against the spec and writes the result to
//! `OUT_DIR/tools.json`; here it is embedded in the binary and parsed once, on first use.

use std::sync::LazyLock;

pub use sandbox_mcp_codegen::model::{
    Annotations, ArgDef, ArgLocation, Cap, InventoryEntry, Profile, Registry, ToolDef,
};

const REGISTRY_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/tools.json"));

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    // The JSON was produced by serializing this very type in build.rs, so it always parses;
    // an empty registry (never served) is the fallback rather than a panic.
    let registry: Registry = serde_json::from_str(REGISTRY_JSON).unwrap_or_else(|e| {
        tracing::error!("embedded tool registry is corrupt: {e}");
        Registry {
            api_title: String::new(),
            api_version: String::new(),
            tools: Vec::new(),
            inventory: Vec::new(),
            toolsets: Default::default(),
            profiles: Default::default(),
            narrowed: Default::default(),
        }
    });
    registry.with_toolset_schemas()
});

/// The registry compiled into this binary.
pub fn registry() -> &'static Registry {
    &REGISTRY
}
