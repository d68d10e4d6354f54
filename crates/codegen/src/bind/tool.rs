//! One `[[tool]]` checked against its operation and made a [`ToolDef`]: its name, title,
//! description and toolsets; its annotations (defaults from the HTTP method, then the file's,
//! then the tool's); its stream operation, which must take the very same arguments; and its
//! schemas and error messages, built by the sibling modules.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Ctx;
use super::errors::{check_errors, fits};
use super::schema::{build_args, build_caps, build_image};
use crate::did_you_mean;
use crate::model::{Annotations, ToolDef, schema};
use crate::raw::{RawAnnotations, RawFile, RawTool};
use crate::spec::{Location, Operation};

const MAX_DESCRIPTION: usize = 4096;

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

pub(crate) fn bind_tool(ctx: &mut Ctx<'_>, file: &RawFile, raw: &RawTool) -> Option<ToolDef> {
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
        input_schema: schema(input_schema),
        output_schema: schema(output_schema),
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
