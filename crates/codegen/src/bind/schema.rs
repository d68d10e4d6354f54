//! A tool's schemas as the model sees them: the input, one flat object of the operation's path,
//! query and body arguments (with the tool-def's descriptions, defaults checked against the
//! argument's schema, and hidden arguments left out); the output, the success response plus a
//! count field per capped field; and an image field taken out of the output to be sent as image
//! content.

use serde_json::{Map, Value, json};

use super::Ctx;
use crate::model::{ArgDef, ArgLocation, Cap, Image};
use crate::raw::RawTool;
use crate::spec::{Location, Operation};
use crate::{did_you_mean, jsonschema};

pub(crate) fn build_args(
    ctx: &mut Ctx<'_>,
    f: &str,
    raw: &RawTool,
    op: &Operation,
) -> (Vec<ArgDef>, Value) {
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
            if (over.hide || !over.hide_in.is_empty()) && arg.required && default.is_none() {
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
        let hidden_in = over.map(|o| o.hide_in.clone()).unwrap_or_default();
        for set in &hidden_in {
            if !raw.toolsets.contains(set) {
                ctx.fail(
                    f,
                    t,
                    format!(
                        "[args.{}] hide_in names `{set}`, which is not one of the tool's toolsets ({}); list only those",
                        arg.name,
                        raw.toolsets.join(", ")
                    ),
                );
            }
        }
        if hidden && !hidden_in.is_empty() {
            ctx.fail(
                f,
                t,
                format!("[args.{}] sets both hide and hide_in; keep one", arg.name),
            );
        }
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
            hidden_in,
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

pub(crate) fn build_caps(
    ctx: &mut Ctx<'_>,
    f: &str,
    raw: &RawTool,
    op: &Operation,
) -> (Vec<Cap>, Value) {
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
pub(crate) fn build_image(
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
