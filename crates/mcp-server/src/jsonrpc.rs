//! What a JSON-RPC 2.0 message must be before it reaches rmcp, and the answer when it is not.
//!
//! rmcp drops a line it cannot parse without a word (the client then waits forever), answers an
//! invalid request with an error that has no `id` member at all, and answers a request whose
//! params it cannot read as if its method did not exist. JSON-RPC 2.0 wants exactly one answer
//! per request: `-32700` for a line that is not JSON, `-32600` for one that is not a valid
//! request, `-32602` for params that are wrong; none for a notification. Every answer carries the
//! request's id whenever a valid one can be read — [`IdScanner`] reads it even from a line that
//! breaks after it (a lone surrogate escape, invalid UTF-8) — since clients match answers to
//! requests by id, and `"id": null` only when none can. [`check`] decides that for one line
//! before rmcp sees it; [`add_null_id`] mends whatever rmcp still answers without an id.

use serde_json::{Map, Value, json};

/// Largest request body accepted over HTTP (`/mcp` and hosted servers alike).
pub(crate) const BODY_LIMIT: usize = 16 * 1024 * 1024;

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
                readable_id(line),
                PARSE_ERROR,
                "Parse error: the line is not valid UTF-8",
            ));
        }
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let hint = if e.to_string().contains("surrogate") {
                " (JSON strings must be valid Unicode: a \\uD800-\\uDFFF escape needs its pair)"
            } else {
                ""
            };
            return Check::Answer(error(
                readable_id(line),
                PARSE_ERROR,
                &format!("Parse error: {e}{hint}"),
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
        // The id goes back whenever it is a valid one, whatever else is wrong: a client waits
        // for an answer to its own id, and one with a null id matches none of its requests.
        Err((code, why)) => Check::Answer(error(
            object
                .get("id")
                .filter(|id| valid_id(id))
                .cloned()
                .unwrap_or(Value::Null),
            code,
            &why,
        )),
    }
}

/// The id of a line that is not a valid message, as far as it can be read: its top-level
/// `"id"` when that was read whole and is a valid id, else null (JSON-RPC 2.0, section 5).
/// A line broken after its id (a lone surrogate escape, invalid UTF-8, a cut-off object) is
/// still answered to the request the client is waiting on.
fn readable_id(line: &[u8]) -> Value {
    let mut scanner = IdScanner::default();
    scanner.feed(line);
    scanner.id().filter(valid_id).unwrap_or(Value::Null)
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
        Some(Value::String(method)) => match o.get("params") {
            None if o.contains_key("id") => check_params(method, &Map::new()),
            Some(Value::Object(params)) if o.contains_key("id") => check_params(method, params),
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

/// What a member of a request's params must be.
#[derive(Clone, Copy)]
enum Kind {
    String,
    Object,
}

/// Checks the params of the requests this server answers against what MCP says they hold.
/// rmcp answers a request whose params do not deserialize as if its method did not exist (or
/// with an id-less error), which tells the client nothing; here it gets invalid params, its own
/// id, and the member that is wrong.
fn check_params(method: &str, params: &Map<String, Value>) -> Result<(), (i64, String)> {
    use Kind::{Object, String as Str};
    let members: &[(&str, Kind, bool)] = match method {
        "initialize" => &[
            ("protocolVersion", Str, true),
            ("capabilities", Object, true),
            ("clientInfo", Object, true),
        ],
        "tools/call" => &[("name", Str, true), ("arguments", Object, false)],
        "tools/list" | "resources/list" | "resources/templates/list" | "prompts/list" => {
            &[("cursor", Str, false)]
        }
        _ => &[],
    };
    let wrong = |why: String| Err((INVALID_PARAMS, format!("Invalid params: {why}")));
    if params.get("_meta").is_some_and(|m| !m.is_object()) {
        return wrong("\"params._meta\" must be an object".into());
    }
    for (name, kind, required) in members {
        let ok = match (params.get(*name), kind) {
            (None, _) => !required,
            (Some(v), Str) => v.is_string(),
            (Some(v), Object) => v.is_object(),
        };
        if !ok {
            let what = match kind {
                Str => "a string",
                Object => "an object",
            };
            let need = if *required { "is required and " } else { "" };
            return wrong(format!("\"params.{name}\" {need}must be {what} ({method})"));
        }
    }
    if method == "initialize"
        && let Some(Value::Object(info)) = params.get("clientInfo")
        && !(info.get("name").is_some_and(Value::is_string)
            && info.get("version").is_some_and(Value::is_string))
    {
        return wrong("\"params.clientInfo\" needs a string \"name\" and \"version\"".into());
    }
    Ok(())
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

/// Finds the top-level `"id"` of a JSON object streamed through it, in constant memory.
#[derive(Default)]
pub struct IdScanner {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1: what the next token is.
    state: State,
    key: Vec<u8>,
    value: Vec<u8>,
    found: Option<serde_json::Value>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Key,
    Colon,
    Value,
    ValueOfId,
    Other,
}

impl IdScanner {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.found.is_some() {
                return;
            }
            self.step(b);
        }
    }

    pub fn id(&self) -> Option<serde_json::Value> {
        self.found.clone()
    }

    fn step(&mut self, b: u8) {
        let capturing_id = self.state == State::ValueOfId && self.depth == 1;
        if capturing_id && self.value.len() < 256 {
            self.value.push(b);
        }
        if self.in_string {
            // A key is kept as written, escapes too: `"i\\d"` is not `id`.
            let in_key = self.depth == 1 && self.state == State::Key && self.key.len() < 8;
            if self.escaped {
                self.escaped = false;
                if in_key {
                    self.key.push(b);
                }
            } else if b == b'\\' {
                self.escaped = true;
                if in_key {
                    self.key.push(b);
                }
            } else if b == b'"' {
                self.in_string = false;
                if self.depth == 1 && self.state == State::Key {
                    self.state = State::Colon;
                }
            } else if self.depth == 1 && self.state == State::Key && self.key.len() < 8 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.state == State::Key {
                    self.key.clear();
                }
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                if self.depth == 1 && capturing_id {
                    self.finish_id();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 && self.state == State::Colon => {
                self.state = if self.key == b"id" {
                    self.value.clear();
                    State::ValueOfId
                } else {
                    State::Value
                };
            }
            b',' if self.depth == 1 => {
                if capturing_id {
                    self.finish_id();
                }
                self.state = State::Key;
            }
            _ => {}
        }
        if self.state == State::Value && self.depth > 1 {
            self.state = State::Other;
        }
    }

    fn finish_id(&mut self) {
        let raw = &self.value[..self.value.len().saturating_sub(1)]; // drop the `,` or `}`
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(raw)
            && (v.is_string() || v.is_number())
        {
            self.found = Some(v);
        }
        self.state = State::Key;
    }
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
    fn lines_that_are_not_json_get_a_parse_error_for_the_id_they_name() {
        for (line, id) in [
            (&br#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#[..], json!(1)),
            (b"garbage", Value::Null),
            (br#""\udcff""#, Value::Null),
            (
                br#"{"jsonrpc":"2.0","id":2,"method":"ping","x":"\udcff"}"#,
                json!(2),
            ),
            (
                br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x","arguments":{"path":"/root/\udcff"}}}"#,
                json!("a"),
            ),
            (
                br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{"\ud800":1}}}"#,
                json!(3),
            ),
            (b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\",\"x\":\"\xff\"}", json!(4)),
            (br#"{"jsonrpc":"2.0","id":5,"method":"ping","x":[[[[[["#, json!(5)),
            (br#"{"jsonrpc":"2.0","id":null,"x":"\udcff"}"#, Value::Null),
            (br#"{"jsonrpc":"2.0","id":1.5,"x":"\udcff"}"#, Value::Null),
            (br#"{"jsonrpc":"2.0","x":"\udcff","id":6}"#, json!(6)),
            (b"\xff\xfe", Value::Null),
            (b"", Value::Null),
        ] {
            let a = answer(line);
            assert_eq!(a["error"]["code"], PARSE_ERROR, "{a}");
            assert!(a.as_object().unwrap().contains_key("id"), "{a}");
            assert_eq!(a["id"], id, "{}", String::from_utf8_lossy(line));
            assert_eq!(a["jsonrpc"], "2.0");
        }
        let a = answer(br#"{"jsonrpc":"2.0","id":2,"method":"ping","x":"\udcff"}"#);
        let message = a["error"]["message"].as_str().unwrap();
        assert!(message.contains("needs its pair"), "{message}");
    }

    #[test]
    fn invalid_requests_get_invalid_request_with_the_id_when_valid() {
        for line in [
            &b"1"[..],
            br#""str""#,
            b"[]",
            b"{}",
            b"null",
            br#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#,
            br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":6.5,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","method":5}"#,
        ] {
            let a = answer(line);
            assert_eq!(a["error"]["code"], INVALID_REQUEST, "{a}");
            assert!(a["id"].is_null(), "{a}");
        }
        for (line, id) in [
            (
                &br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#[..],
                json!(7),
            ),
            (br#"{"id":3,"method":"ping"}"#, json!(3)),
            (br#"{"jsonrpc":"2.0","id":"x","method":5}"#, json!("x")),
            (br#"{"jsonrpc":"2.0","id":1}"#, json!(1)),
            (
                br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}"#,
                json!(1),
            ),
        ] {
            let a = answer(line);
            assert_eq!(a["error"]["code"], INVALID_REQUEST, "{a}");
            assert_eq!(a["id"], id, "{a}");
        }
        let a = answer(br#"{"jsonrpc":"2.0","id":9,"method":"ping","params":5}"#);
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!(9), json!(INVALID_PARAMS))
        );
    }

    #[test]
    fn requests_with_params_rmcp_cannot_read_get_invalid_params_naming_the_member() {
        for (line, member) in [
            (&br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":5}}"#[..], "name"),
            (br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{}}"#, "name"),
            (br#"{"jsonrpc":"2.0","id":10,"method":"tools/call"}"#, "name"),
            (
                br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"x","arguments":"y"}}"#,
                "arguments",
            ),
            (br#"{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{"cursor":5}}"#, "cursor"),
            (br#"{"jsonrpc":"2.0","id":10,"method":"ping","params":{"_meta":5}}"#, "_meta"),
            (br#"{"jsonrpc":"2.0","id":10,"method":"initialize","params":{}}"#, "protocolVersion"),
            (
                br#"{"jsonrpc":"2.0","id":10,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x"}}}"#,
                "clientInfo",
            ),
        ] {
            let a = answer(line);
            assert_eq!(a["id"], json!(10), "{a}");
            assert_eq!(a["error"]["code"], INVALID_PARAMS, "{a}");
            let message = a["error"]["message"].as_str().unwrap();
            assert!(message.contains(member), "{message}");
        }
        // Notifications are never answered, whatever their params.
        assert_eq!(
            check(br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":5}}"#),
            Check::Forward
        );
    }

    #[test]
    fn valid_messages_are_forwarded() {
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#[..],
            br#"{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            br#"{"jsonrpc":"2.0","method":"no/such/notification"}"#,
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","arguments":{},"_meta":{"progressToken":1}}}"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
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

    fn scan(text: &str) -> Option<serde_json::Value> {
        let mut s = IdScanner::default();
        for chunk in text.as_bytes().chunks(3) {
            s.feed(chunk);
        }
        s.id()
    }

    #[test]
    fn a_key_with_an_escape_is_not_id() {
        assert_eq!(scan(r#"{"i\\d":1,"id":"x"}"#), Some(json!("x")));
    }

    #[test]
    fn finds_top_level_id_anywhere() {
        assert_eq!(
            scan(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#),
            Some(7.into())
        );
        assert_eq!(
            scan(r#"{"method":"x","params":{"id":99,"s":"\"id\":1"},"id":"abc"}"#),
            Some("abc".into())
        );
        assert_eq!(scan(r#"{"params":{"arguments":{"id":5}}}"#), None);
        assert_eq!(scan(r#"{ "id" : 12 , "x": 1}"#), Some(12.into()));
    }
}
