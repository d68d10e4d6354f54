//! The desktop of a computer-use sandbox: a virtual display (Xvfb) and a window manager, started
//! by the agent like any command (confined, as the sandbox's root), and the agent's own X client,
//! which takes screenshots and sends input.
//!
//! Why an X client in the agent rather than xdotool and xwd: one connection, kept open, answers a
//! screenshot without starting a process; the pointer's image comes from XFIXES and is drawn in
//! (a plain screen grab leaves it out); and typing looks each character up in the display's own
//! keymap, binding a spare key to it when the keymap has none, so no keyboard layout turns text
//! into other characters, and nothing sleeps between keys.
//!
//! The display server runs inside the sandbox, and code there can replace it. So everything read
//! from it is checked (a screen grab must be exactly the screen's size, a cursor image at most
//! 256×256), and every X call has a deadline, after which its socket is shut down. The agent lives
//! in the sandbox's memory limit: a hostile server can cost it no more than that.
//!
//! This file starts the processes and runs every call on the X connection under its deadline;
//! `x11` is the connection (screen grabs, the cursor, input), `keymap` binds characters to keys,
//! `image` turns a grab into a scaled PNG.

mod image;
mod keymap;
mod x11;

use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::reaper::{Exit, Reaper};
use super::spawn::{self, Launch, error};
use sandbox_mcp_protocol::{
    AgentError, DesktopStarted, ErrorKind, InputAction, InputDone, Screen, Shot,
};
use x11::X;

use sandbox_mcp_protocol::DISPLAY;
const SOCKET: &str = "/tmp/.X11-unix/X0";
/// How long the display server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one X call (a screenshot, an action); typing 20 000 characters takes well under.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Window managers tried in order (the first installed runs). Matchbox keeps every application
/// window maximized, which suits a model: one window in view, nothing to arrange.
const WINDOW_MANAGERS: [(&str, &[&str]); 1] = [(
    "matchbox-window-manager",
    &["-use_titlebar", "no", "-use_cursor", "yes"],
)];
/// Most of the display server's output kept, for the error when it fails to start.
const TAIL: usize = 4096;

struct Proc {
    pid: i32,
    exit: tokio::sync::oneshot::Receiver<Exit>,
}

impl Proc {
    fn running(&mut self) -> bool {
        matches!(
            self.exit.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        )
    }
}

struct Running {
    screen: Screen,
    xvfb: Proc,
    wm: Option<(String, Proc)>,
}

/// The agent's side of the desktop: the processes it started, and its X connection.
#[derive(Default)]
pub(crate) struct Desktop {
    running: RefCell<Option<Running>>,
    x: Arc<Mutex<Option<X>>>,
    /// A copy of the X connection's socket, to cut off a call that outlives its deadline.
    socket: Arc<Mutex<Option<OwnedFd>>>,
    /// The display was just started: the next connection is its first client.
    fresh: Arc<std::sync::atomic::AtomicBool>,
    tail: Rc<RefCell<Vec<u8>>>,
}

/// Where `program` is installed in the sandbox, on the PATH commands get.
fn installed(program: &str) -> bool {
    spawn::PATH.split(':').any(|dir| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(format!("{dir}/{program}"))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Reads a process's output until it closes, keeping the last [`TAIL`] bytes in `tail`.
fn drain(mut out: tokio::net::unix::pipe::Receiver, tail: Option<Rc<RefCell<Vec<u8>>>>) {
    tokio::task::spawn_local(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Some(tail) = &tail {
                let mut t = tail.borrow_mut();
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(TAIL);
                t.drain(..excess);
            }
        }
    });
}

impl Desktop {
    /// Starts the display server and window manager unless they run already at this size.
    pub(crate) async fn ensure(
        &self,
        screen: Screen,
        reaper: &Reaper,
    ) -> Result<DesktopStarted, AgentError> {
        {
            let mut running = self.running.borrow_mut();
            if let Some(r) = running.as_mut()
                && r.screen == screen
                && r.xvfb.running()
            {
                return Ok(DesktopStarted {
                    started: false,
                    window_manager: r.wm.as_ref().map(|(name, _)| name.clone()),
                });
            }
            // Gone, or another size: whatever is left of it goes.
            if let Some(r) = running.take() {
                spawn::kill_group(r.xvfb.pid);
                if let Some((_, wm)) = r.wm {
                    spawn::kill_group(wm.pid);
                }
            }
        }
        *self.x.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if !installed("Xvfb") {
            return Err(error(
                ErrorKind::InvalidArgument,
                "this sandbox's template has no Xvfb, the virtual display a desktop runs on: use the `desktop` template (on a host with the xvfb package), or a template that installs xvfb",
            ));
        }
        let size = format!("{}x{}x24", screen.width, screen.height);
        // Listening only on the socket file: Landlock keeps each command from abstract sockets
        // made outside its own domain, and clients fall back to the file only when there is no
        // abstract socket at all. -nolock: a lock file left by a killed server names a pid that
        // may be reused; this agent knows whether its server runs.
        let args = [
            DISPLAY,
            "-screen",
            "0",
            &size,
            "-nolisten",
            "tcp",
            "-nolisten",
            "local",
            "-nolock",
            "-noreset",
            "-dpi",
            "96",
        ];
        let started = spawn::start(
            &Launch {
                program: "Xvfb",
                args: &args,
                cwd: "/",
                env: &[],
                merge_output: true,
                ..Default::default()
            },
            reaper,
        )?;
        self.tail.borrow_mut().clear();
        drain(started.stdout, Some(self.tail.clone()));
        let mut xvfb = Proc {
            pid: started.pid,
            exit: started.exit,
        };
        let begun = Instant::now();
        loop {
            if !xvfb.running() {
                let tail = String::from_utf8_lossy(&self.tail.borrow())
                    .trim()
                    .to_string();
                return Err(error(
                    ErrorKind::Io,
                    format!("the virtual display (Xvfb) exited while starting: {tail}"),
                ));
            }
            if tokio::net::UnixStream::connect(SOCKET).await.is_ok() {
                break;
            }
            if begun.elapsed() > START_TIMEOUT {
                spawn::kill_group(xvfb.pid);
                return Err(error(
                    ErrorKind::Io,
                    format!(
                        "the virtual display (Xvfb) did not accept connections within {} s",
                        START_TIMEOUT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let display = [("DISPLAY".to_string(), DISPLAY.to_string())];
        let mut wm = None;
        for (program, args) in WINDOW_MANAGERS {
            if !installed(program) {
                continue;
            }
            if let Ok(started) = spawn::start(
                &Launch {
                    program,
                    args,
                    cwd: "/",
                    env: &[&display],
                    merge_output: true,
                    ..Default::default()
                },
                reaper,
            ) {
                drain(started.stdout, None);
                wm = Some((
                    program.to_string(),
                    Proc {
                        pid: started.pid,
                        exit: started.exit,
                    },
                ));
                break;
            }
        }
        let window_manager = wm.as_ref().map(|(name, _)| name.clone());
        *self.running.borrow_mut() = Some(Running { screen, xvfb, wm });
        // Connected now, before any application is: the connection prepares the keymap, with
        // no client yet to wait for.
        self.fresh.store(true, std::sync::atomic::Ordering::Release);
        self.with_x(screen, |_| Ok(())).await?;
        Ok(DesktopStarted {
            started: true,
            window_manager,
        })
    }

    /// Runs `f` on the X connection (made if needed) on a blocking thread, within
    /// [`CALL_TIMEOUT`].
    async fn with_x<T: Send + 'static>(
        &self,
        screen: Screen,
        f: impl FnOnce(&mut X) -> Result<T, AgentError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let slot = self.x.clone();
        let socket = self.socket.clone();
        let fresh = self.fresh.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
            // A kept connection must still answer: any client of the display may close it
            // (KillClient), and the call should not be the one to find out.
            let mut x = match guard.take() {
                Some(x) if x.screen == screen && x.sync().is_ok() => x,
                _ => {
                    let fresh = fresh.swap(false, std::sync::atomic::Ordering::AcqRel);
                    X::connect(screen, &socket, fresh)?
                }
            };
            let result = f(&mut x);
            // After a failure the next call starts from a fresh connection.
            if result.is_ok() {
                *guard = Some(x);
            }
            result
        });
        match tokio::time::timeout(CALL_TIMEOUT, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(error(
                ErrorKind::Io,
                format!("the desktop call failed: {e}"),
            )),
            Err(_) => {
                if let Some(fd) = self.socket.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = nix::sys::socket::shutdown(
                        std::os::fd::AsRawFd::as_raw_fd(&fd),
                        nix::sys::socket::Shutdown::Both,
                    );
                }
                Err(error(
                    ErrorKind::Io,
                    format!(
                        "the virtual display did not answer within {} s (is something in the sandbox holding it?); try again, or kill and recreate the desktop",
                        CALL_TIMEOUT.as_secs()
                    ),
                ))
            }
        }
    }

    pub(crate) async fn screenshot(
        &self,
        screen: Screen,
        scale: f64,
        settle: bool,
        reaper: &Reaper,
    ) -> Result<Shot, AgentError> {
        self.ensure(screen, reaper).await?;
        self.with_x(screen, move |x| x.screenshot(scale, settle))
            .await
    }

    pub(crate) async fn input(
        &self,
        screen: Screen,
        action: InputAction,
        reaper: &Reaper,
    ) -> Result<InputDone, AgentError> {
        self.ensure(screen, reaper).await?;
        self.with_x(screen, move |x| x.input(action)).await
    }
}
