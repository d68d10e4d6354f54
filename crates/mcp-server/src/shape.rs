//! What the model receives: results capped to fit a context window, and failures turned into the
//! tool-def's actionable message. Both kinds of MCP error go through [`failure_result`] /
//! [`protocol_error`], never through ad-hoc literals.

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde_json::{Map, Value};

use crate::args::Args;
use crate::call::CallFailure;
use crate::tooldefs::{Cap, ToolDef};

/// Applies the tool's output caps in place. A capped string keeps its head and tail around a
/// marker; a capped array keeps its first items. Each cap sets `truncated: true` and records the
/// original size in `<field>_bytes` / `<field>_total` unless the engine already reported the exact
/// figure there (the engine's count of what a command wrote beats our count of what it returned).
pub(crate) fn apply_caps(caps: &[Cap], value: &mut Value) {
    let Some(obj) = value.as_object_mut() else {
        return;
    };
    let mut truncated = false;
    for cap in caps {
        match (obj.get_mut(&cap.field), cap.max_bytes, cap.max_items) {
            (Some(Value::String(s)), Some(max), _) if s.len() as u64 > max => {
                let original = s.len() as u64;
                *s = head_tail(s, max as usize);
                truncated = true;
                set_if_absent(obj, &format!("{}_bytes", cap.field), original);
            }
            (Some(Value::Array(items)), _, Some(max)) if items.len() as u64 > max => {
                let original = items.len() as u64;
                items.truncate(max as usize);
                truncated = true;
                set_if_absent(obj, &format!("{}_total", cap.field), original);
            }
            _ => {}
        }
    }
    if truncated {
        obj.insert("truncated".into(), Value::Bool(true));
    } else if !caps.is_empty() && !obj.contains_key("truncated") {
        obj.insert("truncated".into(), Value::Bool(false));
    }
}

fn set_if_absent(obj: &mut Map<String, Value>, key: &str, n: u64) {
    obj.entry(key.to_string()).or_insert(Value::from(n));
}

/// The first and last parts of `s` within `max` bytes in all, cut on character boundaries, with a
/// marker saying how much is missing.
pub(crate) fn head_tail(s: &str, max: usize) -> String {
    let marker_len = 48; // "\n…[N bytes omitted]…\n" with N up to 20 digits
    let budget = max.saturating_sub(marker_len);
    let mut head_end = budget / 2;
    while head_end > 0 && !s.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = s.len() - (budget - budget / 2);
    while tail_start < s.len() && !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let omitted = tail_start - head_end;
    format!(
        "{}\n…[{} bytes omitted]…\n{}",
        &s[..head_end],
        omitted,
        &s[tail_start..]
    )
}

/// Longest string repeated in a result's text copy. MCP clients built on rmcp drop any message
/// over 16 MiB (and leave the call hanging), and a zip sent twice — structured and as text —
/// would be one; a model gains nothing from megabytes of base64 in its context either.
pub(crate) const TEXT_COPY_MAX_STRING: usize = 2 * 1024 * 1024;

/// A successful call: the (capped) JSON as `structuredContent`, and the same JSON as text for
/// clients that only read text — with any string over [`TEXT_COPY_MAX_STRING`] replaced there by
/// a note of its size (it stays whole in `structuredContent`).
///
/// A tool with an `image` field gets that field as image content after the text (so the model
/// sees a picture, not base64), and it leaves the JSON.
pub(crate) fn success_result(tool: &ToolDef, mut value: Value) -> CallToolResult {
    apply_caps(&tool.caps, &mut value);
    let image = tool
        .image
        .as_ref()
        .and_then(|image| take_path(&mut value, &image.field).map(|data| (data, image)));
    let text = match elided(&value) {
        Some(copy) => serde_json::to_string(&copy),
        None => serde_json::to_string(&value),
    }
    .unwrap_or_default();
    let mut result = CallToolResult::structured(value);
    result.content = vec![Content::text(text)];
    if let Some((data, image)) = image {
        result
            .content
            .push(Content::image(data, image.mime_type.clone()));
    }
    result
}

/// Removes the string at `path` (object keys) from `value` and returns it.
fn take_path(value: &mut Value, path: &[String]) -> Option<String> {
    let (last, parents) = path.split_last()?;
    let mut node = value;
    for key in parents {
        node = node.get_mut(key.as_str())?;
    }
    match node.as_object_mut()?.remove(last.as_str())? {
        Value::String(s) => Some(s),
        other => {
            // Not a string after all: put it back rather than lose it.
            node.as_object_mut()?.insert(last.clone(), other);
            None
        }
    }
}

/// A copy of `value` with its long strings replaced by notes, or `None` when it has none.
fn elided(value: &Value) -> Option<Value> {
    match value {
        Value::String(s) if s.len() > TEXT_COPY_MAX_STRING => Some(Value::String(format!(
            "…[{} bytes, left out of this text copy: read the field from structuredContent]…",
            s.len()
        ))),
        Value::Array(items) => {
            let copies: Vec<Option<Value>> = items.iter().map(elided).collect();
            copies.iter().any(Option::is_some).then(|| {
                Value::Array(
                    copies
                        .into_iter()
                        .zip(items)
                        .map(|(c, v)| c.unwrap_or_else(|| v.clone()))
                        .collect(),
                )
            })
        }
        Value::Object(map) => {
            let copies: Vec<(&String, Option<Value>)> =
                map.iter().map(|(k, v)| (k, elided(v))).collect();
            copies.iter().any(|(_, c)| c.is_some()).then(|| {
                Value::Object(
                    copies
                        .into_iter()
                        .map(|(k, c)| (k.clone(), c.unwrap_or_else(|| map[k].clone())))
                        .collect(),
                )
            })
        }
        _ => None,
    }
}

/// A failed call the model can act on: `isError: true` and the tool-def's message.
pub(crate) fn failure_result(
    tool: &ToolDef,
    args: Option<&Args>,
    failure: &CallFailure,
) -> CallToolResult {
    CallToolResult::error(vec![Content::text(failure_message(tool, args, failure))])
}

/// A JSON-RPC error: only for requests that are not a valid call of a known tool.
pub(crate) fn protocol_error(failure: &CallFailure) -> McpError {
    match failure {
        CallFailure::UnknownTool(name) => McpError::invalid_params(
            format!("unknown tool `{name}`; call tools/list to see the tools"),
            None,
        ),
        other => McpError::internal_error(format!("{other:?}"), None),
    }
}

/// Picks the message for a failure: the tool-def's by error code, then by HTTP status, then a
/// generic one; fills its placeholders.
pub fn failure_message(tool: &ToolDef, args: Option<&Args>, failure: &CallFailure) -> String {
    let (keys, message, code, status, request_id): (Vec<String>, &str, &str, u16, &str) =
        match failure {
            CallFailure::InvalidArgs(m) => (vec![], m, "invalid_argument", 0, ""),
            CallFailure::Api {
                status,
                code,
                message,
                request_id,
            } => (
                vec![code.clone(), status.to_string()],
                message,
                code,
                *status,
                request_id,
            ),
            CallFailure::Unreachable(m) => (vec!["unreachable".into()], m, "unreachable", 0, ""),
            CallFailure::Deadline(m) => (vec!["deadline".into()], m, "deadline", 0, ""),
            CallFailure::BadResponse(m) => (vec!["bad_response".into()], m, "bad_response", 0, ""),
            CallFailure::UnknownTool(name) => {
                return format!("unknown tool `{name}`; call tools/list to see the tools");
            }
        };
    if let CallFailure::InvalidArgs(m) = failure {
        // `sandbox_id` carries no description in the schema (every tool has it; its pattern
        // says what it is): where to get one is said here, where it is needed.
        let hint = if m.contains("argument `sandbox_id`") {
            " (From sandbox_list, or the `id` sandbox_create returned.)"
        } else {
            ""
        };
        return format!("Invalid arguments for {}: {m}{hint}", tool.name);
    }
    let template = keys
        .iter()
        .find_map(|k| tool.errors.get(k))
        .cloned()
        .unwrap_or_else(|| default_template(failure).to_string());
    fill(&template, |name| match name {
        "message" => Some(message.trim_end_matches('.').to_string()),
        "error_code" => Some(code.to_string()),
        "status" => Some(status.to_string()),
        "request_id" => Some(request_id.to_string()),
        arg => args.and_then(|a| a.get(arg)).map(|v| match v {
            Value::String(s) => clip(s),
            other => clip(&other.to_string()),
        }),
    })
}

fn default_template(failure: &CallFailure) -> &'static str {
    match failure {
        CallFailure::Api { .. } => "The sandbox engine refused the call ({error_code}): {message}.",
        CallFailure::Unreachable(_) => {
            "The sandbox engine is unreachable ({message}). Check SANDBOX_MCP_URL, or restart the MCP server."
        }
        CallFailure::Deadline(_) => {
            "The sandbox engine did not answer in time ({message}). Retry once."
        }
        CallFailure::BadResponse(_) => {
            "The sandbox engine sent a response this server does not understand ({message}). Check that the engine and the MCP server are the same version."
        }
        CallFailure::InvalidArgs(_) | CallFailure::UnknownTool(_) => "{message}",
    }
}

/// Argument values quoted in messages are short: a message must never flood the context.
fn clip(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head}…")
    }
}

/// Replaces `{name}` with `lookup(name)`; `{{`/`}}` are literal braces. Unknown names stay as
/// written (the build rejects them, so this only matters for optional arguments left out).
pub fn fill(template: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
                match lookup(&name) {
                    Some(v) => out.push_str(&v),
                    None => out.push_str("(not given)"),
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_image_field_leaves_the_json_at_any_depth() {
        let path = |p: &str| p.split('.').map(str::to_string).collect::<Vec<_>>();
        let mut v = json!({"a": 1, "shot": {"png": "AAA", "w": 2}});
        assert_eq!(take_path(&mut v, &path("shot.png")), Some("AAA".into()));
        assert_eq!(v, json!({"a": 1, "shot": {"w": 2}}));
        // Absent (a result without a screenshot), or not a string: nothing taken, nothing lost.
        let mut v = json!({"a": 1, "shot": null});
        assert_eq!(take_path(&mut v, &path("shot.png")), None);
        let mut v = json!({"png": 5});
        assert_eq!(take_path(&mut v, &path("png")), None);
        assert_eq!(v, json!({"png": 5}));
    }

    #[test]
    fn head_tail_keeps_both_ends_within_budget() {
        let s = format!("{}{}", "a".repeat(50_000), "z".repeat(50_000));
        let out = head_tail(&s, 32 * 1024);
        assert!(out.len() <= 32 * 1024, "{}", out.len());
        assert!(out.starts_with("aaaa") && out.ends_with("zzzz"));
        assert!(out.contains("bytes omitted"));
    }

    #[test]
    fn head_tail_respects_char_boundaries() {
        let s = "é".repeat(40_000);
        let out = head_tail(&s, 1001);
        assert!(out.len() <= 1001);
    }

    #[test]
    fn caps_preserve_engine_counts() {
        let caps = vec![Cap {
            field: "stdout".into(),
            max_bytes: Some(10),
            max_items: None,
        }];
        let mut v = json!({"stdout": "x".repeat(100), "stdout_bytes": 5000});
        apply_caps(&caps, &mut v);
        assert_eq!(v["stdout_bytes"], 5000);
        assert_eq!(v["truncated"], true);
        let mut v = json!({"stdout": "x".repeat(100)});
        apply_caps(&caps, &mut v);
        assert_eq!(v["stdout_bytes"], 100);
        let mut v = json!({"stdout": "short"});
        apply_caps(&caps, &mut v);
        assert_eq!(v["truncated"], false);
    }

    #[test]
    fn caps_arrays() {
        let caps = vec![Cap {
            field: "entries".into(),
            max_bytes: None,
            max_items: Some(2),
        }];
        let mut v = json!({"entries": [1, 2, 3, 4]});
        apply_caps(&caps, &mut v);
        assert_eq!(
            v,
            json!({"entries": [1, 2], "entries_total": 4, "truncated": true})
        );
    }

    #[test]
    fn long_strings_are_left_out_of_the_text_copy_only() {
        let big = "A".repeat(TEXT_COPY_MAX_STRING + 1);
        let value = serde_json::json!({"zip_base64": big, "files": 3, "nested": [{"x": "short"}]});
        let copy = elided(&value).unwrap();
        assert_eq!(copy["files"], 3);
        assert_eq!(copy["nested"][0]["x"], "short");
        assert!(
            copy["zip_base64"]
                .as_str()
                .unwrap()
                .contains("2097153 bytes")
        );
        assert!(elided(&serde_json::json!({"stdout": "x".repeat(1000)})).is_none());
    }

    #[test]
    fn fill_placeholders() {
        let out = fill("Sandbox {sandbox_id} {{x}} {missing}", |n| {
            (n == "sandbox_id").then(|| "sbx_1".to_string())
        });
        assert_eq!(out, "Sandbox sbx_1 {x} (not given)");
    }
}
