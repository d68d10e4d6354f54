//! What a JSON-RPC 2.0 message must be before it reaches rmcp, and the answer when it is not.
//!
//! rmcp drops a line it cannot parse without a word (the client then waits forever), and answers
//! an invalid request with an error that has no `id` member at all. JSON-RPC 2.0 wants exactly one
//! answer per request: `-32700` for a line that is not JSON, `-32600` for one that is not a valid
//! request, each with `"id": null` unless the request's own id could be read; and none for a
//! notification. [`check`] decides that for one line before rmcp sees it; [`add_null_id`] mends
//! whatever rmcp still answers without an id.

use serde_json::{Map, Value, json};

pub(crate) const PARSE_ERROR: i64 = -32700;
pub(crate) const INVALID_REQUEST: i64 = -32600;
pub(crate) const INVALID_PARAMS: i64 = -32602;

/// What to do with one line from the client.
#[derive(Debug, PartialEq)]
pub(crate) enum Check {
    /// A well-formed request, notification or response: rmcp handles it.
    Forward,
    /// Not one: send this error response instead (rmcp never sees the line).
    Answer(Value),
}

/// An error response.
pub(crate) fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Checks one line (without its newline).
pub(crate) fn check(line: &[u8]) -> Check {
    // (Invalid params are only found in a valid request, so its id is valid too.)
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(_) => {
            return Check::Answer(error(
                Value::Null,
                PARSE_ERROR,
                "Parse error: the line is not valid UTF-8",
            ));
        }
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Check::Answer(error(
                Value::Null,
                PARSE_ERROR,
                &format!("Parse error: {e}"),
            ));
        }
    };
    let object = match value {
        Value::Object(o) => o,
        Value::Array(items) if !items.is_empty() => {
            return Check::Answer(error(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: batches are not supported (MCP removed JSON-RPC batching in 2025-06-18); send one message per line",
            ));
        }
        _ => {
            return Check::Answer(error(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: a message must be a JSON object",
            ));
        }
    };
    match check_object(&object) {
        Ok(()) => Check::Forward,
        // An invalid Request object answers with a null id (JSON-RPC 2.0, section 5); invalid
        // params belong to a request whose id goes back.
        Err((INVALID_PARAMS, why)) => Check::Answer(error(
            object.get("id").cloned().unwrap_or(Value::Null),
            INVALID_PARAMS,
            &why,
        )),
        Err((code, why)) => Check::Answer(error(Value::Null, code, &why)),
    }
}

/// A request id MCP accepts: a string, or an integer that fits in 64 bits.
fn valid_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(n) => n.is_i64(),
        _ => false,
    }
}

fn check_object(o: &Map<String, Value>) -> Result<(), (i64, String)> {
    let invalid = |why: &str| Err((INVALID_REQUEST, format!("Invalid Request: {why}")));
    if o.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    if let Some(id) = o.get("id")
        && !valid_id(id)
    {
        return invalid("\"id\" must be a string or an integer (and not null)");
    }
    match o.get("method") {
        Some(Value::String(_)) => match o.get("params") {
            None | Some(Value::Object(_)) => Ok(()),
            // Params must be structured: without an id, that makes the message an invalid
            // Request object (not a notification, which would get no answer).
            Some(_) if !o.contains_key("id") => invalid("\"params\" must be an object"),
            Some(_) => Err((
                INVALID_PARAMS,
                "Invalid params: \"params\" must be an object".into(),
            )),
        },
        Some(_) => invalid("\"method\" must be a string"),
        // No method: a response to a request of ours.
        None => {
            if !o.contains_key("id") {
                return invalid(
                    "a message needs \"method\" (a request or notification) or \"id\" with \"result\" or \"error\" (a response)",
                );
            }
            match (o.get("result"), o.get("error")) {
                (Some(_), None) => Ok(()),
                (None, Some(Value::Object(e)))
                    if e.get("code").is_some_and(Value::is_i64)
                        && e.get("message").is_some_and(Value::is_string) =>
                {
                    Ok(())
                }
                (None, Some(_)) => invalid(
                    "\"error\" must be an object with an integer \"code\" and a string \"message\"",
                ),
                _ => invalid("a response needs exactly one of \"result\" and \"error\""),
            }
        }
    }
}

/// rmcp answers some invalid messages with an error that has no `id` member; JSON-RPC requires
/// `"id": null` there. Returns the mended line, or `None` when it needs no change.
pub(crate) fn add_null_id(line: &[u8]) -> Option<Vec<u8>> {
    // Cheap test first: rmcp writes `jsonrpc` first and `id` before `error` when it has one.
    if !line.starts_with(br#"{"jsonrpc":"2.0","error":"#) {
        return None;
    }
    let mut value: Map<String, Value> = serde_json::from_slice(line).ok()?;
    if value.contains_key("id") {
        return None;
    }
    value.insert("id".into(), Value::Null);
    let mut out = serde_json::to_vec(&value).ok()?;
    out.push(b'\n');
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn answer(line: &[u8]) -> Value {
        match check(line) {
            Check::Answer(v) => v,
            Check::Forward => panic!("{} was forwarded", String::from_utf8_lossy(line)),
        }
    }

    #[test]
    fn lines_that_are_not_json_get_a_parse_error_with_a_null_id() {
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#[..],
            b"garbage",
            br#""\udcff""#,
            br#"{"jsonrpc":"2.0","id":2,"method":"ping","x":"\udcff"}"#,
            b"\xff\xfe",
            b"",
        ] {
            let a = answer(line);
            assert_eq!(a["error"]["code"], PARSE_ERROR, "{a}");
            assert!(a.as_object().unwrap().contains_key("id") && a["id"].is_null());
            assert_eq!(a["jsonrpc"], "2.0");
        }
    }

    #[test]
    fn invalid_requests_get_invalid_request_with_the_id_when_readable() {
        for line in [
            &b"1"[..],
            br#""str""#,
            b"[]",
            b"{}",
            b"null",
            br#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#,
            br#"{"id":3,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":6.5,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","method":5}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}"#,
        ] {
            let a = answer(line);
            assert_eq!(a["error"]["code"], INVALID_REQUEST, "{a}");
            assert!(a["id"].is_null(), "{a}");
        }
        for line in [
            &br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#[..],
            br#"{"jsonrpc":"2.0","id":"x","method":5}"#,
        ] {
            let a = answer(line);
            assert_eq!(a["error"]["code"], INVALID_REQUEST, "{a}");
            assert!(
                a["id"].is_null(),
                "an invalid Request object gets a null id: {a}"
            );
        }
        let a = answer(br#"{"jsonrpc":"2.0","id":9,"method":"ping","params":5}"#);
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!(9), json!(INVALID_PARAMS))
        );
    }

    #[test]
    fn valid_messages_are_forwarded() {
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#[..],
            br#"{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            br#"{"jsonrpc":"2.0","method":"no/such/notification"}"#,
            br#"{"jsonrpc":"2.0","id":5,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":5,"error":{"code":-1,"message":"no"}}"#,
        ] {
            assert_eq!(
                check(line),
                Check::Forward,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn id_less_errors_from_rmcp_get_a_null_id() {
        let mended = add_null_id(
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid request"}}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&mended).unwrap();
        assert!(v.as_object().unwrap().contains_key("id") && v["id"].is_null());
        assert_eq!(
            add_null_id(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            None
        );
    }
}
