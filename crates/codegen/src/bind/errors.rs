//! A tool's error messages: keyed by an error code of the spec, a 4xx/5xx status or a transport
//! failure, and every `{placeholder}` a built-in or an argument of the tool. A file's default
//! messages apply to the tools that have every argument they name, and each must apply to one.

use std::collections::{BTreeMap, BTreeSet};

use super::Ctx;
use crate::did_you_mean;
use crate::model::{ArgDef, ArgLocation};
use crate::raw::{RawFile, RawTool};
use crate::spec::Spec;

/// Error keys that are not error codes or statuses: failures before the engine answers.
pub const TRANSPORT_ERROR_KEYS: [&str; 3] = ["unreachable", "deadline", "bad_response"];
/// Placeholders every error message may use besides the tool's arguments.
pub const BUILTIN_PLACEHOLDERS: [&str; 4] = ["message", "error_code", "status", "request_id"];

pub(crate) fn check_errors(
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
pub(crate) fn fits(message: &str, args: &[ArgDef]) -> bool {
    placeholders(message).is_ok_and(|names| {
        names.iter().all(|n| {
            BUILTIN_PLACEHOLDERS.contains(&n.as_str()) || args.iter().any(|a| &a.name == n)
        })
    })
}

/// Each `[defaults.errors]` message must apply to at least one tool of its file, so a misspelt
/// placeholder cannot silently disable it.
pub(crate) fn check_defaults(ctx: &mut Ctx<'_>, spec: &Spec, file: &RawFile) {
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
                        hidden_in: Vec::new(),
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
