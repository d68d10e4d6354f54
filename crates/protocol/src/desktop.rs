//! The desktop of a computer-use sandbox: starting it, screenshots and input. Every request
//! carries the screen's size, so an agent that restarted brings the display back as it was.

use serde::{Deserialize, Serialize};

use crate::call::encoded;

/// The display every desktop sandbox uses; `DISPLAY` is set to it for every command.
pub const DISPLAY: &str = ":0";

/// A desktop's screen size. Every desktop request carries it, so an agent that restarted, or a
/// sandbox whose display server was killed (a restore stops every process), brings the display
/// back up as it was, instead of failing.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Screen {
    pub width: u16,
    pub height: u16,
}

impl Screen {
    /// Bytes of the screen as 8-bit RGB: what a PNG of it can cost at worst.
    pub fn raw_bytes(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height) * 3 + 4096
    }
}

/// Start the display server and the window manager (if they are not running already).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartDesktop {
    pub screen: Screen,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DesktopStarted {
    /// False when it was running already.
    pub started: bool,
    /// The window manager running, if the sandbox has one.
    pub window_manager: Option<String>,
}

/// The screen as a PNG, with the pointer drawn in, scaled by `scale` (0 < scale ≤ 1).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Screenshot {
    pub screen: Screen,
    pub scale: f64,
    /// Wait (up to a second) until the screen stops changing first.
    pub settle: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Shot {
    /// Size of the PNG (the screen's, times the scale).
    pub width: u32,
    pub height: u32,
    pub cursor_x: i32,
    pub cursor_y: i32,
    pub png_b64: String,
}

/// Mouse and keyboard input, in screen pixels.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Input {
    pub screen: Screen,
    pub action: InputAction,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputAction {
    Move {
        x: u16,
        y: u16,
    },
    /// `count` presses of `button` (1 left, 2 middle, 3 right), at (x, y) or where the pointer is.
    Click {
        at: Option<(u16, u16)>,
        button: u8,
        count: u8,
    },
    Drag {
        from: (u16, u16),
        to: (u16, u16),
    },
    /// Wheel clicks; `button` 4 up, 5 down, 6 left, 7 right.
    Scroll {
        at: Option<(u16, u16)>,
        button: u8,
        amount: u8,
    },
    Type {
        text: String,
    },
    /// Key combinations separated by spaces (`ctrl+s`, `Return`, `ctrl+a BackSpace`).
    Key {
        keys: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InputDone {
    pub cursor_x: i32,
    pub cursor_y: i32,
}

call!(StartDesktop(StartDesktop) => DesktopStarted);
call!(Screenshot(Screenshot) => Shot, limit: |r: &Screenshot| encoded(r.screen.raw_bytes()));
call!(Input(Input) => InputDone);
