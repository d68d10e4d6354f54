//! The forms a server could hand a secret's value back in: as it is, case-folded, JSON-escaped as
//! the common encoders write it, HTML-escaped, percent-encoded, base64 at each alignment, hex.

use base64::Engine;

/// A value and the forms a server could hand it back in; `true` marks an encoding.
pub(super) fn forms(value: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let mut out: Vec<(Vec<u8>, bool)> = vec![(value.to_vec(), false)];
    let mut add = |form: Vec<u8>| {
        if !form.is_empty() && !out.iter().any(|(f, _)| *f == form) {
            out.push((form, true));
        }
    };
    add(value.to_ascii_lowercase());
    add(value.to_ascii_uppercase());
    for upper in [true, false] {
        add(percent(value, upper, false));
        add(percent(value, upper, true));
    }
    let text = String::from_utf8_lossy(value);
    for json in &JSON_FORMS {
        add(json_escaped(&text, json));
    }
    for apos in ["&#x27;", "&#39;"] {
        add(html_escaped(&text, apos));
    }
    for engine in [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::URL_SAFE,
    ] {
        for offset in 0..3 {
            add(base64_core(engine, value, offset));
        }
    }
    add(hex(value, false));
    add(hex(value, true));
    out
}

/// Percent-encoding of every byte but the unreserved ones; `plus`: a space as `+`.
pub(super) fn percent(value: &[u8], upper: bool, plus: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() * 3);
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else if plus && b == b' ' {
            out.push(b'+');
        } else if upper {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        }
    }
    out
}

/// How a JSON encoder writes a string: `"` and `\` always escaped, control characters as
/// `\uXXXX`; the rest differs by encoder.
struct JsonForm {
    /// `/` as `\/` (PHP, some Java).
    slash: bool,
    /// Hex digits of `\uXXXX` in upper case (.NET, Jackson).
    upper: bool,
    /// Non-ASCII as `\uXXXX` (Python's default, PHP) rather than as UTF-8 (JavaScript, Go,
    /// serde_json).
    ascii_only: bool,
    /// ASCII characters written as `\uXXXX` too, to be safe in HTML: Go's `<>&`, and .NET's
    /// `<>&'+\``.
    html_safe: &'static [char],
}

/// The JSON encoders' ways of writing a string, as [`forms`] searches for them.
const JSON_FORMS: [JsonForm; 6] = [
    // Python.
    JsonForm {
        slash: false,
        upper: false,
        ascii_only: true,
        html_safe: &[],
    },
    // PHP.
    JsonForm {
        slash: true,
        upper: false,
        ascii_only: true,
        html_safe: &[],
    },
    JsonForm {
        slash: false,
        upper: true,
        ascii_only: true,
        html_safe: &[],
    },
    // JavaScript, serde_json.
    JsonForm {
        slash: false,
        upper: false,
        ascii_only: false,
        html_safe: &[],
    },
    // Go's encoding/json.
    JsonForm {
        slash: false,
        upper: false,
        ascii_only: false,
        html_safe: &['<', '>', '&'],
    },
    // .NET's System.Text.Json.
    JsonForm {
        slash: false,
        upper: true,
        ascii_only: true,
        html_safe: &['<', '>', '&', '\'', '+', '`'],
    },
];

/// The inside of a JSON string holding `text`, written as `json` says.
fn json_escaped(text: &str, json: &JsonForm) -> Vec<u8> {
    let mut out = String::with_capacity(text.len());
    let unit = |out: &mut String, u: u16| {
        if json.upper {
            out.push_str(&format!("\\u{u:04X}"));
        } else {
            out.push_str(&format!("\\u{u:04x}"));
        }
    };
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if json.slash => out.push_str("\\/"),
            c if json.html_safe.contains(&c)
                || c.is_ascii_control()
                || (json.ascii_only && !c.is_ascii()) =>
            {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    unit(&mut out, *u);
                }
            }
            c => out.push(c),
        }
    }
    out.into_bytes()
}

pub(super) fn html_escaped(text: &str, apos: &str) -> Vec<u8> {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str(apos),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// The characters of the base64 of `value` that do not depend on what surrounds it, when it
/// starts `offset` bytes into a 3-byte group of a longer encoded string (`user:value` in Basic
/// credentials, a JSON document encoded whole).
fn base64_core(engine: &base64::engine::GeneralPurpose, value: &[u8], offset: usize) -> Vec<u8> {
    let mut padded = vec![0u8; offset];
    padded.extend_from_slice(value);
    let encoded = engine.encode(&padded).into_bytes();
    // Groups made only of the value's bytes: from the first whole group after the offset to the
    // last group the value fills.
    let first = offset.div_ceil(3);
    let last = padded.len() / 3;
    if last <= first {
        return Vec::new();
    }
    encoded[first * 4..last * 4].to_vec()
}

pub(super) fn hex(value: &[u8], upper: bool) -> Vec<u8> {
    value
        .iter()
        .flat_map(|b| {
            if upper {
                format!("{b:02X}").into_bytes()
            } else {
                format!("{b:02x}").into_bytes()
            }
        })
        .collect()
}
