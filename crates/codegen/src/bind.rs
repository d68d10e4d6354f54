//! Raw tool-defs + spec → validated [`Registry`]: every check that makes a broken tool-def fail
//! the build instead of confusing a model at runtime.
//!
//! This file binds the whole set: tool names unique, every operation bound to a tool or excluded
//! with a reason, toolsets, the operation inventory. `tool` checks one tool and builds its
//! definition, `schema` its input and output schemas, `errors` its error messages and their
//! placeholders, `profile` the profiles' views of the registry.

mod errors;
mod profile;
mod schema;
mod tool;

use std::collections::BTreeMap;

use crate::deferred::Deferred;
use crate::model::{InventoryEntry, Registry, ToolDef};
use crate::raw::RawFile;
use crate::spec::Spec;
use crate::{CodegenError, did_you_mean};

use errors::check_defaults;
pub use errors::{BUILTIN_PLACEHOLDERS, TRANSPORT_ERROR_KEYS, placeholders};
pub use profile::PROFILE_ERRORS;
use profile::bind_profile;
use tool::bind_tool;

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
            (false, _) if op.websocket => ctx.fail(
                "tool-defs/",
                None,
                format!(
                    "operation `{}` is a WebSocket, whose messages a model cannot exchange; replace \
                     its [[tool]] with an [[exclude]] and a reason",
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
        inventory: Deferred::new(inventory),
        toolsets,
        profiles: Deferred::new(profiles),
        narrowed: Default::default(),
    })
}
