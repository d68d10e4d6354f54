//! A validator for the JSON Schema subset our tool input schemas use.
//!
//! The MCP layer validates every `tools/call` against the exact schema the model was shown, so a
//! bad argument gets a message naming the argument and the fix before anything reaches the
//! control plane. The build uses the same code to check `default` values in tool-defs.
//!
//! Why hand-written rather than a JSON Schema crate: its messages are written for a model
//! ("argument `timeout_ms` must be at most 600000"), not for a schema author; `pattern` must be
//! ECMAScript as the spec and MCP prescribe, which regress implements (the crates we looked at use
//! Rust's `regex` dialect); it must run at build time too, against defaults, without pulling a
//! schema engine into the build; and the subset our schemas use is small enough to test whole
//! (the fuzz targets check it never accepts what the typed client then refuses).
//!
//! Supported keywords: `type` (string or array), `enum`, `properties`, `required`,
//! `additionalProperties` (bool or schema), `items`, `minLength`/`maxLength` (in characters),
//! `pattern` (ECMAScript, via regress), `minimum`/`maximum`, `minItems`/`maxItems`,
//! `maxProperties`. Anything else is an annotation and ignored, as JSON Schema prescribes.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;

/// Most patterns kept compiled. Our schemas have a handful; the rest of the room is for hosted
/// servers' schemas, which are not ours to bound: past it a pattern is compiled each time.
const MAX_COMPILED: usize = 256;

/// `pattern` compiled, once per process: compiling one costs more than the rest of a call's
/// checks, and every `tools/call` checks the same few.
fn compiled(pattern: &str) -> Result<Arc<regress::Regex>, regress::Error> {
    static COMPILED: LazyLock<Mutex<HashMap<String, Arc<regress::Regex>>>> =
        LazyLock::new(Mutex::default);
    let lock = || COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(re) = lock().get(pattern) {
        return Ok(re.clone());
    }
    let re = Arc::new(regress::Regex::new(pattern)?);
    let mut compiled = lock();
    if compiled.len() < MAX_COMPILED {
        compiled.insert(pattern.to_string(), re.clone());
    }
    Ok(re)
}

/// One violation, with a JSON-pointer-like location (`env.PATH`, `items[3]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Dotted path from the root; empty for the root itself.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "argument `{}` {}", self.path, self.message)
        }
    }
}

/// Validates `value` against `schema`; returns every violation found (at most `MAX_VIOLATIONS`).
pub fn validate(schema: &Value, value: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    check(schema, value, "", &mut out);
    out
}

/// [`validate`] against a schema that is an object (a tool's input schema).
pub fn validate_object(schema: &serde_json::Map<String, Value>, value: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    check_schema(schema, value, "", &mut out);
    out
}

const MAX_VIOLATIONS: usize = 10;
/// Values are quoted in messages, but never at a length that would flood a model's context.
const MAX_QUOTED: usize = 60;

/// The spec's pattern for strings that must not contain NUL (paths, commands, code).
const NO_NUL: &str = "^[^\\u0000]*$";

fn push(out: &mut Vec<Violation>, path: &str, message: String) {
    if out.len() < MAX_VIOLATIONS {
        out.push(Violation {
            path: path.to_string(),
            message,
        });
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn matches_type(expected: &str, value: &Value) -> bool {
    match expected {
        "integer" => match value {
            // Whole floats count (`3.0`), within 64 bits: every integer of this API is one.
            Value::Number(n) => {
                n.is_i64()
                    || n.is_u64()
                    || n.as_f64().is_some_and(|f| {
                        f.fract() == 0.0 && f >= i64::MIN as f64 && f < u64::MAX as f64
                    })
            }
            _ => false,
        },
        "number" => value.is_number(),
        other => type_name(value) == other,
    }
}

/// A short, safe rendering of a value for an error message.
pub fn quote(value: &Value) -> String {
    let text = match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    if text.chars().count() > MAX_QUOTED {
        let head: String = text.chars().take(MAX_QUOTED).collect();
        format!("{head}… ({} characters)", text.chars().count())
    } else {
        text
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<Violation>) {
    // `true` or an empty schema accepts anything.
    if let Some(schema) = schema.as_object() {
        check_schema(schema, value, path, out);
    }
}

fn check_schema(
    schema: &serde_json::Map<String, Value>,
    value: &Value,
    path: &str,
    out: &mut Vec<Violation>,
) {
    if let Some(expected) = schema.get("type") {
        let allowed: Vec<&str> = match expected {
            Value::String(s) => vec![s.as_str()],
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !allowed.is_empty() && !allowed.iter().any(|t| matches_type(t, value)) {
            let wanted = allowed.join(" or ");
            push(
                out,
                path,
                format!(
                    "must be {} {wanted}, got {} {}",
                    article(&wanted),
                    type_name(value),
                    quote(value)
                ),
            );
            return;
        }
    }

    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(value)
    {
        let list: Vec<String> = options.iter().map(quote).collect();
        push(
            out,
            path,
            format!("must be one of {}, got {}", list.join(", "), quote(value)),
        );
        return;
    }

    match value {
        Value::String(s) => check_string(schema, s, path, out),
        Value::Number(_) => check_number(schema, value, path, out),
        Value::Array(items) => check_array(schema, items, path, out),
        Value::Object(map) => check_object(schema, map, path, out),
        Value::Null | Value::Bool(_) => {}
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The schema's own description, appended to format errors so the model learns the format.
fn hint(schema: &serde_json::Map<String, Value>) -> String {
    match schema.get("description").and_then(Value::as_str) {
        Some(d) if d.len() <= 200 => format!(" ({})", d.trim_end_matches('.')),
        _ => String::new(),
    }
}

fn check_string(
    schema: &serde_json::Map<String, Value>,
    s: &str,
    path: &str,
    out: &mut Vec<Violation>,
) {
    // JSON Schema counts length in code points, not bytes.
    let len = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        push(
            out,
            path,
            format!("is {len} characters long; the limit is {max}"),
        );
        return;
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        let message = if len == 0 {
            "must not be empty".to_string()
        } else {
            format!(
                "is {len} characters long; it must be at least {min}{}",
                hint(schema)
            )
        };
        push(out, path, message);
        return;
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        match compiled(pattern) {
            // The most common pattern, "no NUL anywhere", is named in words: a model can act
            // on "contains a NUL character" but not on a regular expression.
            Ok(_) if pattern == NO_NUL && s.contains('\0') => push(
                out,
                path,
                format!(
                    "{} contains a NUL character (\\u0000), which is never allowed here",
                    quote(&Value::String(s.to_string()))
                ),
            ),
            Ok(re) if re.find(s).is_none() => push(
                out,
                path,
                format!(
                    "{} does not match the pattern {pattern}{}",
                    quote(&Value::String(s.to_string())),
                    hint(schema)
                ),
            ),
            Ok(_) => {}
            Err(e) => push(
                out,
                path,
                format!("has an invalid pattern in its schema: {e}"),
            ),
        }
    }
}

fn check_number(
    schema: &serde_json::Map<String, Value>,
    value: &Value,
    path: &str,
    out: &mut Vec<Violation>,
) {
    let Some(n) = value.as_f64() else { return };
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && n > max
    {
        push(
            out,
            path,
            format!("is {}; the maximum is {}", quote(value), fmt_num(max)),
        );
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && n < min
    {
        push(
            out,
            path,
            format!("is {}; the minimum is {}", quote(value), fmt_num(min)),
        );
    }
}

fn fmt_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn check_array(
    schema: &serde_json::Map<String, Value>,
    items: &[Value],
    path: &str,
    out: &mut Vec<Violation>,
) {
    let len = items.len() as u64;
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && len > max
    {
        push(out, path, format!("has {len} items; the limit is {max}"));
        return;
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && len < min
    {
        push(
            out,
            path,
            format!("has {len} items; it needs at least {min}"),
        );
        return;
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
}

fn check_object(
    schema: &serde_json::Map<String, Value>,
    map: &serde_json::Map<String, Value>,
    path: &str,
    out: &mut Vec<Violation>,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        push(
            out,
            path,
            format!("has {} entries; the limit is {max}", map.len()),
        );
        return;
    }
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                let what = if path.is_empty() {
                    format!("missing required argument `{name}`")
                } else {
                    format!("is missing the required field `{name}`")
                };
                push(out, path, what);
            }
        }
    }
    for (key, item) in map {
        let child = join(path, key);
        if let Some(prop) = properties.and_then(|p| p.get(key)) {
            check(prop, item, &child, out);
            continue;
        }
        match schema.get("additionalProperties") {
            Some(Value::Bool(false)) => {
                let known: Vec<&str> = properties
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let message = if path.is_empty() {
                    format!(
                        "unknown argument `{key}`; this tool takes: {}",
                        known.join(", ")
                    )
                } else {
                    format!(
                        "has an unknown field `{key}`; allowed: {}",
                        known.join(", ")
                    )
                };
                if path.is_empty() {
                    push(out, "", message);
                } else {
                    push(out, path, message);
                }
            }
            Some(extra @ Value::Object(_)) => check(extra, item, &child, out),
            _ => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["command"],
            "properties": {
                "command": {"type": "string", "minLength": 1, "maxLength": 10},
                "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000},
                "mode": {"type": "string", "enum": ["utf8", "base64"]},
                "env": {"type": "object", "maxProperties": 2, "additionalProperties": {"type": "string", "maxLength": 3}},
                "id": {"type": "string", "pattern": "^sbx_[0-9a-z]{4}$"},
                "name": {"type": ["string", "null"]}
            }
        })
    }

    fn messages(value: Value) -> Vec<String> {
        validate(&schema(), &value)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn whole_floats_are_integers_within_64_bits() {
        let s = json!({"type": "integer"});
        assert!(validate(&s, &json!(3.0)).is_empty());
        assert!(validate(&s, &json!(-7)).is_empty());
        assert!(!validate(&s, &json!(3.5)).is_empty());
        assert!(!validate(&s, &json!(1e300)).is_empty());
        assert!(!validate(&s, &json!(-1e300)).is_empty());
    }

    #[test]
    fn accepts_a_valid_call() {
        assert!(
            messages(json!({"command": "ls", "timeout_ms": 5, "env": {"A": "b"}, "name": null}))
                .is_empty()
        );
    }

    #[test]
    fn names_each_bad_argument() {
        assert_eq!(
            messages(json!({})),
            vec!["missing required argument `command`"]
        );
        assert_eq!(
            messages(json!({"command": 5})),
            vec!["argument `command` must be a string, got integer 5"]
        );
        assert_eq!(
            messages(json!({"command": "x", "timeout_ms": 600001})),
            vec!["argument `timeout_ms` is 600001; the maximum is 600000"]
        );
        assert_eq!(
            messages(json!({"command": "x", "timeout_ms": "5"})),
            vec!["argument `timeout_ms` must be an integer, got string \"5\""]
        );
        assert_eq!(
            messages(json!({"command": "x", "bogus": 1})),
            vec![
                "unknown argument `bogus`; this tool takes: command, timeout_ms, mode, env, id, name"
            ]
        );
        assert_eq!(
            messages(json!({"command": "x", "mode": "hex"})),
            vec!["argument `mode` must be one of \"utf8\", \"base64\", got \"hex\""]
        );
        assert_eq!(
            messages(json!({"command": "x", "env": {"A": "long!"}})),
            vec!["argument `env.A` is 5 characters long; the limit is 3"]
        );
        assert_eq!(
            messages(json!({"command": "x", "id": "nope"})),
            vec!["argument `id` \"nope\" does not match the pattern ^sbx_[0-9a-z]{4}$"]
        );
        assert_eq!(
            messages(json!({"command": ""})),
            vec!["argument `command` must not be empty"]
        );
    }

    #[test]
    fn quotes_huge_values_briefly() {
        let huge = "y".repeat(1_000_000);
        let out = messages(json!({ "command": huge }));
        assert_eq!(
            out,
            vec!["argument `command` is 1000000 characters long; the limit is 10"]
        );
        let q = quote(&Value::String("z".repeat(500)));
        assert!(q.len() < 120, "{q}");
    }

    #[test]
    fn counts_characters_not_bytes() {
        assert!(messages(json!({"command": "ééééééééé"})).is_empty());
    }
}
