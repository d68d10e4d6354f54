//! Key names and characters as X keysyms: what `computer_action`'s `keys` and `text` mean.
//!
//! Pure, and shared: the engine checks a request with it (so a typo is a clear 400 before
//! anything is pressed) and the agent presses what it returns.

/// Most characters one `type` action may send.
pub const MAX_TEXT_CHARS: usize = 20_000;
/// Most key combinations one `key` action may press.
pub const MAX_COMBOS: usize = 50;

/// One key combination: modifiers held (in order) while `key` is pressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combo {
    pub modifiers: Vec<u32>,
    pub key: u32,
}

pub const SHIFT_L: u32 = 0xffe1;
const CONTROL_L: u32 = 0xffe3;
const ALT_L: u32 = 0xffe9;
const SUPER_L: u32 = 0xffeb;

/// Named keys, matched without regard to case (X's own names first, then common aliases).
const NAMED: &[(&str, u32)] = &[
    ("Return", 0xff0d),
    ("Enter", 0xff0d),
    ("Tab", 0xff09),
    ("Escape", 0xff1b),
    ("Esc", 0xff1b),
    ("BackSpace", 0xff08),
    ("Delete", 0xffff),
    ("Del", 0xffff),
    ("Insert", 0xff63),
    ("Home", 0xff50),
    ("End", 0xff57),
    ("Page_Up", 0xff55),
    ("PageUp", 0xff55),
    ("Prior", 0xff55),
    ("Page_Down", 0xff56),
    ("PageDown", 0xff56),
    ("Next", 0xff56),
    ("Up", 0xff52),
    ("Down", 0xff54),
    ("Left", 0xff51),
    ("Right", 0xff53),
    ("space", 0x20),
    ("plus", 0x2b),
    ("minus", 0x2d),
    ("Menu", 0xff67),
    ("Print", 0xff61),
    ("Pause", 0xff13),
    ("Caps_Lock", 0xffe5),
    ("KP_Enter", 0xff8d),
    ("shift", SHIFT_L),
    ("ctrl", CONTROL_L),
    ("control", CONTROL_L),
    ("alt", ALT_L),
    ("super", SUPER_L),
    ("win", SUPER_L),
    ("meta", SUPER_L),
    ("cmd", SUPER_L),
];

const MODIFIERS: [u32; 4] = [SHIFT_L, CONTROL_L, ALT_L, SUPER_L];

/// The keysym that types `c`: X's Latin-1 keysyms are the code points, every other character
/// is 0x01000000 plus its code point; newline and tab are the Return and Tab keys.
pub fn keysym_of_char(c: char) -> Option<u32> {
    match c {
        '\n' => Some(0xff0d),
        '\t' => Some(0xff09),
        c if c.is_control() => None,
        ' '..='~' | '\u{a0}'..='\u{ff}' => Some(c as u32),
        c => Some(0x0100_0000 + c as u32),
    }
}

/// Checks text for `type`: not too long, no control characters but newline and tab (a `\r\n`
/// counts as one newline).
pub fn check_text(text: &str) -> Result<(), String> {
    let count = text.chars().count();
    if count == 0 {
        return Err("text is empty: give the characters to type".into());
    }
    if count > MAX_TEXT_CHARS {
        return Err(format!(
            "text has {count} characters; one type action sends at most {MAX_TEXT_CHARS}: split it, or write it to a file with sandbox_files_write and open that in the app"
        ));
    }
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' && chars.peek() == Some(&'\n') {
            continue;
        }
        if keysym_of_char(c).is_none() {
            return Err(format!(
                "text contains the control character U+{:04X}, which cannot be typed; for keys like Escape use the key action",
                c as u32
            ));
        }
    }
    Ok(())
}

/// Parses `ctrl+s`, `Return`, `ctrl+shift+t alt+F4`: combinations separated by spaces, keys
/// within one joined by `+`.
pub fn parse(keys: &str) -> Result<Vec<Combo>, String> {
    let combos: Vec<&str> = keys.split_whitespace().collect();
    if combos.is_empty() {
        return Err("keys is empty: give a key or combination, like Return or ctrl+s".into());
    }
    if combos.len() > MAX_COMBOS {
        return Err(format!(
            "keys has {} combinations; at most {MAX_COMBOS} per action",
            combos.len()
        ));
    }
    combos.into_iter().map(parse_combo).collect()
}

fn parse_combo(combo: &str) -> Result<Combo, String> {
    // A lone "+" is the plus key; otherwise "+" joins keys.
    let parts: Vec<&str> = if combo == "+" {
        vec!["+"]
    } else {
        combo.split('+').collect()
    };
    let mut syms = Vec::with_capacity(parts.len());
    for part in &parts {
        syms.push(key(part).ok_or_else(|| unknown(part, combo))?);
    }
    let Some(key) = syms.pop() else {
        return Err(unknown("", combo));
    };
    if let Some(bad) = syms.iter().position(|s| !MODIFIERS.contains(s)) {
        return Err(format!(
            "in \"{combo}\", \"{}\" is not a modifier: only the last key of a combination may be another key (modifiers: ctrl, shift, alt, super)",
            parts[bad]
        ));
    }
    Ok(Combo {
        modifiers: syms,
        key,
    })
}

fn key(name: &str) -> Option<u32> {
    if let Some((_, sym)) = NAMED.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
        return Some(*sym);
    }
    let mut chars = name.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c != ' ' => keysym_of_char(c),
        _ => function_key(name),
    }
}

/// F1 … F24.
fn function_key(name: &str) -> Option<u32> {
    let n: u32 = name.strip_prefix(['F', 'f'])?.parse().ok()?;
    (1..=24).contains(&n).then(|| 0xffbe + n - 1)
}

fn unknown(part: &str, combo: &str) -> String {
    if part.is_empty() {
        return format!("\"{combo}\" has an empty key: join keys with a single + (ctrl+s)");
    }
    format!(
        "unknown key \"{part}\" in \"{combo}\": use one character (a, 7, /, é) or a name: Return, Tab, Escape, BackSpace, Delete, Insert, Home, End, Page_Up, Page_Down, Up, Down, Left, Right, F1-F24, space, plus, minus, Menu, Print; modifiers ctrl, shift, alt, super, joined by + (ctrl+shift+t)"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn combinations_parse_to_keysyms() {
        assert_eq!(
            parse("ctrl+s").unwrap(),
            vec![Combo {
                modifiers: vec![CONTROL_L],
                key: 's' as u32
            }]
        );
        let all = parse("ctrl+shift+T  Return alt+F4 + é ctrl+plus").unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(all[0].modifiers, vec![CONTROL_L, SHIFT_L]);
        assert_eq!(all[0].key, 'T' as u32);
        assert_eq!(all[1].key, 0xff0d);
        assert_eq!(all[2].key, 0xffc1);
        assert_eq!(all[3].key, '+' as u32);
        assert_eq!(all[4].key, 0xe9);
        assert_eq!(all[5].key, '+' as u32);
        assert_eq!(parse("ENTER esc f12").unwrap()[2].key, 0xffc9);
        assert_eq!(parse("€").unwrap()[0].key, 0x0100_20ac);
    }

    #[test]
    fn bad_keys_are_named_in_the_error() {
        let e = parse("ctrl+foo").unwrap_err();
        assert!(e.contains("unknown key \"foo\" in \"ctrl+foo\""), "{e}");
        assert!(parse("ctrl++s").unwrap_err().contains("empty key"));
        assert!(parse("F25").unwrap_err().contains("\"F25\""));
        assert!(
            parse("a+b")
                .unwrap_err()
                .contains("\"a\" is not a modifier")
        );
        assert!(parse("   ").unwrap_err().contains("empty"));
        assert!(parse(&"a ".repeat(51)).unwrap_err().contains("at most 50"));
    }

    #[test]
    fn text_is_checked_for_length_and_control_characters() {
        assert!(check_text("héllo wörld ✓\r\nnext\tline").is_ok());
        let e = check_text(&"x".repeat(MAX_TEXT_CHARS + 1)).unwrap_err();
        assert!(e.contains("20001 characters"), "{e}");
        assert!(check_text("a\u{7}b").unwrap_err().contains("U+0007"));
        assert!(check_text("").is_err());
        assert_eq!(keysym_of_char('ß'), Some(0xdf));
        assert_eq!(keysym_of_char('Ж'), Some(0x0100_0416));
    }
}
