//! Typing through the display's own keymap: each character is looked up as the core protocol
//! sees the keymap, and one the keymap lacks is bound to a spare key first, so no keyboard layout
//! turns text into other characters. Keys are bound while empty where possible; rebinding one a
//! client may still be decoding waits out [`REBIND_PAUSE`] and [`CLEAR_PAUSE`].

use std::time::{Duration, Instant};

use x11rb::protocol::xproto::ConnectionExt as _;

use super::x11::{X, x_error};
use sandbox_mcp_protocol::AgentError;
use sandbox_mcp_protocol::keys::SHIFT_L;

/// The display's keymap, as the core protocol sees it, with the keys that have no symbol (spare
/// keys that characters missing from the keymap get bound to).
pub(crate) struct Keymap {
    min: u8,
    per: usize,
    syms: Vec<u32>,
    pub(crate) spare: Vec<u8>,
    /// When each spare key was last bound (a counter), for least-recently-bound reuse.
    bound_at: std::collections::HashMap<u8, u64>,
    tick: u64,
}

impl Keymap {
    /// The keymap whose keycodes from `min` up hold `per` symbols each in `syms`.
    pub(crate) fn new(min: u8, per: usize, syms: Vec<u32>) -> Self {
        let spare = syms
            .chunks(per)
            .enumerate()
            .filter(|(_, syms)| spare_key(syms))
            .map(|(i, _)| min + i as u8)
            .collect();
        Keymap {
            min,
            per,
            syms,
            spare,
            bound_at: Default::default(),
            tick: 0,
        }
    }

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

    pub(crate) fn find(&self, sym: u32) -> Option<(u8, bool)> {
        self.find_in(sym, true)
    }

    fn bound_at(&self, keycode: u8) -> u64 {
        self.bound_at.get(&keycode).copied().unwrap_or(0)
    }

    /// What a spare key's first two levels hold now (0: nothing).
    pub(crate) fn bound_to(&self, keycode: u8) -> [u32; 2] {
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
pub(crate) const REBIND_PAUSE: Duration = Duration::from_millis(200);
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

impl X {
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
    pub(crate) fn bind(&mut self, syms: &[u32]) -> Result<(), AgentError> {
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
    pub(crate) fn clear(&mut self, keys: &[u8], pause: bool) -> Result<(), AgentError> {
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
    pub(crate) fn type_syms(&mut self, syms: &[u32]) -> Result<(), AgentError> {
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
    pub(crate) fn tap(&mut self, sym: u32, held: &[u8]) -> Result<(), AgentError> {
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
}
