//! The validated tool registry: what the build writes to `OUT_DIR/tools.json` and the MCP layer
//! reads back at startup. Both sides use these types, so they stay free of dependencies beyond
//! serde.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::deferred::Deferred;

/// Every tool the server offers and the operation inventory behind them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Registry {
    /// `info.title` and `info.version` of the spec the registry was built from.
    pub api_title: String,
    pub api_version: String,
    /// Tools in the order `tools/list` returns them (file name, then position in the file).
    pub tools: Vec<ToolDef>,
    /// Every operation of the spec: bound to which tools, or excluded and why (read on first
    /// use: `sandbox-mcp tools` and the tests need it, a server does not).
    pub inventory: Deferred<Vec<InventoryEntry>>,
    /// Named subsets of tools (`--tools core`), from the tools' `toolsets` keys.
    #[serde(default)]
    pub toolsets: BTreeMap<String, Vec<String>>,
    /// Alternative tool surfaces (`--session-sandbox` uses `session`), from `[[profile]]` tables
    /// (read on first use).
    #[serde(default)]
    pub profiles: Deferred<BTreeMap<String, Profile>>,
    /// Per toolset, its tools whose schema leaves out arguments hidden there (`hide_in`); made
    /// by [`Registry::with_toolset_schemas`] when the registry is loaded, never stored.
    #[serde(skip)]
    pub narrowed: BTreeMap<String, Vec<ToolDef>>,
}

/// A tool surface derived from the registry: some tools left out, one argument bound to the
/// session instead of given by the model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    pub description: String,
    /// The argument every tool takes from the session (hidden from the model).
    pub session_arg: Option<String>,
    /// The profile's own messages to the model (`session_gone`, `no_session`).
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
    pub tools: Vec<ToolDef>,
}

/// A JSON Schema object, shared: the MCP tool the model is shown holds this very one, so
/// building the tools at start copies no schema.
pub type Schema = Arc<serde_json::Map<String, serde_json::Value>>;

/// A schema from a JSON value; anything but an object (never made by the build) is the empty
/// schema.
pub fn schema(value: serde_json::Value) -> Schema {
    match value {
        serde_json::Value::Object(map) => Arc::new(map),
        _ => Schema::default(),
    }
}

/// One MCP tool bound to one API operation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub title: String,
    pub description: String,
    /// `tool-defs/<file>.toml` the tool was defined in (for error messages and `sandbox-mcp tools`).
    pub source: String,
    pub operation: String,
    pub method: String,
    pub path: String,
    pub annotations: Annotations,
    /// JSON Schema of the arguments: `type: object`, every `$ref` inlined, constraints kept.
    pub input_schema: Schema,
    /// JSON Schema of `structuredContent` on success.
    pub output_schema: Schema,
    /// Where each argument goes in the HTTP request.
    pub args: Vec<ArgDef>,
    /// Output caps applied to the response before the model sees it.
    pub caps: Vec<Cap>,
    /// Error messages by error code (`not_found`), HTTP status (`404`) or transport failure
    /// (`unreachable`, `deadline`, `bad_response`), with `{placeholders}`.
    pub errors: BTreeMap<String, String>,
    /// Integer argument (milliseconds) that extends the call's deadline, e.g. an exec timeout.
    pub timeout_arg_ms: Option<String>,
    /// NDJSON variant of `operation` with the same arguments, used when the client asks for
    /// progress: its `output` events become progress notifications, its `result` the result.
    #[serde(default)]
    pub stream_operation: Option<String>,
    /// In a profile: the argument filled from the session (hidden from the model).
    #[serde(default)]
    pub session_arg: Option<String>,
    /// A base64 field of the result that becomes MCP image content (and leaves the JSON).
    #[serde(default)]
    pub image: Option<Image>,
}

/// A result field the model sees as an image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Image {
    /// Path to the field: `png_base64`, or `screenshot.png_base64` inside a nested object.
    pub field: Vec<String>,
    pub mime_type: String,
}

/// MCP tool annotations, resolved: HTTP-method defaults with TOML overrides applied.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Annotations {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

/// Where an argument lives in the HTTP request.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ArgLocation {
    Path,
    Query,
    Body,
}

/// One argument of a tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ArgDef {
    pub name: String,
    pub location: ArgLocation,
    /// Required by the operation and without a default.
    pub required: bool,
    /// Not shown to the model; `default` is always sent.
    pub hidden: bool,
    /// Sent when the model omits the argument.
    pub default: Option<serde_json::Value>,
    /// Toolsets whose schema leaves the argument out (`hide_in`); it is offered everywhere else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden_in: Vec<String>,
}

/// A cap on one top-level field of a tool's result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cap {
    pub field: String,
    /// Strings longer than this keep their head and tail with a marker between.
    pub max_bytes: Option<u64>,
    /// Arrays longer than this keep their first `max_items` items.
    pub max_items: Option<u64>,
}

/// One operation of the spec and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InventoryEntry {
    pub operation: String,
    pub method: String,
    pub path: String,
    /// Tools bound to the operation (empty when excluded).
    pub tools: Vec<String>,
    /// Why no tool is bound, when excluded.
    pub excluded: Option<String>,
}

impl Registry {
    /// Computes the schema each toolset shows of a tool that hides arguments there: the
    /// argument leaves `properties` and `required`, so a call that sends it is refused as
    /// unknown, exactly as the model was told.
    pub fn with_toolset_schemas(mut self) -> Self {
        let mut narrowed: BTreeMap<String, Vec<ToolDef>> = BTreeMap::new();
        for tool in &self.tools {
            for arg in &tool.args {
                for set in &arg.hidden_in {
                    let list = narrowed.entry(set.clone()).or_default();
                    let idx = match list.iter().position(|t| t.name == tool.name) {
                        Some(i) => i,
                        None => {
                            list.push(tool.clone());
                            list.len() - 1
                        }
                    };
                    // This tool's own copy of the schema, from the first argument it hides.
                    let schema = Arc::make_mut(&mut list[idx].input_schema);
                    if let Some(props) =
                        schema.get_mut("properties").and_then(|p| p.as_object_mut())
                    {
                        props.remove(&arg.name);
                    }
                    if let Some(req) = schema.get_mut("required").and_then(|r| r.as_array_mut()) {
                        req.retain(|r| r.as_str() != Some(arg.name.as_str()));
                    }
                }
            }
        }
        self.narrowed = narrowed;
        self
    }

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

    /// The names `--tools` may use, without the rest (a few hundred bytes to parse, where the
    /// registry is hundreds of kilobytes).
    pub fn names(&self) -> Names {
        Names {
            tools: self.tools.iter().map(|t| t.name.clone()).collect(),
            toolsets: self.toolsets.keys().cloned().collect(),
            profiles: self.profiles.keys().cloned().collect(),
        }
    }

    /// Resolves `--tools`: `all`, a toolset name, or a comma-separated list of tool names.
    pub fn select(&self, spec: &str) -> Result<Vec<&ToolDef>, String> {
        let spec = spec.trim();
        if spec.is_empty() || spec == "all" {
            return Ok(self.tools.iter().collect());
        }
        if let Some(names) = self.toolsets.get(spec) {
            let narrowed = self.narrowed.get(spec);
            return Ok(self
                .tools
                .iter()
                .filter(|t| names.contains(&t.name))
                .map(|t| {
                    narrowed
                        .and_then(|n| n.iter().find(|n| n.name == t.name))
                        .unwrap_or(t)
                })
                .collect());
        }
        self.names().check(None, spec)?;
        let wanted: Vec<&str> = spec
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        Ok(self
            .tools
            .iter()
            .filter(|t| wanted.contains(&t.name.as_str()))
            .collect())
    }
}

/// The names of a registry's tools, toolsets and profiles: enough to check a `--tools` spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Names {
    pub tools: Vec<String>,
    pub toolsets: Vec<String>,
    pub profiles: Vec<String>,
}

impl Names {
    /// Whether `--tools` (within `profile`, when given) names only what exists; else why not.
    pub fn check(&self, profile: Option<&str>, spec: &str) -> Result<(), String> {
        if let Some(p) = profile
            && !self.profiles.iter().any(|x| x == p)
        {
            return Err(format!("no tool profile `{p}`"));
        }
        let spec = spec.trim();
        if spec.is_empty() || spec == "all" || self.toolsets.iter().any(|t| t == spec) {
            return Ok(());
        }
        for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !self.tools.iter().any(|t| t == name) {
                return Err(format!(
                    "unknown tool or toolset `{name}`; toolsets: all, {}; tools: {}",
                    self.toolsets.join(", "),
                    self.tools.join(", ")
                ));
            }
        }
        Ok(())
    }
}
