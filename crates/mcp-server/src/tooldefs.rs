//! The tool registry generated at build time from `tool-defs/*.toml` and `openapi/`.
//!
//! This crate's `build.rs` validates every tool-def against the spec and writes the result to
//! `OUT_DIR/tools.json`; here it is embedded in the binary and parsed once, on first use.

use std::sync::LazyLock;

pub use sandbox_mcp_codegen::model::{
    Annotations, ArgDef, ArgLocation, Cap, InventoryEntry, Names, Profile, Registry, ToolDef,
};

const REGISTRY_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/tools.json"));
const NAMES_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/tool-names.json"));

/// Checks a `--tools` spec against the names alone (microseconds), so that a bad one fails at
/// start without waiting for the registry.
pub fn check_tools(profile: Option<&str>, spec: &str) -> Result<(), String> {
    let names: Names = serde_json::from_str(NAMES_JSON)
        .map_err(|e| format!("embedded tool names are corrupt: {e}"))?;
    names.check(profile, spec)
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    // The JSON was produced by serializing this very type in build.rs, so it always parses;
    // an empty registry (never served) is the fallback rather than a panic.
    let registry: Registry = serde_json::from_str(REGISTRY_JSON).unwrap_or_else(|e| {
        tracing::error!("embedded tool registry is corrupt: {e}");
        Registry {
            api_title: String::new(),
            api_version: String::new(),
            tools: Vec::new(),
            inventory: Default::default(),
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
