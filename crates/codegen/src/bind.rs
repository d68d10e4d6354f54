//! Raw tool-defs + spec → validated [`Registry`]: every check that makes a broken tool-def fail
//! the build instead of confusing a model at runtime.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::model::{
    Annotations, ArgDef, ArgLocation, Cap, Image, InventoryEntry, Profile, Registry, ToolDef,
};
use crate::raw::{RawAnnotations, RawFile, RawTool};
use crate::spec::{Location, Operation, Spec};
use crate::{CodegenError, did_you_mean, jsonschema};

/// Error keys that are not error codes or statuses: failures before the engine answers.
pub const TRANSPORT_ERROR_KEYS: [&str; 3] = ["unreachable", "deadline", "bad_response"];
/// Placeholders every error message may use besides the tool's arguments.
pub const BUILTIN_PLACEHOLDERS: [&str; 4] = ["message", "error_code", "status", "request_id"];

const MAX_DESCRIPTION: usize = 4096;

/// Messages a profile with a `session_arg` must give the model, by key: its session's sandbox
/// is gone (the next call makes a new one); a request came without a session to bind.
pub const PROFILE_ERRORS: [&str; 2] = ["session_gone", "no_session"];

struct Ctx<'a> {
    spec: &'a Spec,
    errors: Vec<CodegenError>,
    error_codes: Vec<String>,
}

impl Ctx<'_> {
    fn fail(&mut self, file: &str, tool: Option<&str>, message: impl Into<String>) {
        self.errors.push(CodegenError {
            file: file.to_string(),
            tool: tool.map(String::from),
            message: message.into(),
        });
    }
}

pub fn bind(spec: &Spec, files: &[RawFile]) -> Result<Registry, Vec<CodegenError>> {
    let error_codes = spec
        .api
        .components
        .as_ref()
        .and_then(|c| c.schemas.get("ErrorCode"))
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|v| v.get("enum").cloned())
        .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
        .unwrap_or_default();
    let mut ctx = Ctx {
        spec,
        errors: Vec::new(),
        error_codes,
    };
    let mut tools: Vec<ToolDef> = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut excluded: BTreeMap<String, (String, String)> = BTreeMap::new();

    for file in files {
        for raw in &file.tools {
            if let Some(previous) = names.insert(raw.name.clone(), file.name.clone()) {
                ctx.fail(
                    &file.name,
                    Some(&raw.name),
                    format!(
                        "the name is already used by a tool in {previous}; tool names must be unique, so rename one"
                    ),
                );
                continue;
            }
            // Count the operation as bound even when the tool has errors, so one mistake is
            // not reported twice ("unbound operation").
            for op in std::iter::once(&raw.operation).chain(raw.stream_operation.as_ref()) {
                if spec.operation(op).is_some() {
                    bound.entry(op.clone()).or_default().push(raw.name.clone());
                }
            }
            if let Some(tool) = bind_tool(&mut ctx, file, raw) {
                tools.push(tool);
            }
        }
        check_defaults(&mut ctx, spec, file);
        for ex in &file.excludes {
            let label = format!("[[exclude]] {}", ex.operation);
            if spec.operation(&ex.operation).is_none() {
                let hint =
                    did_you_mean(&ex.operation, spec.operations.iter().map(|o| o.id.as_str()));
                let known: Vec<&str> = spec.operations.iter().map(|o| o.id.as_str()).collect();
                ctx.fail(
                    &file.name,
                    Some(&label),
                    format!(
                        "unknown operation `{}`.{hint} Operations: {}",
                        ex.operation,
                        known.join(", ")
                    ),
                );
            } else if ex.reason.trim().is_empty() {
                ctx.fail(
                    &file.name,
                    Some(&label),
                    "`reason` is empty; say why the operation is not offered to models",
                );
            } else if let Some((prev_file, _)) = excluded.get(&ex.operation) {
                ctx.fail(
                    &file.name,
                    Some(&label),
                    format!("the operation is already excluded in {prev_file}; keep one"),
                );
            } else {
                excluded.insert(
                    ex.operation.clone(),
                    (file.name.clone(), ex.reason.trim().to_string()),
                );
            }
        }
    }

    let mut inventory = Vec::new();
    for op in &spec.operations {
        let tools_for = bound.get(&op.id).cloned().unwrap_or_default();
        let exclusion = excluded.get(&op.id);
        match (tools_for.is_empty(), exclusion) {
            (true, None) => ctx.fail(
                "tool-defs/",
                None,
                format!(
                    "operation `{}` ({} {}) is neither bound to a tool nor excluded; add a [[tool]] \
                     with operation = \"{}\" to a tool-def file, or an [[exclude]] with a reason",
                    op.id, op.method, op.path, op.id
                ),
            ),
            (false, _) if op.raw_body => ctx.fail(
                "tool-defs/",
                None,
                format!(
                    "operation `{}` uploads raw bytes, which a model cannot send; replace its \
                     [[tool]] with an [[exclude]] and a reason",
                    op.id
                ),
            ),
            (false, Some((file, _))) => ctx.fail(
                file,
                Some(&format!("[[exclude]] {}", op.id)),
                format!(
                    "the operation is excluded but also bound to {}; remove one of them",
                    tools_for.join(", ")
                ),
            ),
            _ => {}
        }
        inventory.push(InventoryEntry {
            operation: op.id.clone(),
            method: op.method.clone(),
            path: op.path.clone(),
            tools: tools_for,
            excluded: exclusion.map(|(_, reason)| reason.clone()),
        });
    }

    let mut toolsets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for tool in files.iter().flat_map(|f| f.tools.iter()) {
        for set in &tool.toolsets {
            toolsets
                .entry(set.clone())
                .or_default()
                .push(tool.name.clone());
        }
    }

    let mut profiles = BTreeMap::new();
    for file in files {
        for raw in &file.profiles {
            if let Some(p) = bind_profile(&mut ctx, &file.name, raw, &tools)
                && profiles.insert(raw.name.clone(), p).is_some()
            {
                ctx.fail(
                    &file.name,
                    Some(&format!("[[profile]] {}", raw.name)),
                    "a profile of this name already exists; rename one",
                );
            }
        }
    }

    if !ctx.errors.is_empty() {
        return Err(ctx.errors);
    }
    Ok(Registry {
        api_title: spec.api.info.title.clone(),
        api_version: spec.api.info.version.clone(),
        tools,
        inventory,
        toolsets,
        profiles,
    })
}

/// A profile's tools: the registry's, minus the excluded, with the session argument hidden.
fn bind_profile(
    ctx: &mut Ctx<'_>,
    f: &str,
    raw: &crate::raw::RawProfile,
    tools: &[ToolDef],
) -> Option<Profile> {
    let label = format!("[[profile]] {}", raw.name);
    let before = ctx.errors.len();
    if raw.name.is_empty()
        || !raw
            .name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'-' || b == b'_')
    {
        ctx.fail(f, Some(&label), "a profile name uses a-z, `-` and `_` only");
    }
    if raw.description.trim().is_empty() {
        ctx.fail(
            f,
            Some(&label),
            "`description` is empty; say what the profile is for",
        );
    }
    for name in &raw.exclude {
        if !tools.iter().any(|t| &t.name == name) {
            let hint = did_you_mean(name, tools.iter().map(|t| t.name.as_str()));
            ctx.fail(
                f,
                Some(&label),
                format!("excludes unknown tool `{name}`.{hint}"),
            );
        }
    }
    if let Some(arg) = &raw.session_arg
        && !tools.iter().any(|t| t.args.iter().any(|a| &a.name == arg))
    {
        ctx.fail(
            f,
            Some(&label),
            format!("session_arg `{arg}` is no argument of any tool"),
        );
    }
    for key in raw.errors.keys() {
        if !PROFILE_ERRORS.contains(&key.as_str()) {
            let hint = did_you_mean(key, PROFILE_ERRORS.into_iter());
            ctx.fail(
                f,
                Some(&label),
                format!(
                    "[errors] `{key}` is not a profile message.{hint} Profile messages: {}",
                    PROFILE_ERRORS.join(", ")
                ),
            );
        }
    }
    if raw.session_arg.is_some() {
        for key in PROFILE_ERRORS {
            if raw.errors.get(key).is_none_or(|m| m.trim().is_empty()) {
                ctx.fail(
                    f,
                    Some(&label),
                    format!("[errors] `{key}` is missing: a profile with a session_arg must tell the model what happened"),
                );
            }
        }
    }
    if ctx.errors.len() > before {
        return None;
    }
    let tools = tools
        .iter()
        .filter(|t| !raw.exclude.contains(&t.name))
        .cloned()
        .map(|mut t| {
            if let Some(arg) = &raw.session_arg
                && let Some(a) = t.args.iter_mut().find(|a| &a.name == arg)
            {
                a.hidden = true;
                a.required = false;
                if let Some(props) = t
                    .input_schema
                    .get_mut("properties")
                    .and_then(Value::as_object_mut)
                {
                    props.remove(arg);
                }
                if let Some(req) = t
                    .input_schema
                    .get_mut("required")
                    .and_then(Value::as_array_mut)
                {
                    req.retain(|v| v.as_str() != Some(arg.as_str()));
                    if req.is_empty()
                        && let Some(o) = t.input_schema.as_object_mut()
                    {
                        o.remove("required");
                    }
                }
                t.session_arg = Some(arg.clone());
            }
            t
        })
        .collect();
    Some(Profile {
        description: raw.description.trim().to_string(),
        session_arg: raw.session_arg.clone(),
        errors: raw
            .errors
            .iter()
            .map(|(k, v)| (k.clone(), v.trim().to_string()))
            .collect(),
        tools,
    })
}

fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Annotation defaults by HTTP method: GET reads, DELETE destroys (idempotently), PUT replaces.
fn infer_annotations(method: &str) -> Annotations {
    let (read_only, destructive, idempotent) = match method {
        "GET" => (true, false, true),
        "DELETE" => (false, true, true),
        "PUT" => (false, true, true),
        "PATCH" => (false, true, false),
        _ => (false, false, false),
    };
    Annotations {
        read_only,
        destructive,
        idempotent,
        open_world: false,
    }
}

fn apply(base: Annotations, over: &RawAnnotations) -> Annotations {
    Annotations {
        read_only: over.read_only.unwrap_or(base.read_only),
        destructive: over.destructive.unwrap_or(base.destructive),
        idempotent: over.idempotent.unwrap_or(base.idempotent),
        open_world: over.open_world.unwrap_or(base.open_world),
    }
}

fn bind_tool(ctx: &mut Ctx<'_>, file: &RawFile, raw: &RawTool) -> Option<ToolDef> {
    let errors_before = ctx.errors.len();
    let f = file.name.as_str();
    let t = Some(raw.name.as_str());
    if !valid_tool_name(&raw.name) {
        ctx.fail(
            f,
            t,
            "invalid name: use 1-64 characters from A-Z, a-z, 0-9, `_` and `-` (MCP clients reject others)",
        );
    }
    if raw.title.trim().is_empty() || raw.title.len() > 80 {
        ctx.fail(
            f,
            t,
            "`title` must be 1-80 characters: a short human-readable name",
        );
    }
    if raw.description.trim().is_empty() {
        ctx.fail(
            f,
            t,
            "`description` is empty; tell the model when to use the tool, what comes back and what to do next",
        );
    } else if raw.description.len() > MAX_DESCRIPTION {
        ctx.fail(
            f,
            t,
            format!(
                "`description` is {} bytes; keep it under {MAX_DESCRIPTION} (it is sent to the model on every tools/list)",
                raw.description.len()
            ),
        );
    }
    for set in &raw.toolsets {
        if set == "all"
            || set.is_empty()
            || !set
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            ctx.fail(
                f,
                t,
                format!("toolset `{set}`: use a lowercase name other than `all` (which means every tool)"),
            );
        }
    }

    let Some(op) = ctx.spec.operation(&raw.operation) else {
        let hint = did_you_mean(
            &raw.operation,
            ctx.spec.operations.iter().map(|o| o.id.as_str()),
        );
        let known: Vec<&str> = ctx.spec.operations.iter().map(|o| o.id.as_str()).collect();
        ctx.fail(
            f,
            t,
            format!(
                "unknown operation `{}`.{hint} Operations in {}: {}",
                raw.operation,
                ctx.spec.file,
                known.join(", ")
            ),
        );
        return None;
    };

    if op.streaming {
        ctx.fail(
            f,
            t,
            format!(
                "operation `{}` answers with a stream of events; bind the JSON operation it mirrors and name this one as its `stream_operation`",
                op.id
            ),
        );
    }
    if let Some(stream) = &raw.stream_operation {
        check_stream(ctx, f, raw, op, stream);
    }

    let annotations = apply(
        apply(infer_annotations(&op.method), &file.defaults.annotations),
        &raw.annotations,
    );
    if annotations.read_only && annotations.destructive {
        ctx.fail(
            f,
            t,
            "annotations say both read_only and destructive; a read-only tool cannot destroy anything",
        );
    }

    let (args, input_schema) = build_args(ctx, f, raw, op);
    let (caps, mut output_schema) = build_caps(ctx, f, raw, op);
    let image = raw
        .image
        .as_ref()
        .and_then(|image| build_image(ctx, f, raw, op, image, &mut output_schema));

    // A file-wide default message applies to the tools that have every argument it names.
    let mut errors: BTreeMap<String, String> = file
        .defaults
        .errors
        .iter()
        .filter(|(_, message)| fits(message, &args))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    errors.extend(raw.errors.clone());
    check_errors(ctx, f, raw, &errors, &args);

    if let Some(arg) = &raw.timeout_arg_ms {
        let is_int = op.args.iter().any(|a| {
            &a.name == arg && a.schema.get("type").and_then(Value::as_str) == Some("integer")
        });
        if !is_int {
            ctx.fail(
                f,
                t,
                format!(
                    "`timeout_arg_ms = \"{arg}\"` must name an integer argument of `{}`",
                    op.id
                ),
            );
        }
    }

    if ctx.errors.len() > errors_before {
        return None;
    }
    Some(ToolDef {
        name: raw.name.clone(),
        title: raw.title.trim().to_string(),
        description: raw.description.trim().to_string(),
        source: file.name.clone(),
        operation: op.id.clone(),
        method: op.method.clone(),
        path: op.path.clone(),
        annotations,
        input_schema,
        output_schema,
        args,
        caps,
        errors,
        timeout_arg_ms: raw.timeout_arg_ms.clone(),
        stream_operation: raw.stream_operation.clone(),
        session_arg: None,
        image,
    })
}

/// A `stream_operation` must stream and take exactly the arguments of the tool's operation, so
/// the same arguments build either request.
fn check_stream(ctx: &mut Ctx<'_>, f: &str, raw: &RawTool, op: &Operation, stream: &str) {
    let t = Some(raw.name.as_str());
    let Some(s) = ctx.spec.operation(stream) else {
        let hint = did_you_mean(stream, ctx.spec.operations.iter().map(|o| o.id.as_str()));
        ctx.fail(f, t, format!("unknown stream_operation `{stream}`.{hint}"));
        return;
    };
    if !s.streaming {
        ctx.fail(
            f,
            t,
            format!(
                "stream_operation `{stream}` does not answer with {}",
                crate::spec::NDJSON
            ),
        );
        return;
    }
    let sig = |o: &Operation| -> Vec<(String, Location)> {
        let mut v: Vec<_> = o
            .args
            .iter()
            .map(|a| (a.name.clone(), a.location))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    if sig(s) != sig(op) || s.body_type != op.body_type {
        ctx.fail(
            f,
            t,
            format!(
                "stream_operation `{stream}` must take the same arguments and body as `{}`",
                op.id
            ),
        );
    }
}

fn build_args(ctx: &mut Ctx<'_>, f: &str, raw: &RawTool, op: &Operation) -> (Vec<ArgDef>, Value) {
    let t = Some(raw.name.as_str());
    for name in raw.args.keys() {
        if !op.args.iter().any(|a| &a.name == name) {
            let hint = did_you_mean(name, op.args.iter().map(|a| a.name.as_str()));
            let known: Vec<&str> = op.args.iter().map(|a| a.name.as_str()).collect();
            ctx.fail(
                f,
                t,
                format!(
                    "[args.{name}] names no argument of `{}`.{hint} Its arguments: {}",
                    op.id,
                    known.join(", ")
                ),
            );
        }
    }
    let mut args = Vec::new();
    let mut properties = Map::new();
    let mut required = Vec::new();
    for arg in &op.args {
        let over = raw.args.get(&arg.name);
        let mut schema = arg.schema.clone();
        let mut default = None;
        if let Some(over) = over {
            if let Some(d) = &over.description {
                if d.trim().is_empty() {
                    ctx.fail(f, t, format!("[args.{}] description is empty", arg.name));
                }
                schema["description"] = Value::String(d.trim().to_string());
            }
            if let Some(d) = &over.default {
                match serde_json::to_value(d) {
                    Ok(value) => {
                        let violations = jsonschema::validate(&arg.schema, &value);
                        if let Some(v) = violations.first() {
                            ctx.fail(
                                f,
                                t,
                                format!(
                                    "[args.{}] default {} does not fit the argument's schema: {}",
                                    arg.name,
                                    jsonschema::quote(&value),
                                    v.message
                                ),
                            );
                        }
                        schema["default"] = value.clone();
                        default = Some(value);
                    }
                    Err(e) => ctx.fail(f, t, format!("[args.{}] default: {e}", arg.name)),
                }
            }
            if over.hide && arg.required && default.is_none() {
                ctx.fail(
                    f,
                    t,
                    format!(
                        "[args.{}] hides a required argument without a default; add `default = ...` or stop hiding it",
                        arg.name
                    ),
                );
            }
        }
        let hidden = over.is_some_and(|o| o.hide);
        let is_required = arg.required && default.is_none();
        if !hidden {
            if is_required {
                required.push(Value::String(arg.name.clone()));
            }
            properties.insert(arg.name.clone(), schema);
        }
        args.push(ArgDef {
            name: arg.name.clone(),
            location: match arg.location {
                Location::Path => ArgLocation::Path,
                Location::Query => ArgLocation::Query,
                Location::Body => ArgLocation::Body,
            },
            required: is_required,
            hidden,
            default,
        });
    }
    let mut schema = json!({
        "type": "object",
        "properties": Value::Object(properties),
    });
    if !required.is_empty() {
        schema["required"] = Value::Array(required);
    }
    schema["additionalProperties"] = Value::Bool(false);
    (args, schema)
}

fn build_caps(ctx: &mut Ctx<'_>, f: &str, raw: &RawTool, op: &Operation) -> (Vec<Cap>, Value) {
    let t = Some(raw.name.as_str());
    let mut schema = op.response_schema.clone();
    let mut caps = Vec::new();
    let fields: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for (field, cap) in &raw.caps {
        let Some(prop) = schema.pointer(&format!("/properties/{field}")).cloned() else {
            let hint = did_you_mean(field, fields.iter().map(String::as_str));
            ctx.fail(
                f,
                t,
                format!(
                    "[caps.{field}] names no field of the `{}` result.{hint} Its fields: {}",
                    op.id,
                    fields.join(", ")
                ),
            );
            continue;
        };
        let kind = type_of(&prop);
        match (cap.max_bytes, cap.max_items, kind.as_str()) {
            (Some(0), _, _) | (_, Some(0), _) => {
                ctx.fail(f, t, format!("[caps.{field}] a cap of 0 would drop the field; use a positive limit"));
            }
            (Some(_), None, "string") => {
                add_count_field(&mut schema, &format!("{field}_bytes"), "Size in bytes before the cap was applied.");
            }
            (None, Some(_), "array") => {
                add_count_field(&mut schema, &format!("{field}_total"), "Number of items before the cap was applied.");
            }
            (None, None, _) => ctx.fail(f, t, format!("[caps.{field}] set `max_bytes` (strings) or `max_items` (arrays)")),
            _ => ctx.fail(
                f,
                t,
                format!(
                    "[caps.{field}] the field is {kind}: use `max_bytes` for strings and `max_items` for arrays"
                ),
            ),
        }
        caps.push(Cap {
            field: field.clone(),
            max_bytes: cap.max_bytes,
            max_items: cap.max_items,
        });
    }
    if !caps.is_empty()
        && let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut)
        && !props.contains_key("truncated")
    {
        props.insert(
            "truncated".into(),
            json!({"type": "boolean", "description": "True when a field was cut to fit the output caps."}),
        );
    }
    (caps, schema)
}

/// Checks an `image` field (a string, following nested objects) and takes it out of the output
/// schema: the model gets it as image content, not inside `structuredContent`.
fn build_image(
    ctx: &mut Ctx<'_>,
    f: &str,
    raw: &RawTool,
    op: &Operation,
    image: &crate::raw::RawImage,
    schema: &mut Value,
) -> Option<Image> {
    let t = Some(raw.name.as_str());
    if !image.mime_type.starts_with("image/") {
        ctx.fail(
            f,
            t,
            format!(
                "[image] mime_type `{}` is not an image type (image/png, image/jpeg…)",
                image.mime_type
            ),
        );
        return None;
    }
    let path: Vec<String> = image.field.split('.').map(str::to_string).collect();
    // Found with shared borrows as a JSON pointer, then changed in one place.
    let mut pointer = String::new();
    for (i, part) in path.iter().enumerate() {
        let node = schema.pointer(&pointer)?;
        // A nullable nested object is `allOf: [{…}]` plus `nullable`: look inside.
        if node.get("properties").is_none() && node.pointer("/allOf/0").is_some() {
            pointer.push_str("/allOf/0");
        }
        let node = schema.pointer(&pointer)?;
        let Some(props) = node.get("properties").and_then(Value::as_object) else {
            ctx.fail(
                f,
                t,
                format!(
                    "[image] `{}` is not an object of the `{}` result",
                    path[..i].join("."),
                    op.id
                ),
            );
            return None;
        };
        let Some(prop) = props.get(part) else {
            let hint = did_you_mean(part, props.keys().map(String::as_str));
            ctx.fail(
                f,
                t,
                format!(
                    "[image] `{}` names no field of the `{}` result.{hint} Its fields: {}",
                    image.field,
                    op.id,
                    props.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
            return None;
        };
        if i + 1 == path.len() && type_of(prop) != "string" {
            ctx.fail(
                f,
                t,
                format!("[image] `{}` must be a base64 string field", image.field),
            );
            return None;
        }
        if i + 1 < path.len() {
            pointer.push_str(&format!("/properties/{part}"));
        }
    }
    let (Some(last), Some(node)) = (path.last(), schema.pointer_mut(&pointer)) else {
        return None;
    };
    if let Some(props) = node.get_mut("properties").and_then(Value::as_object_mut) {
        props.remove(last);
    }
    if let Some(required) = node.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| r != last.as_str());
    }
    Some(Image {
        field: path,
        mime_type: image.mime_type.clone(),
    })
}

fn type_of(schema: &Value) -> String {
    match schema.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .find(|s| *s != "null")
            .unwrap_or("null")
            .to_string(),
        _ => "untyped".into(),
    }
}

fn add_count_field(schema: &mut Value, name: &str, description: &str) {
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut)
        && !props.contains_key(name)
    {
        props.insert(
            name.into(),
            json!({"type": "integer", "minimum": 0, "description": description}),
        );
    }
}

fn check_errors(
    ctx: &mut Ctx<'_>,
    f: &str,
    raw: &RawTool,
    errors: &BTreeMap<String, String>,
    args: &[ArgDef],
) {
    let t = Some(raw.name.as_str());
    let codes = ctx.error_codes.clone();
    for (key, message) in errors {
        let is_status = key.len() == 3
            && key.bytes().all(|b| b.is_ascii_digit())
            && (key.starts_with('4') || key.starts_with('5'));
        if !(is_status || codes.contains(key) || TRANSPORT_ERROR_KEYS.contains(&key.as_str())) {
            let hint = did_you_mean(
                key,
                codes.iter().map(String::as_str).chain(TRANSPORT_ERROR_KEYS),
            );
            ctx.fail(
                f,
                t,
                format!(
                    "[errors] key `{key}` is not an error code, a 4xx/5xx status or one of {}.{hint} Error codes: {}",
                    TRANSPORT_ERROR_KEYS.join(", "),
                    codes.join(", ")
                ),
            );
        }
        if message.trim().is_empty() {
            ctx.fail(f, t, format!("[errors] `{key}` has an empty message"));
        }
        match placeholders(message) {
            Ok(names) => {
                for name in names {
                    let known = BUILTIN_PLACEHOLDERS.contains(&name.as_str())
                        || args.iter().any(|a| a.name == name);
                    if !known {
                        let hint = did_you_mean(
                            &name,
                            args.iter()
                                .map(|a| a.name.as_str())
                                .chain(BUILTIN_PLACEHOLDERS),
                        );
                        ctx.fail(
                            f,
                            t,
                            format!(
                                "[errors] `{key}`: placeholder `{{{name}}}` is neither an argument of the tool nor one of {}.{hint}",
                                BUILTIN_PLACEHOLDERS.join(", ")
                            ),
                        );
                    }
                }
            }
            Err(e) => ctx.fail(f, t, format!("[errors] `{key}`: {e}")),
        }
    }
}

/// Whether every placeholder of `message` is a built-in or one of `args`.
fn fits(message: &str, args: &[ArgDef]) -> bool {
    placeholders(message).is_ok_and(|names| {
        names.iter().all(|n| {
            BUILTIN_PLACEHOLDERS.contains(&n.as_str()) || args.iter().any(|a| &a.name == n)
        })
    })
}

/// Each `[defaults.errors]` message must apply to at least one tool of its file, so a misspelt
/// placeholder cannot silently disable it.
fn check_defaults(ctx: &mut Ctx<'_>, spec: &Spec, file: &RawFile) {
    for (key, message) in &file.defaults.errors {
        let applies = file.tools.iter().any(|t| {
            spec.operation(&t.operation).is_some_and(|op| {
                let args: Vec<ArgDef> = op
                    .args
                    .iter()
                    .map(|a| ArgDef {
                        name: a.name.clone(),
                        location: ArgLocation::Body,
                        required: false,
                        hidden: false,
                        default: None,
                    })
                    .collect();
                fits(message, &args)
            })
        });
        if !applies && !file.tools.is_empty() {
            ctx.fail(
                &file.name,
                None,
                format!(
                    "[defaults.errors] `{key}` names a placeholder that no tool in this file has as an argument; \
                     check its spelling, or move the message to the tools it is for"
                ),
            );
        }
    }
}

/// Names inside `{...}` in a message; `{{` and `}}` are literal braces.
pub fn placeholders(message: &str) -> Result<BTreeSet<String>, String> {
    let mut names = BTreeSet::new();
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
                        _ => {
                            return Err(
                                "unclosed or malformed placeholder; write `{name}`, or `{{` for a literal brace"
                                    .into(),
                            );
                        }
                    }
                }
                names.insert(name);
            }
            '}' => return Err("stray `}`; write `}}` for a literal brace".into()),
            _ => {}
        }
    }
    Ok(names)
}
