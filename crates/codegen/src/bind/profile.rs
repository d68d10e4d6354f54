//! A profile: the registry's tools minus those it excludes, with its session argument (if any)
//! hidden from the model and filled in by the server, which then needs the profile's own
//! messages for a session that is gone or missing.

use std::sync::Arc;

use serde_json::Value;

use super::Ctx;
use crate::did_you_mean;
use crate::model::{Profile, ToolDef};

/// Messages a profile with a `session_arg` must give the model, by key: its session's sandbox
/// is gone (the next call makes a new one); a request came without a session to bind.
pub const PROFILE_ERRORS: [&str; 2] = ["session_gone", "no_session"];

/// A profile's tools: the registry's, minus the excluded, with the session argument hidden.
pub(crate) fn bind_profile(
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
                let schema = Arc::make_mut(&mut t.input_schema);
                if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                    props.remove(arg);
                }
                if let Some(req) = schema.get_mut("required").and_then(Value::as_array_mut) {
                    req.retain(|v| v.as_str() != Some(arg.as_str()));
                    if req.is_empty() {
                        schema.remove("required");
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
