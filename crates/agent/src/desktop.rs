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

use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::{DefaultStream, RustConnection};

use super::reaper::{Exit, Reaper};
use super::spawn::{self, Launch, error};
use sandbox_mcp_protocol::keys::{self, SHIFT_L};
use sandbox_mcp_protocol::{
    AgentError, DesktopStarted, ErrorKind, InputAction, InputDone, Screen, Shot,
};

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
                extra_fds: &[],
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
                    extra_fds: &[],
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

fn x_error(e: impl std::fmt::Display) -> AgentError {
    error(
        ErrorKind::Io,
        format!("the virtual display failed a request: {e}"),
    )
}

/// The display's keymap, as the core protocol sees it, with the keys that have no symbol (spare
/// keys that characters missing from the keymap get bound to).
struct Keymap {
    min: u8,
    per: usize,
    syms: Vec<u32>,
    spare: Vec<u8>,
    /// When each spare key was last bound (a counter), for least-recently-bound reuse.
    bound_at: std::collections::HashMap<u8, u64>,
    tick: u64,
}

impl Keymap {
    /// The key and whether Shift is needed for `sym`, on the first two levels (no AltGr);
    /// spare keys count only when `spares` is set.
    fn find_in(&self, sym: u32, spares: bool) -> Option<(u8, bool)> {
        for level in 0..self.per.min(2) {
            for (i, syms) in self.syms.chunks(self.per).enumerate() {
                let keycode = self.min + i as u8;
                if syms[level] == sym && (spares || !self.spare.contains(&keycode)) {
                    return Some((keycode, level == 1));
                }
            }
        }
        None
    }

    fn find(&self, sym: u32) -> Option<(u8, bool)> {
        self.find_in(sym, true)
    }

    fn bound_at(&self, keycode: u8) -> u64 {
        self.bound_at.get(&keycode).copied().unwrap_or(0)
    }

    /// What a spare key's first two levels hold now (0: nothing).
    fn bound_to(&self, keycode: u8) -> [u32; 2] {
        let at = usize::from(keycode - self.min) * self.per;
        [
            self.syms[at],
            if self.per > 1 { self.syms[at + 1] } else { 0 },
        ]
    }
}

/// Pause before a spare key is bound to another character while what was typed with it may
/// still wait, unread, in a client's queue: Xlib applies a new mapping as soon as it *reads* the
/// notice, so events queued before it would be decoded with the new mapping.
const REBIND_PAUSE: Duration = Duration::from_millis(200);
/// Pause between clearing keys and binding them again (see [`X::bind`]).
const CLEAR_PAUSE: Duration = Duration::from_millis(150);

/// Keys the agent may bind characters to: empty ones, and the multimedia keys (`XF86Audio…`,
/// `XF86Mail`…) no agent presses, which more than triples the characters outside the keymap
/// that one batch of typing can hold (36 empty keys in Xvfb's default keymap, about 120 with
/// these).
fn spare_key(syms: &[u32]) -> bool {
    syms.iter()
        .all(|s| *s == 0 || (0x1008_ff00..=0x1008_ffff).contains(s))
}

/// The agent's connection to the display.
pub(crate) struct X {
    conn: RustConnection,
    screen: Screen,
    root: u32,
    /// Pixels come little-endian (B, G, R, pad), else big-endian.
    lsb: bool,
    keymap: Keymap,
    xfixes: bool,
    /// When input was last sent (a spare key is rebound [`REBIND_PAUSE`] after it at the
    /// earliest).
    last_input: Option<Instant>,
}

impl X {
    /// Connects to the display; `fresh`: it was just started, so no other client is connected.
    fn connect(
        screen: Screen,
        socket: &Mutex<Option<OwnedFd>>,
        fresh: bool,
    ) -> Result<X, AgentError> {
        let stream = std::os::unix::net::UnixStream::connect(SOCKET).map_err(|e| {
            error(
                ErrorKind::Io,
                format!("cannot reach the virtual display at {SOCKET}: {e}"),
            )
        })?;
        let copy = stream.try_clone().map_err(x_error)?;
        *socket.lock().unwrap_or_else(|e| e.into_inner()) = Some(copy.into());
        let (stream, _) = DefaultStream::from_unix_stream(stream).map_err(x_error)?;
        let conn = RustConnection::connect_to_stream(stream, 0).map_err(x_error)?;
        let setup = conn.setup();
        let Some(root) = setup.roots.first() else {
            return Err(x_error("it has no screen"));
        };
        if (root.width_in_pixels, root.height_in_pixels) != (screen.width, screen.height) {
            return Err(x_error(format!(
                "its screen is {}x{}, not the desktop's {}x{} (another display server holds {DISPLAY})",
                root.width_in_pixels, root.height_in_pixels, screen.width, screen.height
            )));
        }
        let bpp = setup
            .pixmap_formats
            .iter()
            .find(|f| f.depth == root.root_depth)
            .map(|f| f.bits_per_pixel);
        if root.root_depth != 24 || bpp != Some(32) {
            return Err(x_error(format!(
                "its screen has depth {} at {bpp:?} bits per pixel; a desktop needs depth 24 at 32",
                root.root_depth
            )));
        }
        let lsb = setup.image_byte_order == xproto::ImageOrder::LSB_FIRST;
        let (root_window, min, max) = (root.root, setup.min_keycode, setup.max_keycode);
        if conn
            .extension_information(x11rb::protocol::xtest::X11_EXTENSION_NAME)
            .map_err(x_error)?
            .is_none()
        {
            return Err(x_error("it lacks the XTEST extension, needed for input"));
        }
        conn.xtest_get_version(2, 2)
            .map_err(x_error)?
            .reply()
            .map_err(x_error)?;
        let xfixes = conn
            .extension_information(x11rb::protocol::xfixes::X11_EXTENSION_NAME)
            .map_err(x_error)?
            .is_some();
        if xfixes {
            conn.xfixes_query_version(4, 0)
                .map_err(x_error)?
                .reply()
                .map_err(x_error)?;
        }
        let map = conn
            .get_keyboard_mapping(min, max - min + 1)
            .map_err(x_error)?
            .reply()
            .map_err(x_error)?;
        let per = usize::from(map.keysyms_per_keycode);
        if per == 0 || map.keysyms.len() != per * usize::from(max - min + 1) {
            return Err(x_error("its keymap is malformed"));
        }
        let spare = map
            .keysyms
            .chunks(per)
            .enumerate()
            .filter(|(_, syms)| spare_key(syms))
            .map(|(i, _)| min + i as u8)
            .collect();
        let mut x = X {
            conn,
            screen,
            root: root_window,
            lsb,
            keymap: Keymap {
                min,
                per,
                syms: map.keysyms,
                spare,
                bound_at: Default::default(),
                tick: 0,
            },
            xfixes,
            last_input: None,
        };
        // Spare keys that hold multimedia symbols are emptied now, once, so that binding a
        // character to one later is the change clients always pick up (see `bind`). On a new
        // display this happens before any application has connected.
        let held: Vec<u8> = x
            .keymap
            .spare
            .iter()
            .copied()
            .filter(|k| x.keymap.bound_to(*k) != [0, 0])
            .collect();
        if !held.is_empty() {
            x.clear(&held, !fresh)?;
        }
        Ok(x)
    }

    /// Waits until the server has handled everything sent so far.
    fn sync(&self) -> Result<(), AgentError> {
        self.conn
            .get_input_focus()
            .map_err(x_error)?
            .reply()
            .map_err(x_error)?;
        Ok(())
    }

    fn fake(&self, kind: u8, detail: u8, x: i16, y: i16) -> Result<(), AgentError> {
        self.conn
            .xtest_fake_input(kind, detail, 0, self.root, x, y, 0)
            .map_err(x_error)?;
        Ok(())
    }

    fn move_to(&self, (x, y): (u16, u16)) -> Result<(), AgentError> {
        let x = x.min(self.screen.width - 1) as i16;
        let y = y.min(self.screen.height - 1) as i16;
        self.fake(xproto::MOTION_NOTIFY_EVENT, 0, x, y)
    }

    fn button(&self, button: u8, press: bool) -> Result<(), AgentError> {
        let kind = if press {
            xproto::BUTTON_PRESS_EVENT
        } else {
            xproto::BUTTON_RELEASE_EVENT
        };
        self.fake(kind, button, 0, 0)
    }

    fn key(&self, keycode: u8, press: bool) -> Result<(), AgentError> {
        let kind = if press {
            xproto::KEY_PRESS_EVENT
        } else {
            xproto::KEY_RELEASE_EVENT
        };
        self.fake(kind, keycode, 0, 0)
    }

    /// Binds spare keys to `syms` (characters the keymap lacks), two per key (the second with
    /// Shift), keeping the ones already bound where they are, so typing the same characters
    /// again changes no mapping.
    ///
    /// Why empty keys first, and rebinding only as a last resort: clients decode keys with their
    /// own copy of the keymap, which Xlib refreshes from the server when it next decodes a key
    /// after hearing of a change. A key bound once, while empty, is always decoded right: no
    /// event before the change used it. A key rebound while events typed with its old character
    /// still wait in a client's queue gets them decoded with the new one, and a key changed
    /// twice in quick succession can be left in the first state (the test of 3 000 characters
    /// caught both). So rebinding (once about 240 characters outside the keymap are bound)
    /// waits [`REBIND_PAUSE`] after the last input, clears, waits [`CLEAR_PAUSE`], then binds:
    /// right whenever clients keep up with those pauses.
    fn bind(&mut self, syms: &[u32]) -> Result<(), AgentError> {
        let mut wanted: Vec<u32> = Vec::new();
        for sym in syms {
            if self.keymap.find(*sym).is_none() && !wanted.contains(sym) {
                wanted.push(*sym);
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let keys_needed = wanted.len().div_ceil(2);
        let empty: Vec<u8> = self
            .keymap
            .spare
            .iter()
            .copied()
            .filter(|k| self.keymap.bound_to(*k) == [0, 0])
            .collect();
        let mut keys: Vec<u8> = empty.into_iter().take(keys_needed).collect();
        if keys.len() < keys_needed {
            // Least recently bound first, never one holding a character this call types.
            let mut taken: Vec<u8> = self
                .keymap
                .spare
                .iter()
                .copied()
                .filter(|k| {
                    let [a, b] = self.keymap.bound_to(*k);
                    (a, b) != (0, 0) && !syms.contains(&a) && !syms.contains(&b)
                })
                .collect();
            taken.sort_by_key(|k| self.keymap.bound_at(*k));
            taken.truncate(keys_needed - keys.len());
            if keys.len() + taken.len() < keys_needed {
                return Err(x_error("its keymap has too few spare keys for this text"));
            }
            if let Some(last) = self.last_input {
                self.sync()?;
                std::thread::sleep(REBIND_PAUSE.saturating_sub(last.elapsed()));
            }
            self.clear(&taken, true)?;
            keys.extend(taken);
        }
        let per = self.keymap.per;
        for (keycode, pair) in keys.into_iter().zip(wanted.chunks(2)) {
            let mut row = vec![0; per];
            row[0] = pair[0];
            if per > 1 {
                row[1] = pair.get(1).copied().unwrap_or(0);
            }
            self.conn
                .change_keyboard_mapping(1, keycode, per as u8, &row)
                .map_err(x_error)?;
            let at = usize::from(keycode - self.keymap.min) * per;
            self.keymap.syms[at..at + per].copy_from_slice(&row);
            self.keymap.tick += 1;
            self.keymap.bound_at.insert(keycode, self.keymap.tick);
        }
        Ok(())
    }

    /// Empties `keys`, then (with `pause`) waits [`CLEAR_PAUSE`] so clients see them empty
    /// before they are bound again.
    fn clear(&mut self, keys: &[u8], pause: bool) -> Result<(), AgentError> {
        let per = self.keymap.per;
        for keycode in keys {
            self.conn
                .change_keyboard_mapping(1, *keycode, per as u8, &vec![0; per])
                .map_err(x_error)?;
            let at = usize::from(keycode - self.keymap.min) * per;
            self.keymap.syms[at..at + per].fill(0);
        }
        self.sync()?;
        if pause {
            std::thread::sleep(CLEAR_PAUSE);
        }
        Ok(())
    }

    /// Types `syms` in batches whose missing characters fit the spare keys, binding each batch's
    /// before typing it (never a key in the middle of a batch).
    fn type_syms(&mut self, syms: &[u32]) -> Result<(), AgentError> {
        let capacity = self.keymap.spare.len() * 2;
        let mut start = 0;
        while start < syms.len() {
            let mut missing: Vec<u32> = Vec::new();
            let mut end = start;
            while end < syms.len() {
                let sym = syms[end];
                if self.keymap.find_in(sym, false).is_none() && !missing.contains(&sym) {
                    if missing.len() == capacity {
                        break;
                    }
                    missing.push(sym);
                }
                end += 1;
            }
            if end == start {
                return Err(x_error(
                    "its keymap has no spare key to bind a character to",
                ));
            }
            self.bind(&missing)?;
            for sym in &syms[start..end] {
                self.tap(*sym, &[])?;
            }
            self.last_input = Some(Instant::now());
            start = end;
        }
        Ok(())
    }

    fn shift_keycode(&self) -> Result<u8, AgentError> {
        self.keymap
            .find(SHIFT_L)
            .map(|(k, _)| k)
            .ok_or_else(|| x_error("its keymap has no Shift key"))
    }

    /// Presses and releases `sym` (bound already), with Shift when its key needs it.
    fn tap(&mut self, sym: u32, held: &[u8]) -> Result<(), AgentError> {
        let (keycode, shift) = self
            .keymap
            .find(sym)
            .ok_or_else(|| x_error(format!("no key produces keysym {sym:#x}")))?;
        let shift = if shift {
            let s = self.shift_keycode()?;
            (!held.contains(&s)).then_some(s)
        } else {
            None
        };
        if let Some(s) = shift {
            self.key(s, true)?;
        }
        self.key(keycode, true)?;
        self.key(keycode, false)?;
        if let Some(s) = shift {
            self.key(s, false)?;
        }
        Ok(())
    }

    fn input(&mut self, action: InputAction) -> Result<InputDone, AgentError> {
        match action {
            InputAction::Move { x, y } => self.move_to((x, y))?,
            InputAction::Click { at, button, count } => {
                if let Some(at) = at {
                    self.move_to(at)?;
                }
                for _ in 0..count {
                    self.button(button, true)?;
                    self.button(button, false)?;
                }
            }
            InputAction::Drag { from, to } => {
                self.move_to(from)?;
                self.button(1, true)?;
                // Intermediate motion, so the application sees a drag and not a jump.
                const STEPS: i32 = 10;
                for i in 1..=STEPS {
                    let lerp = |a: u16, b: u16| {
                        (i32::from(a) + (i32::from(b) - i32::from(a)) * i / STEPS) as u16
                    };
                    self.move_to((lerp(from.0, to.0), lerp(from.1, to.1)))?;
                    self.sync()?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.button(1, false)?;
            }
            InputAction::Scroll { at, button, amount } => {
                if let Some(at) = at {
                    self.move_to(at)?;
                }
                for _ in 0..amount {
                    self.button(button, true)?;
                    self.button(button, false)?;
                }
            }
            InputAction::Type { text } => {
                let mut syms = Vec::with_capacity(text.len());
                let mut chars = text.chars().peekable();
                while let Some(c) = chars.next() {
                    if c == '\r' && chars.peek() == Some(&'\n') {
                        continue;
                    }
                    syms.extend(keys::keysym_of_char(c));
                }
                self.type_syms(&syms)?;
            }
            InputAction::Key { keys } => {
                let combos =
                    keys::parse(&keys).map_err(|e| error(ErrorKind::InvalidArgument, e))?;
                let all: Vec<u32> = combos
                    .iter()
                    .flat_map(|c| c.modifiers.iter().copied().chain([c.key]))
                    .collect();
                self.bind(&all)?;
                for combo in combos {
                    let mut held = Vec::new();
                    for m in &combo.modifiers {
                        let (k, _) = self
                            .keymap
                            .find(*m)
                            .ok_or_else(|| x_error("its keymap lacks a modifier key"))?;
                        self.key(k, true)?;
                        held.push(k);
                    }
                    let result = self.tap(combo.key, &held);
                    for k in held.iter().rev() {
                        self.key(*k, false)?;
                    }
                    result?;
                }
                self.last_input = Some(Instant::now());
            }
        }
        self.sync()?;
        let pointer = self
            .conn
            .query_pointer(self.root)
            .map_err(x_error)?
            .reply()
            .map_err(x_error)?;
        Ok(InputDone {
            cursor_x: pointer.root_x.into(),
            cursor_y: pointer.root_y.into(),
        })
    }

    /// The screen as 32-bit pixels, exactly the screen's size.
    fn grab(&self) -> Result<Vec<u8>, AgentError> {
        let (w, h) = (self.screen.width, self.screen.height);
        let image = self
            .conn
            .get_image(xproto::ImageFormat::Z_PIXMAP, self.root, 0, 0, w, h, !0)
            .map_err(x_error)?
            .reply()
            .map_err(x_error)?;
        if image.data.len() != usize::from(w) * usize::from(h) * 4 {
            return Err(x_error(format!(
                "a screen grab came back with {} bytes, not {}",
                image.data.len(),
                usize::from(w) * usize::from(h) * 4
            )));
        }
        Ok(image.data)
    }

    fn screenshot(&mut self, scale: f64, settle: bool) -> Result<Shot, AgentError> {
        let mut pixels = self.grab()?;
        if settle {
            // Until two grabs 40 ms apart agree (or a second has passed): an application redraws
            // after it handles the input, not when the server accepted it.
            let begun = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(40));
                let next = self.grab()?;
                let same = next == pixels;
                pixels = next;
                if same || begun.elapsed() > Duration::from_secs(1) {
                    break;
                }
            }
        }
        let (w, h) = (
            usize::from(self.screen.width),
            usize::from(self.screen.height),
        );
        let mut rgb = to_rgb(&pixels, self.lsb);
        drop(pixels);
        let (cursor_x, cursor_y) = self.draw_cursor(&mut rgb, w, h)?;
        let (dw, dh) = scaled(w, h, scale);
        let rgb = if (dw, dh) == (w, h) {
            rgb
        } else {
            downscale(&rgb, w, h, dw, dh)
        };
        let png = encode_png(&rgb, dw as u32, dh as u32)?;
        use base64::Engine as _;
        Ok(Shot {
            width: dw as u32,
            height: dh as u32,
            cursor_x,
            cursor_y,
            png_b64: base64::engine::general_purpose::STANDARD.encode(png),
        })
    }

    /// Draws the pointer's current image at its position; returns the position.
    fn draw_cursor(&self, rgb: &mut [u8], w: usize, h: usize) -> Result<(i32, i32), AgentError> {
        if !self.xfixes {
            let p = self
                .conn
                .query_pointer(self.root)
                .map_err(x_error)?
                .reply()
                .map_err(x_error)?;
            return Ok((p.root_x.into(), p.root_y.into()));
        }
        let c = self
            .conn
            .xfixes_get_cursor_image()
            .map_err(x_error)?
            .reply()
            .map_err(x_error)?;
        let (cw, ch) = (usize::from(c.width), usize::from(c.height));
        if cw > 256 || ch > 256 || c.cursor_image.len() != cw * ch {
            return Err(x_error("its cursor image is malformed"));
        }
        let left = i32::from(c.x) - i32::from(c.xhot);
        let top = i32::from(c.y) - i32::from(c.yhot);
        for cy in 0..ch {
            for cx in 0..cw {
                let (px, py) = (left + cx as i32, top + cy as i32);
                if px < 0 || py < 0 || px as usize >= w || py as usize >= h {
                    continue;
                }
                let argb = c.cursor_image[cy * cw + cx];
                let alpha = argb >> 24;
                if alpha == 0 {
                    continue;
                }
                let at = (py as usize * w + px as usize) * 3;
                // Premultiplied ARGB over the screen.
                for (i, shift) in [16u32, 8, 0].into_iter().enumerate() {
                    let src = (argb >> shift) & 0xff;
                    let dst = u32::from(rgb[at + i]);
                    rgb[at + i] = (src + dst * (255 - alpha) / 255).min(255) as u8;
                }
            }
        }
        Ok((c.x.into(), c.y.into()))
    }
}

/// 32-bit pixels (B, G, R, pad when little-endian) to packed RGB.
fn to_rgb(pixels: &[u8], lsb: bool) -> Vec<u8> {
    let mut rgb = Vec::with_capacity(pixels.len() / 4 * 3);
    for p in pixels.chunks_exact(4) {
        if lsb {
            rgb.extend_from_slice(&[p[2], p[1], p[0]]);
        } else {
            rgb.extend_from_slice(&[p[1], p[2], p[3]]);
        }
    }
    rgb
}

/// The size of a `w`×`h` screen scaled by `scale` (at least one pixel each way).
pub(crate) fn scaled(w: usize, h: usize, scale: f64) -> (usize, usize) {
    let s = |n: usize| ((n as f64 * scale).round() as usize).clamp(1, n);
    (s(w), s(h))
}

/// Box filter: each output pixel is the mean of the input pixels it covers (text stays legible
/// at half size, where dropping pixels would break strokes).
fn downscale(rgb: &[u8], w: usize, h: usize, dw: usize, dh: usize) -> Vec<u8> {
    if (w, h) == (dw * 2, dh * 2) {
        return halve(rgb, w, dw, dh);
    }
    let mut out = Vec::with_capacity(dw * dh * 3);
    for dy in 0..dh {
        let (y0, y1) = (dy * h / dh, ((dy + 1) * h / dh).max(dy * h / dh + 1));
        for dx in 0..dw {
            let (x0, x1) = (dx * w / dw, ((dx + 1) * w / dw).max(dx * w / dw + 1));
            let mut sum = [0u32; 3];
            for y in y0..y1 {
                for x in x0..x1 {
                    let at = (y * w + x) * 3;
                    for (i, s) in sum.iter_mut().enumerate() {
                        *s += u32::from(rgb[at + i]);
                    }
                }
            }
            let n = ((y1 - y0) * (x1 - x0)) as u32;
            out.extend(sum.map(|s| (s / n) as u8));
        }
    }
    out
}

/// [`downscale`] by exactly two each way (scale 0.5, the common case): each output pixel is the
/// mean of a 2×2 block, without the general loop's bookkeeping.
fn halve(rgb: &[u8], w: usize, dw: usize, dh: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(dw * dh * 3);
    for dy in 0..dh {
        let top = &rgb[(2 * dy) * w * 3..(2 * dy + 1) * w * 3];
        let bottom = &rgb[(2 * dy + 1) * w * 3..(2 * dy + 2) * w * 3];
        for (a, b) in top.chunks_exact(6).zip(bottom.chunks_exact(6)) {
            for i in 0..3 {
                let sum =
                    u16::from(a[i]) + u16::from(a[i + 3]) + u16::from(b[i]) + u16::from(b[i + 3]);
                out.push((sum / 4) as u8);
            }
        }
    }
    out
}

fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, AgentError> {
    let mut out = Vec::with_capacity(rgb.len() / 8);
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    let png_error = |e: png::EncodingError| error(ErrorKind::Io, format!("cannot encode PNG: {e}"));
    let mut writer = encoder.write_header().map_err(png_error)?;
    writer.write_image_data(rgb).map_err(png_error)?;
    writer.finish().map_err(png_error)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_at_least_a_pixel_and_never_grows() {
        assert_eq!(scaled(1280, 800, 0.5), (640, 400));
        assert_eq!(scaled(1280, 800, 1.0), (1280, 800));
        assert_eq!(scaled(1280, 800, 0.0001), (1, 1));
        assert_eq!(scaled(1280, 800, 3.0), (1280, 800));
    }

    #[test]
    fn downscaling_averages_what_each_pixel_covers() {
        // 2x2 → 1x1: the mean of four pixels.
        let rgb = [0, 0, 0, 255, 255, 255, 100, 0, 0, 0, 0, 100];
        assert_eq!(downscale(&rgb, 2, 2, 1, 1), vec![88, 63, 88]);
        // 3x1 → 2x1: boxes of one and two pixels.
        let rgb = [10, 10, 10, 20, 20, 20, 40, 40, 40];
        assert_eq!(downscale(&rgb, 3, 1, 2, 1), vec![10, 10, 10, 30, 30, 30]);
    }

    #[test]
    fn halving_matches_the_general_box_filter() {
        let (w, h) = (64, 40);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 256) as u8).collect();
        assert_eq!(halve(&rgb, w, w / 2, h / 2), {
            // The general loop, bypassing the fast path.
            let (dw, dh) = (w / 2, h / 2);
            let mut out = Vec::new();
            for dy in 0..dh {
                for dx in 0..dw {
                    for i in 0..3 {
                        let px = |x: usize, y: usize| u32::from(rgb[(y * w + x) * 3 + i]);
                        let sum = px(2 * dx, 2 * dy)
                            + px(2 * dx + 1, 2 * dy)
                            + px(2 * dx, 2 * dy + 1)
                            + px(2 * dx + 1, 2 * dy + 1);
                        out.push((sum / 4) as u8);
                    }
                }
            }
            out
        });
    }

    #[test]
    fn pixels_become_rgb_in_either_byte_order() {
        assert_eq!(to_rgb(&[1, 2, 3, 0], true), vec![3, 2, 1]);
        assert_eq!(to_rgb(&[0, 1, 2, 3], false), vec![1, 2, 3]);
    }

    #[test]
    fn png_encodes_and_decodes_back() {
        let rgb: Vec<u8> = (0..(64 * 48 * 3)).map(|i| (i % 251) as u8).collect();
        let png = encode_png(&rgb, 64, 48).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (64, 48));
        assert_eq!(&buf[..info.buffer_size()], &rgb[..]);
    }
}
