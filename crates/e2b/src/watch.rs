//! envd's directory watches, on the agent's ([`sandbox_mcp_protocol::WatchDir`]): `WatchDir`
//! streams events as they come (the door takes them from the agent every few milliseconds), and
//! `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher` let a client poll instead. A stream's
//! watch is removed when the stream ends, however it ends; a polled one when the client removes
//! it or its sandbox is killed (the agent holds at most 32 per sandbox).

use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use sandbox_mcp_protocol::{FsEvent, FsEventKind, Unwatch, WatchDir, WatchEvents};

use crate::Door;
use crate::connect::{self, RpcError};

/// How often a stream's watch is read.
const POLL: Duration = Duration::from_millis(25);
/// Deadline of one agent call.
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Req {
    path: String,
    recursive: bool,
    watcher_id: String,
    include_entry: bool,
    /// Watching network mounts too: there are none in a sandbox here, so nothing to lift.
    #[allow(dead_code)]
    allow_network_mounts: bool,
}

fn kind(k: FsEventKind) -> &'static str {
    match k {
        FsEventKind::Create => "EVENT_TYPE_CREATE",
        FsEventKind::Write => "EVENT_TYPE_WRITE",
        FsEventKind::Remove => "EVENT_TYPE_REMOVE",
        FsEventKind::Rename => "EVENT_TYPE_RENAME",
        FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

fn event(e: &FsEvent) -> serde_json::Value {
    let mut v = serde_json::json!({"name": e.name, "type": kind(e.kind)});
    if let Some(entry) = &e.entry {
        let dir = std::path::Path::new(&e.path)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        v["entry"] = crate::files::entry(&dir, entry);
    }
    v
}

async fn start(door: &Door, id: &str, req: &Req) -> Result<String, RpcError> {
    if req.path.is_empty() {
        return Err(RpcError::invalid("path is required"));
    }
    let watch = WatchDir {
        path: crate::absolute(&req.path),
        recursive: req.recursive,
        entries: req.include_entry,
    };
    Ok(door
        .manager
        .agent
        .call(id, None, watch, DEADLINE)
        .await?
        .watch_id)
}

/// The watch calls of envd's `filesystem` service.
pub(crate) async fn rpc(
    door: &std::sync::Arc<Door>,
    method: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if method == "WatchDir" {
        return stream(door, headers, body).await;
    }
    let called = async {
        let s = crate::envd::sandbox(door, headers)
            .await
            .map_err(|r| r.rpc())?;
        crate::user::acting(door, &s.id, None).await?;
        let req: Req = connect::request(headers, body)?;
        match method {
            "CreateWatcher" => create(door, &s.id, &req).await,
            "GetWatcherEvents" => events(door, &s.id, &req).await,
            _ => remove(door, &s.id, &req).await,
        }
    };
    connect::reply(called.await)
}

/// `CreateWatcher`.
async fn create(door: &Door, id: &str, req: &Req) -> Result<serde_json::Value, RpcError> {
    Ok(serde_json::json!({"watcherId": start(door, id, req).await?}))
}

/// `GetWatcherEvents`: what happened since the last call.
async fn events(door: &Door, id: &str, req: &Req) -> Result<serde_json::Value, RpcError> {
    let take = WatchEvents {
        watch_id: req.watcher_id.clone(),
    };
    let got = door.manager.agent.call(id, None, take, DEADLINE).await?;
    Ok(serde_json::json!({"events": got.events.iter().map(event).collect::<Vec<_>>()}))
}

/// `RemoveWatcher`.
async fn remove(door: &Door, id: &str, req: &Req) -> Result<serde_json::Value, RpcError> {
    let unwatch = Unwatch {
        watch_id: req.watcher_id.clone(),
    };
    door.manager.agent.call(id, None, unwatch, DEADLINE).await?;
    Ok(serde_json::json!({}))
}

/// Removes a stream's watch when the stream is dropped (the client went, or it ended).
struct Held {
    door: std::sync::Arc<Door>,
    sandbox: String,
    watch: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let (door, sandbox) = (self.door.clone(), std::mem::take(&mut self.sandbox));
        let unwatch = Unwatch {
            watch_id: std::mem::take(&mut self.watch),
        };
        tokio::spawn(async move {
            let _ = door
                .manager
                .agent
                .call(&sandbox, None, unwatch, DEADLINE)
                .await;
        });
    }
}

/// `WatchDir`: a start event, then each event as it comes, until the client goes or its deadline
/// (`Connect-Timeout-Ms`) passes, or the directory goes.
async fn stream(door: &std::sync::Arc<Door>, headers: &HeaderMap, body: &[u8]) -> Response {
    let opened = async {
        let s = crate::envd::sandbox(door, headers)
            .await
            .map_err(|r| r.rpc())?;
        let req: Req = connect::stream_request(headers, body)?;
        crate::user::acting(door, &s.id, None).await?;
        let watch = start(door, &s.id, &req).await?;
        Ok::<_, RpcError>(Held {
            door: door.clone(),
            sandbox: s.id,
            watch,
        })
    };
    let held = match opened.await {
        Ok(h) => h,
        Err(e) => return connect::stream_error(e),
    };
    let deadline = crate::process::deadline_of(headers);
    struct St {
        held: Held,
        queue: std::collections::VecDeque<axum::body::Bytes>,
        started: bool,
        done: bool,
    }
    let st = St {
        held,
        queue: Default::default(),
        started: false,
        done: false,
    };
    let body = futures::stream::unfold(st, move |mut st| async move {
        if !st.started {
            st.started = true;
            return Some((connect::message(&serde_json::json!({"start": {}})), st));
        }
        loop {
            if let Some(next) = st.queue.pop_front() {
                return Some((next, st));
            }
            if st.done {
                return None;
            }
            if deadline.is_some_and(|at| tokio::time::Instant::now() >= at) {
                st.done = true;
                let late = RpcError::new("deadline_exceeded", "the watch ran past its timeout");
                return Some((connect::end(Some(&late)), st));
            }
            tokio::time::sleep(POLL).await;
            let take = WatchEvents {
                watch_id: st.held.watch.clone(),
            };
            let h = &st.held;
            match h
                .door
                .manager
                .agent
                .call(&h.sandbox, None, take, DEADLINE)
                .await
            {
                Ok(got) => {
                    for e in &got.events {
                        st.queue.push_back(connect::message(
                            &serde_json::json!({"filesystem": event(e)}),
                        ));
                    }
                    // The directory went: nothing more will come.
                    if got.ended {
                        st.done = true;
                        st.queue.push_back(connect::end(None));
                    }
                }
                Err(e) => {
                    st.done = true;
                    return Some((connect::end(Some(&RpcError::from(e))), st));
                }
            }
        }
    });
    connect::streaming(body)
}
