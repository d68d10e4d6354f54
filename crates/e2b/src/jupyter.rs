//! The code interpreter's API (E2B's port 49999, what `e2b-code-interpreter` calls): `/execute`
//! streams a cell's output as NDJSON lines, and `/contexts` manages interpreters, on the
//! engine's REPL contexts (Python and JavaScript). A cell's value comes back as its text (the
//! interpreter's `repr()` or `util.inspect()`); rich outputs (images, HTML) are not produced.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use futures::StreamExt as _;
use serde::Deserialize;

use sandbox_mcp_engine::services::{EXEC_OUTPUT_CAP, Event};
use sandbox_mcp_protocol::{
    CodeOutcome, ContextInfo, CreateContext, DeleteContext, Language, ListContexts, RunCodeSpec,
    Stream,
};

use crate::envd::{Refusal, Sandbox, Service, sandbox_for};
use crate::{Door, Failure};

/// The sandbox a code interpreter call is for: its envd token or its traffic token opens it.
async fn sandbox(door: &Door, headers: &HeaderMap) -> Result<Sandbox, Refusal> {
    sandbox_for(door, headers, Service::Interpreter).await
}

/// A cell's deadline when the client names none, and the most it may name (E2B's default).
const CELL_TIMEOUT_MS: u64 = 300_000;
/// Deadline of the context operations (starting an interpreter on a cold cache takes a while).
const CONTEXT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

pub(crate) fn routes() -> Router<Arc<Door>> {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", post(create).get(list))
        .route("/contexts/{id}", delete(remove))
        .route("/contexts/{id}/restart", post(restart))
}

fn language(name: Option<&str>) -> Result<Language, Failure> {
    match name.unwrap_or("python") {
        "python" | "python3" | "" => Ok(Language::Python),
        "js" | "javascript" | "node" | "nodejs" => Ok(Language::Node),
        other => Err(Failure::bad(format!(
            "language {other:?} is not supported here: python or javascript"
        ))),
    }
}

#[derive(Deserialize)]
struct Execute {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

fn line(v: serde_json::Value) -> axum::body::Bytes {
    let mut s = v.to_string();
    s.push('\n');
    axum::body::Bytes::from(s)
}

fn now_ms() -> i64 {
    sandbox_mcp_model::ids::now_ms()
}

/// The lines a finished cell ends with: its value, its error.
fn outcome_lines(o: &CodeOutcome) -> Vec<axum::body::Bytes> {
    let mut out = Vec::new();
    if let Some(text) = &o.result {
        out.push(line(serde_json::json!({
            "type": "result", "text": text, "is_main_result": true,
        })));
    }
    if let Some(e) = &o.error {
        out.push(line(serde_json::json!({
            "type": "error", "name": e.name, "value": e.message, "traceback": e.traceback,
        })));
    } else if o.timed_out {
        out.push(line(serde_json::json!({
            "type": "error", "name": "TimeoutError",
            "value": "the cell ran past its timeout and was stopped", "traceback": "",
        })));
    }
    out
}

async fn execute(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let s = match sandbox(&door, &headers).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let req: Execute = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return Failure::bad(format!("invalid request body: {e}")).into_response(),
    };
    if req.context_id.is_some() && req.language.is_some() {
        return Failure::bad("give context_id or language, not both").into_response();
    }
    let lang = match language(req.language.as_deref()) {
        Ok(l) => l,
        Err(f) => return f.into_response(),
    };
    let env = req.env_vars.unwrap_or_default();
    let context_id = req.context_id;
    let spec = RunCodeSpec {
        code: req.code,
        context_id: context_id.clone(),
        language: lang,
        timeout_ms: CELL_TIMEOUT_MS,
        max_output_bytes: EXEC_OUTPUT_CAP,
        stream: true,
        env: Vec::new(),
    };
    // The cell's variables are set in the interpreter for it, and put back after it.
    let (set, restore) = match env_cells(lang, &env) {
        Ok(cells) => cells,
        Err(f) => return f.into_response(),
    };
    if let Some(code) = set
        && let Err(e) = helper_cell(&door, &s.id, lang, context_id.clone(), code).await
    {
        return Failure::from(e).into_response();
    }
    let deadline = door.manager.agent.exec_deadline(CELL_TIMEOUT_MS);
    let events = match door.manager.agent.stream(&s.id, None, spec, deadline).await {
        Ok(e) => e,
        Err(e) => return Failure::from(e).into_response(),
    };
    let lines = crate::lines::whole_lines(events).flat_map(|event| {
        let out: Vec<axum::body::Bytes> = match event {
            Ok(Event::Output(o)) => {
                let kind = match o.stream {
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                vec![line(serde_json::json!({
                    "type": kind, "text": o.data, "timestamp": now_ms() * 1000,
                }))]
            }
            Ok(Event::Reply(outcome)) => outcome_lines(&outcome),
            Err(e) => {
                let f = Failure::from(e);
                vec![line(serde_json::json!({
                    "type": "error", "name": "SandboxError", "value": f.message(), "traceback": "",
                }))]
            }
        };
        futures::stream::iter(out)
    });
    let (door2, id2) = (door.clone(), s.id.clone());
    let after = futures::stream::once(async move {
        if let Some(code) = restore
            && let Err(e) = helper_cell(&door2, &id2, lang, context_id, code).await
        {
            tracing::warn!(sandbox = %id2, "cannot put a cell's environment back: {e}");
        }
    })
    .filter_map(|()| async { None::<axum::body::Bytes> });
    let lines = lines.chain(after);
    let body = axum::body::Body::from_stream(lines.map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

/// The cells that set a cell's environment variables in its interpreter and put them back.
fn env_cells(
    lang: Language,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(Option<String>, Option<String>), Failure> {
    if env.is_empty() {
        return Ok((None, None));
    }
    for (k, v) in env {
        if !crate::valid_env(k, v) {
            return Err(Failure::bad(format!(
                "environment variable {:?} is invalid",
                k.chars().take(64).collect::<String>()
            )));
        }
    }
    let json = serde_json::to_string(env).unwrap_or_default();
    Ok(match lang {
        Language::Python => {
            // A JSON string is a Python string literal too.
            let literal = serde_json::to_string(&json).unwrap_or_default();
            (
                Some(format!(
                    "import os as _e2b_os, json as _e2b_json\n_e2b_new = _e2b_json.loads({literal})\n_e2b_saved = {{k: _e2b_os.environ.get(k) for k in _e2b_new}}\n_e2b_os.environ.update(_e2b_new)\nNone"
                )),
                Some(
                    "for _e2b_k, _e2b_v in _e2b_saved.items():\n    if _e2b_v is None:\n        _e2b_os.environ.pop(_e2b_k, None)\n    else:\n        _e2b_os.environ[_e2b_k] = _e2b_v\nNone".to_string(),
                ),
            )
        }
        Language::Node => (
            Some(format!(
                "globalThis.__e2bNew = {json}; globalThis.__e2bSaved = Object.fromEntries(Object.keys(__e2bNew).map(k => [k, process.env[k]])); Object.assign(process.env, __e2bNew); undefined"
            )),
            Some(
                "for (const [k, v] of Object.entries(globalThis.__e2bSaved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; } undefined".to_string(),
            ),
        ),
    })
}

/// Runs one of the door's own cells in the context a cell runs in.
async fn helper_cell(
    door: &Door,
    id: &str,
    lang: Language,
    context_id: Option<String>,
    code: String,
) -> Result<(), sandbox_mcp_engine::error::EngineError> {
    let spec = RunCodeSpec {
        code,
        context_id,
        language: lang,
        timeout_ms: 10_000,
        max_output_bytes: 1024,
        stream: false,
        env: Vec::new(),
    };
    let deadline = door.manager.agent.exec_deadline(10_000);
    door.manager.agent.call(id, None, spec, deadline).await?;
    Ok(())
}

fn context_json(c: &ContextInfo) -> serde_json::Value {
    let language = match c.language {
        Language::Python => "python",
        Language::Node => "javascript",
    };
    serde_json::json!({"id": c.context_id, "language": language, "cwd": c.cwd})
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

async fn create(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let s = sandbox(&door, &headers).await?;
        let req: NewContext = serde_json::from_slice(if body.is_empty() { b"{}" } else { &body })
            .map_err(|e| Failure::bad(format!("invalid request body: {e}")))?;
        let create = CreateContext {
            language: language(req.language.as_deref())?,
            cwd: req.cwd.filter(|c| !c.is_empty()),
            env: Vec::new(),
        };
        let c = door
            .manager
            .agent
            .call(&s.id, None, create, CONTEXT_DEADLINE)
            .await?;
        Ok::<_, Refused>(axum::Json(context_json(&c)))
    };
    done.await.into_response()
}

async fn list(State(door): State<Arc<Door>>, headers: HeaderMap) -> Response {
    let done = async {
        let s = sandbox(&door, &headers).await?;
        let list = door
            .manager
            .agent
            .call(&s.id, None, ListContexts {}, CONTEXT_DEADLINE)
            .await?;
        Ok::<_, Refused>(axum::Json(
            list.contexts.iter().map(context_json).collect::<Vec<_>>(),
        ))
    };
    done.await.into_response()
}

async fn remove(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let done = async {
        let s = sandbox(&door, &headers).await?;
        door.manager
            .agent
            .call(
                &s.id,
                None,
                DeleteContext { context_id: id },
                CONTEXT_DEADLINE,
            )
            .await?;
        Ok::<_, Refused>(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}

/// A restart ends the context's interpreter; the next cell starts a fresh one, same id.
async fn restart(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let done = async {
        let s = sandbox(&door, &headers).await?;
        let list = door
            .manager
            .agent
            .call(&s.id, None, ListContexts {}, CONTEXT_DEADLINE)
            .await?;
        let c = list
            .contexts
            .iter()
            .find(|c| c.context_id == id)
            .ok_or_else(|| {
                Failure::new(StatusCode::NOT_FOUND, format!("context {id} not found"))
            })?;
        if c.alive {
            let code = match c.language {
                Language::Python => "import os; os._exit(0)",
                Language::Node => "process.exit(0)",
            };
            let spec = RunCodeSpec {
                code: code.to_string(),
                context_id: Some(id),
                language: c.language,
                timeout_ms: 10_000,
                max_output_bytes: 1024,
                stream: false,
                env: Vec::new(),
            };
            let deadline = door.manager.agent.exec_deadline(10_000);
            door.manager.agent.call(&s.id, None, spec, deadline).await?;
        }
        Ok::<_, Refused>(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}

/// Why a code-interpreter call is refused: by the door (as E2B's proxy answers), or by the
/// engine or the request.
enum Refused {
    Door(crate::envd::Refusal),
    Failure(Failure),
}

impl From<crate::envd::Refusal> for Refused {
    fn from(r: crate::envd::Refusal) -> Self {
        Refused::Door(r)
    }
}

impl From<Failure> for Refused {
    fn from(f: Failure) -> Self {
        Refused::Failure(f)
    }
}

impl From<sandbox_mcp_engine::error::EngineError> for Refused {
    fn from(e: sandbox_mcp_engine::error::EngineError) -> Self {
        Refused::Failure(e.into())
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Door(r) => r.into_response(),
            Refused::Failure(f) => f.into_response(),
        }
    }
}
