//! Sandbox paths as the diff handles them: an absolute path's names (never `..`), joined back
//! into raw paths to open, escaped into printable ones to show (a backslash doubled, control
//! characters and bytes that are not UTF-8 as `\xNN`, so two names never look the same), and
//! errors named by the place in the sandbox they happened, never by a host path.

use std::fmt::Write as _;
use std::io;

use super::{TooDeep, Unreadable};

/// The names of an absolute path (`.` and empty names dropped); None if it is relative, holds a
/// NUL byte or a `..`.
pub(crate) fn components(path: &str) -> Option<Vec<Vec<u8>>> {
    if !path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut out = Vec::new();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => return None,
            _ => out.push(name.as_bytes().to_vec()),
        }
    }
    Some(out)
}

pub(crate) fn join(names: &[Vec<u8>]) -> Vec<u8> {
    let mut path = Vec::new();
    for name in names {
        path.push(b'/');
        path.extend_from_slice(name);
    }
    if path.is_empty() {
        path.push(b'/');
    }
    path
}

pub(crate) fn child(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(parent.len() + 1 + name.len());
    if parent != b"/" {
        path.extend_from_slice(parent);
    }
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

/// Whether `path` is `dir` or below it.
pub(crate) fn within(path: &[u8], dir: &[u8]) -> bool {
    dir == b"/" || path == dir || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

/// Appends `name` printably and unambiguously: a backslash doubled, control characters and
/// bytes that are not UTF-8 as `\xNN`.
pub(crate) fn escape(out: &mut String, name: &[u8]) {
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if c.is_control() {
                for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                    let _ = write!(out, "\\x{byte:02x}");
                }
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
}

pub(crate) fn escape_child(parent: &str, name: &[u8]) -> String {
    let mut esc = String::with_capacity(name.len());
    escape(&mut esc, name);
    join_escaped(parent, &esc)
}

/// The escaped path of escaped name `name` in directory `parent` (escaped).
pub(crate) fn join_escaped(parent: &str, name: &str) -> String {
    let mut out = String::with_capacity(parent.len() + 1 + name.len());
    if parent != "/" {
        out.push_str(parent);
    }
    out.push('/');
    out.push_str(name);
    out
}

pub(crate) fn escape_path(names: &[Vec<u8>]) -> String {
    names
        .iter()
        .fold(String::from("/"), |path, name| escape_child(&path, name))
}

/// Enough of a path to find the place; past that it is usually the same few names repeated.
pub(crate) fn clip(path: &str) -> String {
    let mut end = path.len().min(120);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < path.len() { "…" } else { "" };
    format!("{}{more}", &path[..end])
}

/// Names the sandbox path an I/O error happened under (once: the innermost place is kept).
pub(crate) fn located(path: &str, e: io::Error) -> io::Error {
    if e.get_ref()
        .is_some_and(|inner| inner.is::<TooDeep>() || inner.is::<Unreadable>())
    {
        return e;
    }
    // InvalidInput is the caller's mistake (a bad `under`); an EINVAL from the host is not.
    let kind = match e.kind() {
        io::ErrorKind::InvalidInput => io::ErrorKind::Other,
        kind => kind,
    };
    io::Error::new(
        kind,
        Unreadable {
            path: clip(path),
            source: e,
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
