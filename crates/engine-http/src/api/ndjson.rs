//! Streamed answers: NDJSON, one event per line — `output` events as the agent sends them, then
//! exactly one `result` (shaped like the JSON operation's response) or `error`.

use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use sandbox_mcp_api::server::Ndjson;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::Event;
use sandbox_mcp_model::ids;

/// An NDJSON answer from the agent's events; `finish` turns the reply into the `result`.
pub(super) fn events<R, F, Fut>(
    events: impl Stream<Item = Result<Event<R>, EngineError>> + Send + 'static,
    finish: F,
) -> Ndjson
where
    R: Send + 'static,
    F: Fn(R) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, EngineError>> + Send,
{
    let request_id = ids::current_request_id();
    let finish = Arc::new(finish);
    Ndjson::stream(events.then(move |event| {
        let finish = finish.clone();
        let request_id = request_id.clone();
        async move {
            match event {
                Ok(Event::Output(o)) => {
                    json!({"type": "output", "stream": o.stream, "data": o.data})
                }
                Ok(Event::Reply(reply)) => match finish(reply).await {
                    Ok(result) => json!({"type": "result", "result": result}),
                    Err(e) => error_event(e, &request_id),
                },
                Err(e) => error_event(e, &request_id),
            }
        }
    }))
}

/// An answer of one `result` event, for a request that has nothing to stream.
pub(super) fn result_only(result: Value) -> Ndjson {
    Ndjson::single(&json!({"type": "result", "result": result}))
}

fn error_event(e: EngineError, request_id: &str) -> Value {
    e.log(request_id);
    let body = e.body(request_id);
    json!({"type": "error", "error": body})
}
