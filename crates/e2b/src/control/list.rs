//! Listing sandboxes as E2B's SDKs ask: v1 (running), v2 (states, metadata, template, start
//! time, order, pages by `X-Next-Token`).

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use sandbox_mcp_model::record::{OnTimeout, Record, Status};

use super::{D, Detail, MAX_PAGE, detail};
use crate::{Door, Failure, caller};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    next_token: Option<String>,
    limit: Option<usize>,
    template: Option<String>,
    started_after: Option<String>,
    order: Option<String>,
}

/// `metadata` as the SDKs send it: `key=value&key=value`, URL-encoded (once more by the query).
fn metadata_filter(raw: Option<&str>) -> Result<Vec<(String, String)>, Failure> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(Vec::new());
    };
    raw.split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                Failure::bad(format!("metadata filter {pair:?} is not key=value"))
            })?;
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, Failure> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz");
                let b = u8::from_str_radix(hex, 16)
                    .map_err(|_| Failure::bad(format!("bad escape in metadata filter {s:?}")))?;
                out.push(b);
                i += 3;
            }
            b'%' => return Err(Failure::bad(format!("bad escape in metadata filter {s:?}"))),
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| Failure::bad("metadata filter is not UTF-8"))
}

async fn listed(
    door: &Door,
    headers: &HeaderMap,
    q: &ListQuery,
    states: &[Status],
) -> Result<Vec<Record>, Failure> {
    let tenant = caller(door, headers)?;
    let filter = metadata_filter(q.metadata.as_deref())?;
    let lifecycle = &door.manager.lifecycle;
    let mut records = lifecycle
        .list_current(None, &filter, tenant.as_deref())
        .await?;
    // Those past a timeout that pauses them are paused now, so that they are listed as they
    // are (the engine's timers would within a tick); those it kills are left out below.
    let now = sandbox_mcp_model::ids::now_ms();
    for r in records.iter_mut() {
        if r.timed_out(now)
            && r.on_timeout != OnTimeout::Kill
            && lifecycle.expire(&r.id, tenant.as_deref()).await.is_ok()
        {
            (r.status, r.expires_at) = (Status::Paused, None);
        }
    }
    let after = match q.started_after.as_deref() {
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| Failure::bad(format!("startedAfter is not an RFC 3339 time: {e}")))?
                .timestamp_millis(),
        ),
        None => None,
    };
    records.retain(|r| {
        states.contains(&r.status)
            && !r.timed_out(now)
            && q.template.as_ref().is_none_or(|t| *t == r.template)
            && after.is_none_or(|a| r.created_at >= a)
    });
    // Newest first unless asked otherwise, as E2B lists.
    records.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    match q.order.as_deref() {
        None | Some("desc") => records.reverse(),
        Some("asc") => {}
        Some(other) => return Err(Failure::bad(format!("order {other:?} is not asc or desc"))),
    }
    Ok(records)
}

pub(super) async fn list_running(
    State(door): D,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    match listed(&door, &headers, &q, &[Status::Running]).await {
        Ok(records) => Json(
            records
                .iter()
                .map(|r| detail(&door, r, &headers, false))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(f) => f.into_response(),
    }
}

pub(super) async fn list(
    State(door): D,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    let states = match q.state.as_deref() {
        None | Some("") => vec![Status::Running, Status::Paused],
        Some(s) => {
            let mut out = Vec::new();
            for part in s.split(',') {
                match part {
                    "running" => out.push(Status::Running),
                    "paused" => out.push(Status::Paused),
                    other => {
                        return Failure::bad(format!("state {other:?} is not running or paused"))
                            .into_response();
                    }
                }
            }
            out
        }
    };
    let records = match listed(&door, &headers, &q, &states).await {
        Ok(r) => r,
        Err(f) => return f.into_response(),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let start = match q.next_token.as_deref() {
        None | Some("") => 0,
        Some(t) => match records.iter().position(|r| r.id == t) {
            Some(i) => i,
            None => return Failure::bad("nextToken is not one this engine gave").into_response(),
        },
    };
    let page: Vec<Detail> = records
        .iter()
        .skip(start)
        .take(limit)
        .map(|r| detail(&door, r, &headers, false))
        .collect();
    let mut response = Json(page).into_response();
    if let Some(next) = records.get(start + limit)
        && let Ok(v) = HeaderValue::from_str(&next.id)
    {
        response.headers_mut().insert("x-next-token", v);
    }
    response
}
