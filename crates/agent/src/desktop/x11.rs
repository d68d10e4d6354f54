//! The agent's X connection to the display: checked on connect (one screen of the desktop's
//! size, depth 24 at 32 bits per pixel, XTEST for input; XFIXES for the pointer's image when it
//! is there), then input sent through XTEST and the screen grabbed with the pointer drawn in.
//! The server may be hostile: a grab must be exactly the screen's size and a cursor image at most
//! 256×256, or the call fails.

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::{DefaultStream, RustConnection};

use super::image::{downscale, encode_png, scaled, to_rgb};
use super::keymap::Keymap;
use super::{SOCKET, error};
use sandbox_mcp_protocol::keys;
use sandbox_mcp_protocol::{AgentError, DISPLAY, ErrorKind, InputAction, InputDone, Screen, Shot};

pub(crate) fn x_error(e: impl std::fmt::Display) -> AgentError {
    error(
        ErrorKind::Io,
        format!("the virtual display failed a request: {e}"),
    )
}

/// The agent's connection to the display.
pub(crate) struct X {
    pub(crate) conn: RustConnection,
    pub(crate) screen: Screen,
    root: u32,
    /// Pixels come little-endian (B, G, R, pad), else big-endian.
    lsb: bool,
    pub(crate) keymap: Keymap,
    xfixes: bool,
    /// When input was last sent (a spare key is rebound
    /// [`REBIND_PAUSE`](super::keymap::REBIND_PAUSE) after it at the earliest).
    pub(crate) last_input: Option<Instant>,
}

impl X {
    /// Connects to the display; `fresh`: it was just started, so no other client is connected.
    pub(crate) fn connect(
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
        let mut x = X {
            conn,
            screen,
            root: root_window,
            lsb,
            keymap: Keymap::new(min, per, map.keysyms),
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
    pub(crate) fn sync(&self) -> Result<(), AgentError> {
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

    pub(crate) fn key(&self, keycode: u8, press: bool) -> Result<(), AgentError> {
        let kind = if press {
            xproto::KEY_PRESS_EVENT
        } else {
            xproto::KEY_RELEASE_EVENT
        };
        self.fake(kind, keycode, 0, 0)
    }

    pub(crate) fn input(&mut self, action: InputAction) -> Result<InputDone, AgentError> {
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

    pub(crate) fn screenshot(&mut self, scale: f64, settle: bool) -> Result<Shot, AgentError> {
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
