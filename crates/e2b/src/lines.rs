//! A cell's output as E2B's kernel sends it: whole lines.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{Stream, StreamExt};
use sandbox_mcp_engine::services::Event;
use sandbox_mcp_protocol::Output;

/// How long an unfinished line waits for the rest of it before it goes out as it is (a progress
/// bar's dots still arrive while the cell runs). Jupyter's kernel flushes a cell's output on a
/// timer of the same order.
const LINE_WAIT: Duration = Duration::from_millis(200);

/// `events` with each stream's output regrouped into whole lines. The agent reads the cell's
/// pipe as the writes arrive, so `print('hi')`, which Python writes as `hi` and then `\n`, came
/// as one message or two depending on the machine's load; E2B's clients (`logs.stdout`) see
/// one. A chunk's unfinished last line waits for the rest of it until other output, the reply,
/// the end or [`LINE_WAIT`] comes first; nothing is held back past any of them.
pub(crate) fn whole_lines<R, E>(
    events: impl Stream<Item = Result<Event<R>, E>> + Send + 'static,
) -> impl Stream<Item = Result<Event<R>, E>> + Send + 'static
where
    R: Send + 'static,
    E: Send + 'static,
{
    let state = Lines {
        events: Box::pin(events),
        partial: None,
        ready: VecDeque::new(),
        ended: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.ready.pop_front() {
                return Some((item, st));
            }
            if st.ended {
                return None;
            }
            let next = if st.partial.is_some() {
                match tokio::time::timeout(LINE_WAIT, st.events.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        st.flush();
                        continue;
                    }
                }
            } else {
                st.events.next().await
            };
            match next {
                Some(Ok(Event::Output(output))) => st.take(output),
                Some(other) => {
                    st.flush();
                    st.ready.push_back(other);
                }
                None => {
                    st.flush();
                    st.ended = true;
                }
            }
        }
    })
}

struct Lines<S, R, E> {
    events: std::pin::Pin<Box<S>>,
    /// The unfinished last line of one stream.
    partial: Option<Output>,
    ready: VecDeque<Result<Event<R>, E>>,
    ended: bool,
}

impl<S, R, E> Lines<S, R, E> {
    fn flush(&mut self) {
        if let Some(partial) = self.partial.take() {
            self.ready.push_back(Ok(Event::Output(partial)));
        }
    }

    /// Adds a chunk: what ends with a newline goes out, the rest waits.
    fn take(&mut self, output: Output) {
        let stream = output.stream;
        let mut current = match self.partial.take() {
            Some(mut p) if p.stream == output.stream => {
                p.data.push_str(&output.data);
                p
            }
            other => {
                self.partial = other;
                self.flush();
                output
            }
        };
        match current.data.rfind('\n') {
            Some(end) if end + 1 < current.data.len() => {
                let rest = current.data.split_off(end + 1);
                self.ready.push_back(Ok(Event::Output(current)));
                self.partial = Some(Output { stream, data: rest });
            }
            Some(_) => self.ready.push_back(Ok(Event::Output(current))),
            None => self.partial = Some(current),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use sandbox_mcp_protocol::Stream as Pipe;
    use tokio::sync::mpsc;

    use super::*;

    fn out(stream: Pipe, data: &str) -> Result<Event<u8>, ()> {
        Ok(Event::Output(Output {
            stream,
            data: data.into(),
        }))
    }

    /// What comes out of events sent after the given pauses (in milliseconds of the test's
    /// paused clock), as text.
    async fn collect(events: Vec<(u64, Result<Event<u8>, ()>)>) -> Vec<String> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            for (pause_ms, e) in events {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                tx.send(e).unwrap();
            }
        });
        whole_lines(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
            .map(|e| match e {
                Ok(Event::Output(o)) => format!("{:?} {:?}", o.stream, o.data),
                Ok(Event::Reply(r)) => format!("reply {r}"),
                Err(()) => "error".into(),
            })
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_written_in_two_writes_is_one_message() {
        let got = collect(vec![
            (0, out(Pipe::Stdout, "hi")),
            (5, out(Pipe::Stdout, "\n")),
            (0, out(Pipe::Stdout, "a\nb")),
            (5, out(Pipe::Stdout, "c\nd")),
            (0, Ok(Event::Reply(7))),
        ])
        .await;
        assert_eq!(
            got,
            [
                r#"Stdout "hi\n""#,
                r#"Stdout "a\n""#,
                r#"Stdout "bc\n""#,
                r#"Stdout "d""#,
                "reply 7"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unfinished_line_goes_out_after_a_pause_or_when_the_other_stream_writes() {
        let got = collect(vec![
            (0, out(Pipe::Stdout, "...")),
            (1000, out(Pipe::Stdout, "..")),
            (0, out(Pipe::Stderr, "warn")),
            (0, out(Pipe::Stdout, "done\n")),
            (0, Err(())),
        ])
        .await;
        assert_eq!(
            got,
            [
                r#"Stdout "...""#,
                r#"Stdout "..""#,
                r#"Stderr "warn""#,
                r#"Stdout "done\n""#,
                "error"
            ]
        );
    }
}
