//! The API for a client in the same process ([`sandbox_mcp_api::InProcess`]): each request goes to
//! the same router the listener serves, with no socket in between.
//!
//! Each request runs as a task of its own on the engine's runtime, as a connection's would under
//! hyper: an engine served on a pool of its own (the stdio server's) keeps its work there, and a
//! handler that panics fails its one request with a 500 instead of taking the caller with it.
//! Dropping the answer's future aborts the task, as a client hanging up drops the handler. Once
//! the server stops, new requests get a 503, and its shutdown waits for those under way.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse as _, Response};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use sandbox_mcp_api::{InProcess, LocalAnswer};
use sandbox_mcp_engine::error::EngineError;

/// `app` for callers in this process; requests stop being taken once `stop` is cancelled, and
/// `tracker` follows those under way.
pub(crate) fn serve(app: Router, stop: CancellationToken, tracker: TaskTracker) -> InProcess {
    let runtime = tokio::runtime::Handle::current();
    InProcess::new(move |request| -> LocalAnswer {
        if stop.is_cancelled() {
            return Box::pin(std::future::ready(answer(stopping().into_response())));
        }
        let call = app.clone().oneshot(request.map(Body::new));
        let task = Aborting(runtime.spawn(tracker.track_future(call)));
        Box::pin(async move {
            answer(match task.await {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                // Logged with its request id by the error's response.
                Err(e) if e.is_panic() => EngineError::Task(e).into_response(),
                Err(_) => stopping().into_response(),
            })
        })
    })
}

/// Why a request finds the engine gone.
fn stopping() -> EngineError {
    EngineError::Unavailable {
        what: "the engine is shutting down; retry once it has restarted",
        source: "stopped".into(),
    }
}

/// `response` for the client, its body streamed as the engine produces it.
fn answer(response: Response) -> http::Response<reqwest::Body> {
    response.map(|body| reqwest::Body::wrap_stream(body.into_data_stream()))
}

/// A task aborted when its handle is dropped.
struct Aborting<T>(JoinHandle<T>);

impl<T> Future for Aborting<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::routing::get;

    use super::*;

    async fn buggy() -> &'static str {
        panic!("a handler's bug")
    }

    fn get_request(path: &str) -> http::Request<reqwest::Body> {
        http::Request::get(path)
            .body(reqwest::Body::from(""))
            .unwrap()
    }

    /// A handler that panics fails its own request with a 500; the engine goes on answering.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_handler_fails_its_request_with_a_500_and_nothing_else() {
        let app = Router::new()
            .route("/panics", get(buggy))
            .route("/ok", get(|| async { "ok" }));
        let local = serve(app, CancellationToken::new(), TaskTracker::new());
        let answer = local.call(get_request("/panics")).await;
        assert_eq!(answer.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        for _ in 0..3 {
            let answer = local.call(get_request("/ok")).await;
            assert_eq!(answer.status(), http::StatusCode::OK);
        }
    }
}
