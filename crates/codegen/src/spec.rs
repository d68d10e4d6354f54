//! The OpenAPI document as the generator needs it: operations with their parameters, request body
//! and success response, and a converter from OpenAPI 3.0 schemas to self-contained JSON Schemas.

use std::collections::BTreeMap;

use openapiv3::{OpenAPI, Parameter, ReferenceOr};
use serde_json::{Map, Value};

use crate::CodegenError;

const RUST_KEYWORDS: [&str; 38] = [
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use",
    "where", "while", "gen",
];

/// A parsed spec and its operations in document order.
pub struct Spec {
    pub file: String,
    pub api: OpenAPI,
    pub operations: Vec<Operation>,
    /// `components.schemas` as JSON, for resolving `$ref`s.
    schemas: Map<String, Value>,
}

/// Where a parameter or body field comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Path,
    Query,
    Body,
}

/// One argument of an operation, before tool-def overrides.
#[derive(Debug, Clone)]
pub struct OpArg {
    pub name: String,
    pub location: Location,
    pub required: bool,
    /// JSON Schema of the value, description included.
    pub schema: Value,
    /// The `components.schemas` entry a parameter's schema refers to, if it is a `$ref`.
    pub schema_ref: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Operation {
    pub id: String,
    pub method: String,
    pub path: String,
    pub args: Vec<OpArg>,
    /// Name of the `components.schemas` entry the request body refers to.
    pub body_type: Option<String>,
    /// JSON Schema of the success response body (`type: object`); for a streaming operation, the
    /// schema of one event.
    pub response_schema: Value,
    /// The success response is NDJSON (`application/x-ndjson`), one event per line.
    pub streaming: bool,
    /// The request body is raw bytes (`application/octet-stream`, an upload): such an
    /// operation has no arguments to give a model and can only be excluded from tools.
    pub raw_body: bool,
    /// The request body must be given (`requestBody.required`).
    pub body_required: bool,
    /// The success status code (the one 2xx response, or 101 for a WebSocket).
    pub status: u16,
    /// A WebSocket (`x-dropshot-websocket`, answered `101`): the protocol is in the messages, so
    /// such an operation has no result to give a model and can only be excluded from tools.
    pub websocket: bool,
    /// The operation's `summary`, else its `description`.
    pub summary: Option<String>,
    /// The operation acts for a caller, whose tenant it may narrow itself to; `false` where the
    /// spec says `x-tenant-scoped: false` (the engine's health, the same for everyone).
    pub tenant_scoped: bool,
}

/// Media type of streamed responses.
pub const NDJSON: &str = "application/x-ndjson";

impl Spec {
    pub fn parse(file: &str, text: &str) -> Result<Self, CodegenError> {
        let fail = |message: String| CodegenError {
            file: file.to_string(),
            tool: None,
            message,
        };
        let api: OpenAPI = serde_json::from_str(text)
            .map_err(|e| fail(format!("is not a valid OpenAPI 3.0 document: {e}")))?;
        if !api.openapi.starts_with("3.0.") {
            return Err(fail(format!(
                "declares OpenAPI {}; the client generator needs 3.0.x",
                api.openapi
            )));
        }
        let schemas = api
            .components
            .as_ref()
            .map(|c| serde_json::to_value(&c.schemas))
            .transpose()
            .map_err(|e| fail(format!("cannot read components.schemas: {e}")))?
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        let mut spec = Spec {
            file: file.to_string(),
            api,
            operations: Vec::new(),
            schemas,
        };
        spec.operations = spec.walk().map_err(fail)?;
        Ok(spec)
    }

    /// `components.schemas` as the spec writes them (OpenAPI 3.0 schemas, `$ref`s unresolved).
    pub fn components(&self) -> &Map<String, Value> {
        &self.schemas
    }

    pub fn operation(&self, id: &str) -> Option<&Operation> {
        self.operations.iter().find(|o| o.id == id)
    }

    /// Walks `paths` directly: `OpenAPI::operations()` would skip path-level parameters.
    fn walk(&self) -> Result<Vec<Operation>, String> {
        let mut out = Vec::new();
        for (path, item) in &self.api.paths.paths {
            let ReferenceOr::Item(item) = item else {
                return Err(format!("path `{path}` is a $ref; inline it"));
            };
            let methods = [
                ("GET", &item.get),
                ("PUT", &item.put),
                ("POST", &item.post),
                ("DELETE", &item.delete),
                ("PATCH", &item.patch),
            ];
            for (method, op) in methods {
                let Some(op) = op else { continue };
                let id = op.operation_id.clone().ok_or_else(|| {
                    format!("{method} {path} has no operationId; every operation needs one")
                })?;
                let mut args = Vec::new();
                for param in item.parameters.iter().chain(op.parameters.iter()) {
                    let param = self.resolve_parameter(param)?;
                    args.retain(|a: &OpArg| a.name != param.name); // operation-level wins
                    args.push(param);
                }
                let raw_body = matches!(&op.request_body, Some(ReferenceOr::Item(b))
                    if b.content.len() == 1 && b.content.contains_key("application/octet-stream"));
                let body_type = match &op.request_body {
                    None => None,
                    Some(_) if raw_body => None,
                    Some(body) => {
                        let (name, required_fields, properties) = self.body_fields(&id, body)?;
                        for (field, schema) in properties {
                            if args.iter().any(|a| a.name == field) {
                                return Err(format!(
                                    "operation `{id}`: body field `{field}` has the same name as a parameter; \
                                     tool arguments are flat, so rename one of them"
                                ));
                            }
                            args.push(OpArg {
                                required: required_fields.contains(&field),
                                name: field,
                                location: Location::Body,
                                schema,
                                schema_ref: None,
                            });
                        }
                        Some(name)
                    }
                };
                let body_required =
                    matches!(&op.request_body, Some(ReferenceOr::Item(b)) if b.required);
                let websocket = op.extensions.contains_key("x-dropshot-websocket");
                let (response_schema, streaming, status) = if websocket {
                    self.websocket_answer(&id, op)?
                } else {
                    self.success_schema(&id, op)?
                };
                out.push(Operation {
                    id,
                    method: method.to_string(),
                    path: path.clone(),
                    args,
                    body_type,
                    response_schema,
                    streaming,
                    raw_body,
                    body_required,
                    status,
                    websocket,
                    summary: op.summary.clone().or_else(|| op.description.clone()),
                    tenant_scoped: op
                        .extensions
                        .get("x-tenant-scoped")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                });
            }
        }
        let mut seen = BTreeMap::new();
        for op in &out {
            if let Some(prev) = seen.insert(op.id.clone(), &op.path) {
                return Err(format!(
                    "operationId `{}` is used twice ({prev} and {})",
                    op.id, op.path
                ));
            }
        }
        Ok(out)
    }

    fn resolve_parameter(&self, param: &ReferenceOr<Parameter>) -> Result<OpArg, String> {
        let param = match param {
            ReferenceOr::Item(p) => p.clone(),
            ReferenceOr::Reference { reference } => {
                let name = reference
                    .strip_prefix("#/components/parameters/")
                    .ok_or_else(|| format!("unsupported parameter reference `{reference}`"))?;
                match self
                    .api
                    .components
                    .as_ref()
                    .and_then(|c| c.parameters.get(name))
                {
                    Some(ReferenceOr::Item(p)) => p.clone(),
                    _ => {
                        return Err(format!(
                            "parameter reference `{reference}` does not resolve"
                        ));
                    }
                }
            }
        };
        let (location, data) = match &param {
            Parameter::Path { parameter_data, .. } => (Location::Path, parameter_data),
            Parameter::Query { parameter_data, .. } => (Location::Query, parameter_data),
            Parameter::Header { parameter_data, .. } | Parameter::Cookie { parameter_data, .. } => {
                return Err(format!(
                    "parameter `{}` is a header or cookie; tools can only carry path, query and body arguments",
                    parameter_data.name
                ));
            }
        };
        let ident_ok = data.name.starts_with(|c: char| c.is_ascii_lowercase())
            && data
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !RUST_KEYWORDS.contains(&data.name.as_str());
        if !ident_ok {
            return Err(format!(
                "parameter `{}` must be a snake_case name that is not a Rust keyword (it becomes a client method)",
                data.name
            ));
        }
        let openapiv3::ParameterSchemaOrContent::Schema(schema) = &data.format else {
            return Err(format!(
                "parameter `{}` uses `content`; give it a `schema`",
                data.name
            ));
        };
        let schema_ref = match schema {
            ReferenceOr::Reference { reference } => reference
                .strip_prefix("#/components/schemas/")
                .map(String::from),
            ReferenceOr::Item(_) => None,
        };
        let raw = serde_json::to_value(schema).map_err(|e| e.to_string())?;
        let mut schema = self.to_json_schema(&raw, 0)?;
        // A parameter says what it is for in its own description; without one it shows none
        // (its name and pattern say enough), rather than the description of its schema's type.
        if let Some(obj) = schema.as_object_mut() {
            match &data.description {
                Some(desc) => obj.insert("description".into(), Value::String(desc.clone())),
                None => obj.remove("description"),
            };
        }
        let kind = schema.get("type").and_then(Value::as_str).unwrap_or("");
        if !matches!(kind, "string" | "integer" | "boolean" | "number") {
            return Err(format!(
                "parameter `{}` has type `{kind}`; path and query parameters must be a string, integer, number or boolean",
                data.name
            ));
        }
        Ok(OpArg {
            name: data.name.clone(),
            location,
            required: data.required,
            schema,
            schema_ref,
        })
    }

    /// The request body's component name, required fields and property schemas.
    #[allow(clippy::type_complexity)]
    fn body_fields(
        &self,
        op: &str,
        body: &ReferenceOr<openapiv3::RequestBody>,
    ) -> Result<(String, Vec<String>, Vec<(String, Value)>), String> {
        let ReferenceOr::Item(body) = body else {
            return Err(format!(
                "operation `{op}`: request body is a $ref; inline it"
            ));
        };
        let media = body
            .content
            .get("application/json")
            .ok_or_else(|| format!("operation `{op}`: request body must be application/json"))?;
        let Some(ReferenceOr::Reference { reference }) = &media.schema else {
            return Err(format!(
                "operation `{op}`: request body schema must be a $ref to components/schemas, \
                 so the generated client has a named type to build"
            ));
        };
        let name = reference
            .strip_prefix("#/components/schemas/")
            .ok_or_else(|| format!("operation `{op}`: unsupported body reference `{reference}`"))?
            .to_string();
        if !name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            || !name.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err(format!(
                "operation `{op}`: body schema `{name}` must be named in PascalCase (it becomes a Rust type)"
            ));
        }
        let schema = self.to_json_schema(&serde_json::json!({ "$ref": reference }), 0)?;
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(format!(
                "operation `{op}`: body schema `{name}` must be an object"
            ));
        }
        let required: Vec<String> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| {
                p.iter()
                    .map(|(k, v)| {
                        // An optional field's `null` means "not given": the model is shown the
                        // plain type and simply leaves the argument out.
                        let v = if required.contains(k) {
                            v.clone()
                        } else {
                            without_null(v.clone())
                        };
                        (k.clone(), v)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok((name, required, properties))
    }

    /// A WebSocket operation answers 101 and nothing else that succeeds, and takes no body (its
    /// request travels as its first message).
    fn websocket_answer(
        &self,
        op_id: &str,
        op: &openapiv3::Operation,
    ) -> Result<(Value, bool, u16), String> {
        let codes: Vec<&openapiv3::StatusCode> = op.responses.responses.keys().collect();
        let switching = codes
            .iter()
            .any(|c| matches!(c, openapiv3::StatusCode::Code(101)));
        let other_success = codes.iter().any(|c| {
            matches!(c, openapiv3::StatusCode::Code(c) if (200..300).contains(c))
                || matches!(c, openapiv3::StatusCode::Range(2))
        });
        if !switching || other_success || op.request_body.is_some() {
            return Err(format!(
                "operation `{op_id}`: a WebSocket (x-dropshot-websocket) answers 101 and no 2xx, and takes no request body"
            ));
        }
        Ok((serde_json::json!({"type": "object"}), false, 101))
    }

    fn success_schema(
        &self,
        op_id: &str,
        op: &openapiv3::Operation,
    ) -> Result<(Value, bool, u16), String> {
        let success: Vec<_> = op
            .responses
            .responses
            .iter()
            .filter(|(code, _)| {
                matches!(code, openapiv3::StatusCode::Code(c) if (200..300).contains(c))
            })
            .collect();
        let [(code, response)] = success.as_slice() else {
            return Err(format!(
                "operation `{op_id}` must declare exactly one 2xx response"
            ));
        };
        let ReferenceOr::Item(response) = response else {
            return Err(format!(
                "operation `{op_id}`: success response is a $ref; inline it"
            ));
        };
        let (media, streaming) = match (
            response.content.get("application/json"),
            response.content.get(NDJSON),
        ) {
            (Some(m), None) => (m, false),
            (None, Some(m)) => (m, true),
            _ => {
                return Err(format!(
                    "operation `{op_id}`: success response must be application/json, or {NDJSON} for a stream of events"
                ));
            }
        };
        let schema = media
            .schema
            .as_ref()
            .ok_or_else(|| format!("operation `{op_id}`: success response has no schema"))?;
        let raw = serde_json::to_value(schema).map_err(|e| e.to_string())?;
        let schema = self.to_json_schema(&raw, 0)?;
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(format!(
                "operation `{op_id}`: success response must be an object (MCP structuredContent is an object)"
            ));
        }
        let status = match code {
            openapiv3::StatusCode::Code(c) => *c,
            openapiv3::StatusCode::Range(_) => 200,
        };
        Ok((schema, streaming, status))
    }

    /// Converts an OpenAPI 3.0 schema to a self-contained JSON Schema: `$ref`s inlined,
    /// single-element `allOf` merged with its siblings, `nullable` turned into a `null` type,
    /// OpenAPI-only numeric formats dropped, every validation keyword kept.
    pub fn to_json_schema(&self, raw: &Value, depth: usize) -> Result<Value, String> {
        if depth > 32 {
            return Err("schema nesting exceeds 32 levels (a recursive $ref?)".into());
        }
        let Some(obj) = raw.as_object() else {
            return Ok(raw.clone());
        };
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .ok_or_else(|| format!("unsupported schema reference `{reference}`"))?;
            let target = self
                .schemas
                .get(name)
                .ok_or_else(|| format!("schema reference `{reference}` does not resolve"))?;
            return self.to_json_schema(target, depth + 1);
        }
        let mut out = Map::new();
        if let Some(Value::Array(all)) = obj.get("allOf") {
            let [only] = all.as_slice() else {
                return Err("allOf with more than one schema is not supported".into());
            };
            if let Value::Object(inner) = self.to_json_schema(only, depth + 1)? {
                out = inner;
            }
        }
        for (key, value) in obj {
            match key.as_str() {
                "allOf" | "nullable" | "$ref" | "example" | "externalDocs" | "xml" | "readOnly"
                | "writeOnly" | "deprecated" | "discriminator" => {}
                "format" => {
                    let s = value.as_str().unwrap_or("");
                    let openapi_only = [
                        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                        "float", "double",
                    ];
                    if !openapi_only.contains(&s) {
                        out.insert(key.clone(), value.clone());
                    }
                }
                "properties" => {
                    let mut props = Map::new();
                    for (name, prop) in value.as_object().into_iter().flatten() {
                        props.insert(name.clone(), self.to_json_schema(prop, depth + 1)?);
                    }
                    out.insert(key.clone(), Value::Object(props));
                }
                "items" | "additionalProperties" | "not" => {
                    let converted = if value.is_object() {
                        self.to_json_schema(value, depth + 1)?
                    } else {
                        value.clone()
                    };
                    out.insert(key.clone(), converted);
                }
                "oneOf" | "anyOf" => {
                    let list = value
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|s| self.to_json_schema(s, depth + 1))
                        .collect::<Result<Vec<_>, _>>()?;
                    out.insert(key.clone(), Value::Array(list));
                }
                "exclusiveMinimum" | "exclusiveMaximum" => {
                    // OpenAPI 3.0's boolean form becomes JSON Schema's numeric form.
                    let bound = if key == "exclusiveMinimum" {
                        "minimum"
                    } else {
                        "maximum"
                    };
                    if value == &Value::Bool(true)
                        && let Some(n) = obj.get(bound)
                    {
                        out.insert(key.clone(), n.clone());
                        out.remove(bound);
                    }
                }
                "minimum" | "maximum" => {
                    let exclusive = if key == "minimum" {
                        "exclusiveMinimum"
                    } else {
                        "exclusiveMaximum"
                    };
                    if obj.get(exclusive) != Some(&Value::Bool(true)) {
                        out.insert(key.clone(), value.clone());
                    }
                }
                _ => {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        if obj.get("nullable") == Some(&Value::Bool(true)) {
            match out.get("type").cloned() {
                Some(Value::String(t)) => {
                    out.insert("type".into(), serde_json::json!([t, "null"]));
                }
                _ => {
                    // An untyped (allOf-wrapped object) schema: allow null explicitly.
                    let inner = Value::Object(std::mem::take(&mut out));
                    let description = inner.get("description").cloned();
                    out.insert(
                        "anyOf".into(),
                        Value::Array(vec![inner, serde_json::json!({"type": "null"})]),
                    );
                    if let Some(d) = description {
                        out.insert("description".into(), d);
                    }
                }
            }
            if let Some(Value::Array(options)) = out.get_mut("enum") {
                options.push(Value::Null);
            }
        }
        Ok(Value::Object(out))
    }
}

/// `schema` without the `null` alternative that `nullable: true` added.
fn without_null(mut schema: Value) -> Value {
    let Some(obj) = schema.as_object_mut() else {
        return schema;
    };
    if let Some(Value::Array(types)) = obj.get("type") {
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        let plain = match rest.as_slice() {
            [one] => one.clone(),
            _ => Value::Array(rest),
        };
        obj.insert("type".into(), plain);
    }
    if let Some(Value::Array(options)) = obj.get_mut("enum") {
        options.retain(|o| !o.is_null());
    }
    if let Some(Value::Array(alternatives)) = obj.get("anyOf")
        && let [inner, null] = alternatives.as_slice()
        && null == &serde_json::json!({"type": "null"})
        && let Value::Object(inner) = inner.clone()
    {
        let description = obj.get("description").cloned();
        *obj = inner;
        if let Some(d) = description {
            obj.insert("description".into(), d);
        }
    }
    schema
}
