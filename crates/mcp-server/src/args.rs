//! Tool arguments: validated against the tool's input schema, defaults filled in, then read by
//! the generated dispatch into typed request values.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::call::CallFailure;
use crate::tooldefs::ToolDef;
use sandbox_mcp_codegen::jsonschema;

/// The arguments of one call, after validation.
#[derive(Debug, Clone)]
pub struct Args {
    map: Map<String, Value>,
}

/// JSON Schema counts `3.0` as an integer, and models do send it; the typed client's integer
/// fields do not accept it. Where the schema says integer, a whole float becomes an integer.
fn integers_as_integers(schema: &Value, value: &mut Value) {
    let says_integer = match &schema["type"] {
        Value::String(t) => t == "integer",
        Value::Array(ts) => ts.iter().any(|t| t == "integer"),
        _ => false,
    };
    match value {
        Value::Number(n) if says_integer && n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
            {
                // Out-of-range floats stay floats; the typed client rejects those clearly.
                if f >= 0.0 && f < u64::MAX as f64 {
                    *value = Value::from(f as u64);
                } else if f < 0.0 && f >= i64::MIN as f64 {
                    *value = Value::from(f as i64);
                }
            }
        }
        Value::Object(map) => {
            if let Some(schema) = schema.as_object() {
                integers_in_object(schema, map);
            }
        }
        Value::Array(items) if schema["items"].is_object() => {
            for v in items {
                integers_as_integers(&schema["items"], v);
            }
        }
        _ => {}
    }
}

/// [`integers_as_integers`] for the members of an object, by its schema's `properties` and
/// `additionalProperties`.
fn integers_in_object(schema: &Map<String, Value>, map: &mut Map<String, Value>) {
    let extra = schema.get("additionalProperties").filter(|s| s.is_object());
    for (k, v) in map.iter_mut() {
        if let Some(s) = schema.get("properties").and_then(|p| p.get(k)) {
            integers_as_integers(s, v);
        } else if let Some(extra) = extra {
            integers_as_integers(extra, v);
        }
    }
}

impl Args {
    /// Validates `raw` against the schema the model was shown and applies defaults
    /// (including those of hidden arguments). Returns one message per problem.
    pub fn prepare(tool: &ToolDef, raw: Option<Map<String, Value>>) -> Result<Self, Vec<String>> {
        let mut map = raw.unwrap_or_default();
        // `null` for an optional argument means "not given" (the API's optional fields are
        // nullable; the model is shown the plain type, but some clients send nulls anyway).
        let required = tool.input_schema.get("required").and_then(Value::as_array);
        map.retain(|name, v| {
            !v.is_null() || required.is_some_and(|r| r.iter().any(|n| n == name.as_str()))
        });
        let value = Value::Object(map);
        let violations = jsonschema::validate_object(&tool.input_schema, &value);
        if !violations.is_empty() {
            return Err(violations.iter().map(ToString::to_string).collect());
        }
        let mut value = value;
        if let Value::Object(map) = &mut value {
            integers_in_object(&tool.input_schema, map);
        }
        let Value::Object(mut map) = value else {
            return Err(vec!["arguments must be an object".into()]);
        };
        for arg in &tool.args {
            if let Some(default) = &arg.default
                && !map.contains_key(&arg.name)
            {
                map.insert(arg.name.clone(), default.clone());
            }
        }
        Ok(Self { map })
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name)
    }

    /// Sets an argument the model does not give (a session's sandbox id).
    pub fn set(&mut self, name: &str, value: Value) {
        self.map.insert(name.to_string(), value);
    }

    fn required<T>(
        &self,
        name: &str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<T, CallFailure> {
        self.optional(name, read)?
            .ok_or_else(|| CallFailure::InvalidArgs(format!("missing required argument `{name}`")))
    }

    fn optional<T>(
        &self,
        name: &str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>, CallFailure> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| {
                CallFailure::InvalidArgs(format!(
                    "argument `{name}` has the wrong type: {}",
                    jsonschema::quote(v)
                ))
            }),
        }
    }

    pub fn string(&self, name: &str) -> Result<String, CallFailure> {
        self.required(name, |v| v.as_str().map(String::from))
    }
    pub fn opt_string(&self, name: &str) -> Result<Option<String>, CallFailure> {
        self.optional(name, |v| v.as_str().map(String::from))
    }
    pub fn u64(&self, name: &str) -> Result<u64, CallFailure> {
        self.required(name, Value::as_u64)
    }
    pub fn opt_u64(&self, name: &str) -> Result<Option<u64>, CallFailure> {
        self.optional(name, Value::as_u64)
    }
    pub fn i64(&self, name: &str) -> Result<i64, CallFailure> {
        self.required(name, Value::as_i64)
    }
    pub fn opt_i64(&self, name: &str) -> Result<Option<i64>, CallFailure> {
        self.optional(name, Value::as_i64)
    }
    pub fn f64(&self, name: &str) -> Result<f64, CallFailure> {
        self.required(name, Value::as_f64)
    }
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, CallFailure> {
        self.optional(name, Value::as_f64)
    }
    pub fn time(&self, name: &str) -> Result<chrono::DateTime<chrono::Utc>, CallFailure> {
        self.opt_time(name)?
            .ok_or_else(|| CallFailure::InvalidArgs(format!("missing required argument `{name}`")))
    }
    /// A `format: date-time` argument: RFC 3339, any offset (converted to UTC).
    pub fn opt_time(
        &self,
        name: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, CallFailure> {
        let Some(s) = self.opt_string(name)? else {
            return Ok(None);
        };
        chrono::DateTime::parse_from_rfc3339(&s)
            .map(|t| Some(t.with_timezone(&chrono::Utc)))
            .map_err(|_| {
                CallFailure::InvalidArgs(format!(
                    "argument `{name}` must be an RFC 3339 time like 2026-01-31T12:00:00Z, got {}",
                    jsonschema::quote(&Value::String(s))
                ))
            })
    }
    pub fn bool(&self, name: &str) -> Result<bool, CallFailure> {
        self.required(name, Value::as_bool)
    }
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, CallFailure> {
        self.optional(name, Value::as_bool)
    }

    /// Gathers the body fields present into the operation's generated body type.
    pub fn body<T: DeserializeOwned>(&self, fields: &[&str]) -> Result<T, CallFailure> {
        let mut body = Map::new();
        for field in fields {
            if let Some(v) = self.map.get(*field)
                && !v.is_null()
            {
                body.insert((*field).to_string(), v.clone());
            }
        }
        serde_json::from_value(Value::Object(body))
            .map_err(|e| CallFailure::InvalidArgs(format!("invalid arguments: {e}")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn whole_floats_become_integers_where_the_schema_says_integer_at_any_depth() {
        let schema = json!({
            "type": "object",
            "properties": {
                "timeout_ms": {"type": "integer"},
                "ratio": {"type": "number"},
                "shape": {"type": "object", "properties": {"cpus": {"type": ["integer", "null"]}}},
                "ports": {"type": "array", "items": {"type": "integer"}},
                "limits": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
        });
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let mut args = json!({
            "timeout_ms": 5000.0,
            "ratio": 2.0,
            "shape": {"cpus": 2.0},
            "ports": [80.0, 8080.5],
            "limits": {"pids": 64.0},
            "unknown": 1.0,
        });
        integers_in_object(&schema, args.as_object_mut().unwrap());
        assert_eq!(
            serde_json::to_string(&args).unwrap(),
            r#"{"timeout_ms":5000,"ratio":2.0,"shape":{"cpus":2},"ports":[80,8080.5],"limits":{"pids":64},"unknown":1.0}"#
        );
    }
}
