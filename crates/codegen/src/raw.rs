//! Raw tool-def files: the TOML exactly as written, with unknown keys rejected.
//!
//! A file is parsed in two steps so an error can name the tool it is in: first into a TOML table,
//! then each `[[tool]]` entry on its own into [`RawTool`].

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::CodegenError;

/// One `tool-defs/*.toml` file.
#[derive(Debug, Default)]
pub struct RawFile {
    pub name: String,
    pub defaults: RawDefaults,
    pub tools: Vec<RawTool>,
    pub excludes: Vec<RawExclude>,
    pub profiles: Vec<RawProfile>,
}

/// `[[profile]]`: a tool surface derived from all the tools.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProfile {
    pub name: String,
    pub description: String,
    /// Argument filled from the session instead of given by the model.
    pub session_arg: Option<String>,
    /// Tools left out of this profile.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The profile's own messages to the model, by situation (see `PROFILE_ERRORS`).
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
}

/// `[defaults]`: applies to every tool in the file unless the tool says otherwise.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: RawAnnotations,
}

/// `[[tool]]`: one MCP tool bound to one operation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTool {
    pub name: String,
    pub operation: String,
    pub title: String,
    pub description: String,
    #[serde(default)]
    pub annotations: RawAnnotations,
    #[serde(default)]
    pub args: BTreeMap<String, RawArg>,
    #[serde(default)]
    pub caps: BTreeMap<String, RawCap>,
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
    pub timeout_arg_ms: Option<String>,
    #[serde(default)]
    pub toolsets: Vec<String>,
    /// An NDJSON variant of `operation`, used when the client asks for progress.
    pub stream_operation: Option<String>,
    /// A base64 field of the result sent as MCP image content instead of JSON.
    pub image: Option<RawImage>,
}

/// `image = { field = "…", mime_type = "image/png" }`: a base64 string field of the result
/// (a dotted path into nested objects) that the model gets as an image.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImage {
    pub field: String,
    pub mime_type: String,
}

/// Annotation overrides; unset ones are inferred from the HTTP method.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAnnotations {
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
    pub idempotent: Option<bool>,
    pub open_world: Option<bool>,
}

/// `[tool.args.NAME]`: override one argument.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawArg {
    /// Hide the argument from the model; `default` is sent instead.
    #[serde(default)]
    pub hide: bool,
    /// Hide the argument only when the server serves one of these toolsets (`--tools core`):
    /// an option a small toolset cannot afford to describe, which `all` still offers.
    #[serde(default)]
    pub hide_in: Vec<String>,
    /// Value sent when the model omits the argument (shown as the schema's `default`).
    pub default: Option<toml::Value>,
    /// Replaces the description taken from the spec.
    pub description: Option<String>,
}

/// `[tool.caps.FIELD]`: cap one top-level field of the result.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCap {
    pub max_bytes: Option<u64>,
    pub max_items: Option<u64>,
}

/// `[[exclude]]`: an operation deliberately not offered as a tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExclude {
    pub operation: String,
    pub reason: String,
}

const TOP_LEVEL_KEYS: [&str; 4] = ["defaults", "tool", "exclude", "profile"];

/// Parses one file, collecting every error in it.
pub fn parse_file(name: &str, text: &str) -> Result<RawFile, Vec<CodegenError>> {
    let err = |tool: Option<String>, message: String| CodegenError {
        file: name.to_string(),
        tool,
        message,
    };
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(" at line {line}, column {column}")
            })
            .unwrap_or_default();
        vec![err(
            None,
            format!(
                "is not valid TOML{at}: {}",
                e.message().trim().replace('\n', " ")
            ),
        )]
    })?;
    let mut errors = Vec::new();
    let mut file = RawFile {
        name: name.to_string(),
        ..RawFile::default()
    };
    for (key, value) in table {
        match key.as_str() {
            "defaults" => match value.try_into::<RawDefaults>() {
                Ok(d) => file.defaults = d,
                Err(e) => errors.push(err(None, format!("[defaults]: {}", clean(&e)))),
            },
            "tool" => {
                let toml::Value::Array(entries) = value else {
                    errors.push(err(
                        None,
                        "`tool` must be an array of tables: write each tool as `[[tool]]`".into(),
                    ));
                    continue;
                };
                for (i, entry) in entries.into_iter().enumerate() {
                    let label = entry
                        .get("name")
                        .and_then(toml::Value::as_str)
                        .map(String::from)
                        .unwrap_or_else(|| format!("#{} (unnamed)", i + 1));
                    match entry.try_into::<RawTool>() {
                        Ok(t) => file.tools.push(t),
                        Err(e) => errors.push(err(Some(label), clean(&e))),
                    }
                }
            }
            "exclude" => {
                let toml::Value::Array(entries) = value else {
                    errors.push(err(
                        None,
                        "`exclude` must be an array of tables: write `[[exclude]]`".into(),
                    ));
                    continue;
                };
                for entry in entries {
                    let label = entry
                        .get("operation")
                        .and_then(toml::Value::as_str)
                        .map(|o| format!("[[exclude]] {o}"));
                    match entry.try_into::<RawExclude>() {
                        Ok(x) => file.excludes.push(x),
                        Err(e) => errors.push(err(label, clean(&e))),
                    }
                }
            }
            "profile" => {
                let toml::Value::Array(entries) = value else {
                    errors.push(err(
                        None,
                        "`profile` must be an array of tables: write `[[profile]]`".into(),
                    ));
                    continue;
                };
                for entry in entries {
                    let label = entry
                        .get("name")
                        .and_then(toml::Value::as_str)
                        .map(|n| format!("[[profile]] {n}"));
                    match entry.try_into::<RawProfile>() {
                        Ok(p) => file.profiles.push(p),
                        Err(e) => errors.push(err(label, clean(&e))),
                    }
                }
            }
            other => errors.push(err(
                None,
                format!(
                    "unknown top-level key `{other}`; a tool-def file holds only {}.{}",
                    TOP_LEVEL_KEYS
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    crate::did_you_mean(other, TOP_LEVEL_KEYS.into_iter())
                ),
            )),
        }
    }
    if errors.is_empty() {
        Ok(file)
    } else {
        Err(errors)
    }
}

/// serde's messages, on one line and with the fix spelled out for unknown keys.
fn clean(e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    if message.starts_with("unknown field") {
        format!("{message}; remove the key or correct its spelling")
    } else if message.starts_with("missing field") {
        format!("{message}; every tool needs it")
    } else {
        message
    }
}
