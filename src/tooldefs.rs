//! The tool registry generated at build time from `tool-defs/*.toml` and `openapi/`.
//!
//! `build.rs` validates every tool-def against the spec and writes the result to
//! `OUT_DIR/tools.json`; here it is embedded in the binary and parsed once, on first use.

pub mod model;

use std::sync::LazyLock;

pub use model::{
    Annotations, ArgDef, ArgLocation, Cap, InventoryEntry, Profile, Registry, ToolDef,
};

const REGISTRY_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/tools.json"));

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    // The JSON was produced by serializing this very type in build.rs, so it always parses;
    // an empty registry (never served) is the fallback rather than a panic.
    serde_json::from_str(REGISTRY_JSON).unwrap_or_else(|e| {
        tracing::error!("embedded tool registry is corrupt: {e}");
        Registry {
            api_title: String::new(),
            api_version: String::new(),
            tools: Vec::new(),
            inventory: Vec::new(),
            toolsets: Default::default(),
            profiles: Default::default(),
        }
    })
});

/// The registry compiled into this binary.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

impl Registry {
    pub fn tool(&self, name: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Resolves `--tools` within a profile's tools (`None`: the plain tools).
    pub fn select_in(&self, profile: Option<&str>, spec: &str) -> Result<Vec<&ToolDef>, String> {
        let Some(name) = profile else {
            return self.select(spec);
        };
        let profile = self
            .profiles
            .get(name)
            .ok_or_else(|| format!("no tool profile `{name}`"))?;
        let wanted: Vec<&str> = self.select(spec)?.iter().map(|t| t.name.as_str()).collect();
        Ok(profile
            .tools
            .iter()
            .filter(|t| wanted.contains(&t.name.as_str()))
            .collect())
    }

    /// Resolves `--tools`: `all`, a toolset name, or a comma-separated list of tool names.
    pub fn select(&self, spec: &str) -> Result<Vec<&ToolDef>, String> {
        let spec = spec.trim();
        if spec.is_empty() || spec == "all" {
            return Ok(self.tools.iter().collect());
        }
        if let Some(names) = self.toolsets.get(spec) {
            return Ok(self
                .tools
                .iter()
                .filter(|t| names.contains(&t.name))
                .collect());
        }
        let mut wanted = Vec::new();
        for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if self.tool(name).is_none() {
                return Err(format!(
                    "unknown tool or toolset `{name}`; toolsets: all, {}; tools: {}",
                    self.toolsets.keys().cloned().collect::<Vec<_>>().join(", "),
                    self.tools
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            wanted.push(name.to_string());
        }
        Ok(self
            .tools
            .iter()
            .filter(|t| wanted.contains(&t.name))
            .collect())
    }
}
