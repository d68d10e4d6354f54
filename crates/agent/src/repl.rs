//! Persistent interpreters (Python, Node) behind `sandbox_run_code`.
//!
//! Each context is one long-lived interpreter process running a small driver
//! (`drivers/python.py`, `drivers/node.js`) that reads cells on fd 3 and answers on fd 4; the cell's
//! own output goes to the interpreter's real stdout and stderr, which are captured like an exec's.
//! Variables, imports and open files persist between calls. A timeout or a cancelled call first
//! interrupts the cell (SIGINT: Python raises KeyboardInterrupt, Node's `breakOnSigint` throws), so
//! the context usually survives; an interpreter that does not stop within a grace period is killed,
//! and the call says its state is lost. The next call then starts a fresh interpreter.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;

use super::exec::{Pump, hangup, sleep_until_due, wait_exit};
use super::live::{self, AgentEnds};
use super::reaper::{Exit, Reaper};
use super::spawn::{self, Launch, default_cwd, error};
use sandbox_mcp_protocol::{
    AgentError, CodeError, CodeOutcome, ContextDeleted, ContextInfo, ContextList, CreateContext,
    DeleteContext, ErrorKind, Language, PipeRole, RunCodeSpec, Tree, TreeKind, TreePipe,
};
use sandbox_mcp_sys::now_ms;

const PYTHON_DRIVER: &str = include_str!("drivers/python.py");
const NODE_DRIVER: &str = include_str!("drivers/node.js");
/// How long an interrupted cell may take to stop before its interpreter is killed.
const INTERRUPT_GRACE: Duration = Duration::from_millis(1500);
/// Most contexts per sandbox (each is an interpreter process).
pub(crate) const MAX_CONTEXTS: usize = 16;

struct Interp {
    pid: i32,
    requests: pipe::Sender,
    responses: BufReader<pipe::Receiver>,
    /// Lent to the pump while a cell runs, then given back.
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    exit: Option<tokio::sync::oneshot::Receiver<Exit>>,
}

struct Context {
    id: String,
    language: Language,
    cwd: String,
    created_at: i64,
    is_default: bool,
    interp: tokio::sync::Mutex<Option<Interp>>,
    /// The interpreter died since the last call: the next call runs in a fresh one.
    died: Cell<bool>,
    alive: Cell<bool>,
}

impl Context {
    fn info(&self) -> ContextInfo {
        ContextInfo {
            context_id: self.id.clone(),
            language: self.language,
            cwd: self.cwd.clone(),
            created_at: self.created_at,
            alive: self.alive.get(),
            is_default: self.is_default,
        }
    }
}

#[derive(Default)]
pub(crate) struct Contexts {
    map: RefCell<BTreeMap<String, Rc<Context>>>,
    next: Cell<u32>,
}

fn spawn_interp(
    language: Language,
    cwd: &str,
    env: &[(String, String)],
    reaper: &Reaper,
) -> Result<Interp, AgentError> {
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| error(ErrorKind::Io, format!("cannot create a pipe: {e}")))
    };
    let (req_r, req_w) = pipe()?;
    let (resp_r, resp_w) = pipe()?;
    let (program, args): (&str, Vec<&str>) = match language {
        Language::Python => ("python3", vec!["-u", "-c", PYTHON_DRIVER]),
        Language::Node => ("node", vec!["-e", NODE_DRIVER]),
    };
    let launch = Launch {
        program,
        args: &args,
        cwd,
        env: &[env],
        extra_fds: &[req_r.as_raw_fd(), resp_w.as_raw_fd()],
        ..Default::default()
    };
    let started = spawn::start(&launch, reaper)?;
    // The child has its copies; ours must close so EOFs arrive when it dies.
    drop(req_r);
    drop(resp_w);
    let to_sender = |fd: OwnedFd| {
        pipe::Sender::from_owned_fd(fd).map_err(|e| {
            error(
                ErrorKind::Io,
                format!("cannot talk to the interpreter: {e}"),
            )
        })
    };
    let to_receiver = |fd: OwnedFd| {
        pipe::Receiver::from_owned_fd(fd).map_err(|e| {
            error(
                ErrorKind::Io,
                format!("cannot talk to the interpreter: {e}"),
            )
        })
    };
    Ok(Interp {
        pid: started.pid,
        requests: to_sender(req_w)?,
        responses: BufReader::new(to_receiver(resp_r)?),
        stdout: Some(started.stdout),
        stderr: started.stderr,
        exit: Some(started.exit),
    })
}

impl Contexts {
    fn default_id(language: Language) -> String {
        language.as_str().to_string()
    }

    fn get(&self, id: &str) -> Option<Rc<Context>> {
        self.map.borrow().get(id).cloned()
    }

    fn insert(&self, ctx: Context) -> Result<Rc<Context>, AgentError> {
        if self.map.borrow().len() >= MAX_CONTEXTS {
            return Err(error(
                ErrorKind::Conflict,
                format!(
                    "this sandbox already has {MAX_CONTEXTS} code contexts; delete one with sandbox_code_context_delete (see sandbox_code_context_list)"
                ),
            ));
        }
        let ctx = Rc::new(ctx);
        self.map.borrow_mut().insert(ctx.id.clone(), ctx.clone());
        Ok(ctx)
    }

    /// `CreateContext`: registers a context and starts its interpreter.
    pub(crate) async fn create(
        &self,
        CreateContext {
            language,
            cwd,
            env: extra,
        }: CreateContext,
        env: &[(String, String)],
        reaper: &Reaper,
    ) -> Result<ContextInfo, AgentError> {
        let env: Vec<(String, String)> = env.iter().cloned().chain(extra).collect();
        let env = env.as_slice();
        let cwd = cwd.unwrap_or_else(|| default_cwd().to_string());
        spawn::check(&cwd, &[])?;
        let n = self.next.get() + 1;
        self.next.set(n);
        let ctx = self.insert(Context {
            id: format!("ctx_{n}"),
            language,
            cwd: cwd.clone(),
            created_at: now_ms(),
            is_default: false,
            interp: tokio::sync::Mutex::new(None),
            died: Cell::new(false),
            alive: Cell::new(false),
        })?;
        match spawn_interp(language, &cwd, env, reaper) {
            Ok(interp) => {
                *ctx.interp.lock().await = Some(interp);
                ctx.alive.set(true);
                Ok(ctx.info())
            }
            Err(e) => {
                self.map.borrow_mut().remove(&ctx.id);
                Err(e)
            }
        }
    }

    pub(crate) fn list(&self) -> ContextList {
        ContextList {
            contexts: self.map.borrow().values().map(|c| c.info()).collect(),
        }
    }

    pub(crate) async fn delete(
        &self,
        DeleteContext { context_id }: DeleteContext,
    ) -> Result<ContextDeleted, AgentError> {
        let Some(ctx) = self.map.borrow_mut().remove(&context_id) else {
            return Err(unknown(&context_id));
        };
        if let Some(interp) = ctx.interp.lock().await.take() {
            spawn::kill_group(interp.pid);
        }
        Ok(ContextDeleted { context_id })
    }

    /// `RunCode`: runs one cell in its context, starting the interpreter if needed.
    pub(crate) async fn run<R, W>(
        &self,
        spec: RunCodeSpec,
        env: &[(String, String)],
        reaper: &Reaper,
        rd: &mut R,
        wr: &mut W,
    ) -> Result<CodeOutcome, AgentError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let ctx = match &spec.context_id {
            Some(id) => self.get(id).ok_or_else(|| unknown(id))?,
            None => {
                let id = Self::default_id(spec.language);
                match self.get(&id) {
                    Some(c) => c,
                    None => self.insert(Context {
                        id,
                        language: spec.language,
                        cwd: default_cwd().to_string(),
                        created_at: now_ms(),
                        is_default: true,
                        interp: tokio::sync::Mutex::new(None),
                        died: Cell::new(false),
                        alive: Cell::new(false),
                    })?,
                }
            }
        };
        if spec.code.contains('\0') {
            return Err(error(
                ErrorKind::InvalidArgument,
                "code contains a NUL byte",
            ));
        }
        // One cell at a time per context.
        let mut slot = ctx.interp.lock().await;
        let restarted = ctx.died.replace(false);
        if slot.is_none() {
            let env: Vec<(String, String)> = env.iter().chain(&spec.env).cloned().collect();
            *slot = Some(spawn_interp(ctx.language, &ctx.cwd, &env, reaper)?);
            ctx.alive.set(true);
        }
        let Some(interp) = slot.as_mut() else {
            return Err(error(ErrorKind::Io, "no interpreter"));
        };
        let outcome = run_cell(interp, &ctx, &spec, restarted, rd, wr).await;
        if outcome.as_ref().is_ok_and(|o| o.context_lost) || outcome.is_err() {
            if let Some(dead) = slot.take() {
                spawn::kill_group(dead.pid);
            }
            ctx.alive.set(false);
            ctx.died.set(true);
        }
        outcome
    }
}

impl Contexts {
    /// Each context whose interpreter runs and is idle, as a tree to carry; the busy ones (a cell
    /// running) by name, with why.
    pub(crate) fn trees(&self) -> (Vec<Tree>, Vec<String>) {
        let (mut trees, mut skipped) = (Vec::new(), Vec::new());
        for ctx in self.map.borrow().values() {
            let Ok(guard) = ctx.interp.try_lock() else {
                skipped.push(format!("code context {} (a cell is running)", ctx.id));
                continue;
            };
            let Some(interp) = guard.as_ref() else {
                continue;
            };
            let (Some(out), Some(err)) = (&interp.stdout, &interp.stderr) else {
                continue;
            };
            let inode = |fd: &dyn std::os::fd::AsFd| {
                nix::sys::stat::fstat(fd.as_fd())
                    .map(|s| s.st_ino)
                    .unwrap_or(0)
            };
            trees.push(Tree {
                kind: TreeKind::Context {
                    context_id: ctx.id.clone(),
                    language: ctx.language,
                    cwd: ctx.cwd.clone(),
                    created_at: ctx.created_at,
                    is_default: ctx.is_default,
                },
                pid: interp.pid,
                pipes: vec![
                    TreePipe {
                        inode: inode(out),
                        role: PipeRole::Stdout,
                    },
                    TreePipe {
                        inode: inode(err),
                        role: PipeRole::Stderr,
                    },
                    TreePipe {
                        inode: inode(&interp.requests),
                        role: PipeRole::Requests,
                    },
                    TreePipe {
                        inode: inode(interp.responses.get_ref()),
                        role: PipeRole::Answers,
                    },
                ],
            });
        }
        (trees, skipped)
    }

    /// Takes over a restored interpreter as context `kind` names.
    pub(crate) fn adopt(
        &self,
        kind: TreeKind,
        pid: i32,
        mut ends: AgentEnds,
        exit: tokio::sync::oneshot::Receiver<Exit>,
    ) -> Result<(), AgentError> {
        let TreeKind::Context {
            context_id,
            language,
            cwd,
            created_at,
            is_default,
        } = kind
        else {
            return Err(error(ErrorKind::InvalidArgument, "not a code context"));
        };
        if self.map.borrow().contains_key(&context_id) {
            return Err(error(
                ErrorKind::Conflict,
                format!("code context {context_id} already exists here"),
            ));
        }
        let interp = Interp {
            pid,
            requests: live::sender(ends.take(PipeRole::Requests)?)?,
            responses: BufReader::new(live::receiver(ends.take(PipeRole::Answers)?)?),
            stdout: Some(live::receiver(ends.take(PipeRole::Stdout)?)?),
            stderr: Some(live::receiver(ends.take(PipeRole::Stderr)?)?),
            exit: Some(exit),
        };
        if let Some(n) = context_id
            .strip_prefix("ctx_")
            .and_then(|n| n.parse::<u32>().ok())
        {
            self.next.set(self.next.get().max(n));
        }
        let ctx = self.insert(Context {
            id: context_id,
            language,
            cwd,
            created_at,
            is_default,
            interp: tokio::sync::Mutex::new(Some(interp)),
            died: Cell::new(false),
            alive: Cell::new(true),
        })?;
        let _ = ctx;
        Ok(())
    }
}

fn unknown(id: &str) -> AgentError {
    error(
        ErrorKind::NotFound,
        format!(
            "code context {id} does not exist; call sandbox_code_context_list to see the contexts, or omit context_id to use the language's default"
        ),
    )
}

/// Why a cell stopped.
enum End {
    Answered(String),
    Died(Exit),
    /// The answer line broke the driver's protocol (over [`MAX_ANSWER`]): the interpreter was
    /// killed, since what it says next cannot be trusted to line up with a request.
    Garbled,
}

/// Longest answer line accepted from a driver. The drivers cap what they send far below this;
/// only code writing to the driver's descriptor itself gets here.
const MAX_ANSWER: usize = 1024 * 1024;

/// Reads up to and including a newline into `line`; cancel-safe (what was read stays in `line`).
/// Returns 0 at EOF; fails once the line would grow past `max`, so memory stays bounded whatever
/// the other end writes.
async fn read_answer(
    r: &mut BufReader<pipe::Receiver>,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(0);
        }
        let (used, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + used > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "answer too long",
            ));
        }
        line.extend_from_slice(&buf[..used]);
        r.consume(used);
        if done {
            return Ok(line.len());
        }
    }
}

async fn run_cell<R, W>(
    interp: &mut Interp,
    ctx: &Context,
    spec: &RunCodeSpec,
    restarted: bool,
    rd: &mut R,
    wr: &mut W,
) -> Result<CodeOutcome, AgentError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let started = Instant::now();
    let request = serde_json::json!({ "code": spec.code }).to_string() + "\n";
    if interp.requests.write_all(request.as_bytes()).await.is_err() {
        return Err(error(
            ErrorKind::Io,
            "the interpreter is gone; the next call starts a fresh one",
        ));
    }
    // Borrow the interpreter's streams for this cell; they go back afterwards.
    let mut pump = Pump::new(
        interp.stdout.take(),
        interp.stderr.take(),
        spec.max_output_bytes as usize,
        spec.stream,
    );
    let mut exit_rx = interp.exit.take();
    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms));
    tokio::pin!(deadline);
    let grace = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(grace);
    let mut interrupted = false;
    let mut timed_out = false;
    let mut cancelled = false;
    // Cancel-safe: partial lines stay in `line`.
    let mut line: Vec<u8> = Vec::new();

    let end = loop {
        let due = pump.stream_due();
        tokio::select! {
            chunk = pump.read() => pump.handle(chunk, wr).await,
            () = sleep_until_due(due) => pump.flush_stream(wr).await,
            r = read_answer(&mut interp.responses, &mut line, MAX_ANSWER) => {
                match r {
                    Ok(n) if n > 0 => break End::Answered(String::from_utf8_lossy(&line).into_owned()),
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        spawn::kill_group(interp.pid);
                        break End::Garbled;
                    }
                    _ => {
                        let status = wait_exit(&mut exit_rx).await;
                        break End::Died(status);
                    }
                }
            }
            status = wait_exit(&mut exit_rx), if exit_rx.is_some() => break End::Died(status),
            () = &mut deadline, if !interrupted => {
                timed_out = true;
                interrupted = true;
                interrupt(interp.pid);
                grace.as_mut().reset(tokio::time::Instant::now() + INTERRUPT_GRACE);
            }
            () = hangup(rd), if !cancelled => {
                cancelled = true;
                if !interrupted {
                    interrupted = true;
                    interrupt(interp.pid);
                    grace.as_mut().reset(tokio::time::Instant::now() + INTERRUPT_GRACE);
                }
            }
            () = &mut grace, if interrupted => {
                // It did not stop: kill the interpreter and everything it started.
                spawn::kill_group(interp.pid);
            }
        }
    };
    pump.drain_ready(wr).await;
    pump.flush_stream(wr).await;
    // Give the streams and the exit receiver back for the next cell.
    interp.stdout = pump.out.take();
    interp.stderr = pump.err.take();
    interp.exit = exit_rx;

    let mut outcome = CodeOutcome {
        context_id: ctx.id.clone(),
        language: ctx.language,
        truncated: pump.stdout.truncated() || pump.stderr.truncated(),
        stdout: pump.stdout.render(),
        stderr: pump.stderr.render(),
        stdout_bytes: pump.stdout.total(),
        stderr_bytes: pump.stderr.total(),
        stdout_file: pump.stdout.spill_path(),
        stderr_file: pump.stderr.spill_path(),
        result: None,
        error: None,
        timed_out,
        context_lost: false,
        context_restarted: restarted,
        duration_ms: started.elapsed().as_millis() as u64,
    };
    match end {
        End::Answered(line) => {
            let answer: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if answer["ok"] == true {
                outcome.result = answer["result"].as_str().map(String::from);
            } else {
                let e = &answer["error"];
                let mut err = CodeError {
                    name: e["name"].as_str().unwrap_or("Error").to_string(),
                    message: e["message"].as_str().unwrap_or("").to_string(),
                    traceback: e["traceback"].as_str().unwrap_or("").to_string(),
                };
                if timed_out {
                    err.message = format!(
                        "interrupted after {} ms (timeout_ms); the context and its variables are kept. {}",
                        spec.timeout_ms, err.message
                    );
                }
                outcome.error = Some(err);
            }
        }
        End::Garbled => {
            outcome.context_lost = true;
            outcome.error = Some(CodeError {
                name: "InterpreterDied".into(),
                message: format!(
                    "the {} interpreter's driver sent an answer over {MAX_ANSWER} bytes (code wrote to its control descriptor), so it was stopped; its variables are lost and the next call starts a fresh context",
                    ctx.language.as_str()
                ),
                traceback: String::new(),
            });
        }
        End::Died(exit) => {
            let how = match exit {
                Exit::Code(c) => format!("exited with status {c}"),
                Exit::Signal(s) => format!("was killed by signal {s}"),
                Exit::Unknown => "exited".to_string(),
            };
            let why = if timed_out {
                format!(
                    " after timeout_ms ({} ms) and did not stop when interrupted",
                    spec.timeout_ms
                )
            } else {
                String::new()
            };
            outcome.context_lost = true;
            outcome.error = Some(CodeError {
                name: "InterpreterDied".into(),
                message: format!(
                    "the {} interpreter {how}{why}; its variables are lost and the next call starts a fresh context",
                    ctx.language.as_str()
                ),
                traceback: String::new(),
            });
        }
    }
    // A cancelled cell was interrupted like a timed-out one: the engine is no longer listening,
    // but the context keeps its state unless the interpreter had to be killed.
    Ok(outcome)
}

fn interrupt(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGINT);
}
