//! Answers to requests whose body was not read to its end say `Connection: close`.
//!
//! A server that answers before reading a whole request body (a body over a limit, a request
//! refused before its body is looked at) cannot use the connection again: the rest of the body
//! is still on it, so hyper closes it once the answer is sent. But hyper writes the answer's head
//! before it learns that the body was dropped, so the head does not say so, and an HTTP/1.1
//! client that has finished sending puts the connection back in its pool. Its next request then
//! races the close and fails with "connection closed before message completed" — seen with the
//! E2B SDK after an upload over the limit, on a busy machine.
//!
//! [`close_if_unread`] is the layer the engine's API, the E2B door and the MCP endpoint (with
//! OAuth) wear: it follows the request body, and when the handler has answered before the body's
//! end, it adds `Connection: close`, so the client never reuses the connection. HTTP/2 is left
//! alone (its streams end on their own), as are requests without a body and upgrades (101).
//! Previews do not wear it: they pass a sandbox server's own answers through as it gave them.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, Version, header};
use axum::middleware::Next;
use axum::response::Response;

/// The layer (`axum::middleware::from_fn(close_if_unread)`): see the module's documentation.
pub async fn close_if_unread(request: Request, next: Next) -> Response {
    if request.version() >= Version::HTTP_2 || request.body().is_end_stream() {
        return next.run(request).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(Followed {
            inner: body,
            ended: ended.clone(),
        })
    });
    let mut response = next.run(request).await;
    if !ended.load(Ordering::Acquire) && response.status() != StatusCode::SWITCHING_PROTOCOLS {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records reaching its end.
struct Followed {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl HttpBody for Followed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
