//! The changes as a git patch, in the format `git diff --binary --full-index` writes and
//! `git apply` reads.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::Path;

use super::{Blob, Changes, FileChange, carried, entries, open_root, raw_path, read};
use crate::diff::Change;

/// Lines of context around each change, as git's default.
const CONTEXT: usize = 3;
/// Git's blob id of nothing.
const ZERO: &str = "0000000000000000000000000000000000000000";

/// The sandbox's changes to the workspace whose folder is `host` and whose overlay upper is
/// `upper`, as a patch of at most `max_patch` bytes (a larger one fails, naming the limit).
pub fn changes(
    host: &Path,
    upper: &Path,
    id_base: Option<u32>,
    max_patch: usize,
) -> io::Result<Changes> {
    let list = entries(host, upper, id_base)?;
    let (a_root, b_root) = (open_root(host)?, open_root(upper).ok());
    let mut out = Changes::default();
    for e in list.iter().filter(|e| carried(e)) {
        let rel = raw_path(&e.path);
        let old = read(&a_root, &rel)?;
        let new = match &b_root {
            // What the sandbox sees: its upper's copy, else the folder's (a change of owner
            // only, say, still has its copy in the upper).
            Some(b) => match read(b, &rel)? {
                Blob::None if e.change != Change::Removed => old.clone(),
                blob => blob,
            },
            None => Blob::None,
        };
        let new = if e.change == Change::Removed {
            Blob::None
        } else {
            new
        };
        let Some(binary) = file_patch(&mut out.patch, &rel, &old, &new)? else {
            continue;
        };
        if out.patch.len() > max_patch {
            return Err(io::Error::other(format!(
                "the patch is over {} MiB; apply the changes with `sandbox-mcp workspace apply`, or list them with sandbox_diff",
                max_patch >> 20
            )));
        }
        match e.change {
            Change::Added => out.added += 1,
            Change::Removed => out.removed += 1,
            Change::Modified => out.modified += 1,
        }
        out.files.push(FileChange {
            path: e.path.trim_start_matches('/').to_string(),
            change: e.change,
            binary,
        });
    }
    Ok(out)
}

/// Git's mode of a blob: a symlink, an executable file, or a plain one.
fn git_mode(blob: &Blob) -> Option<&'static str> {
    match blob {
        Blob::File { mode, .. } if mode & 0o111 != 0 => Some("100755"),
        Blob::File { .. } => Some("100644"),
        Blob::Link(_) => Some("120000"),
        _ => None,
    }
}

fn content(blob: &Blob) -> &[u8] {
    match blob {
        Blob::File { data, .. } => data,
        Blob::Link(target) => target,
        _ => &[],
    }
}

/// Git's object id of a blob: SHA-1 of `blob <len>\0<content>`.
fn blob_id(data: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(format!("blob {}\0", data.len()).as_bytes());
    ctx.update(data);
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Text as git judges it: no NUL byte in the first 8000, and (for a unified diff here) UTF-8.
fn is_text(data: &[u8]) -> bool {
    !data[..data.len().min(8000)].contains(&0) && std::str::from_utf8(data).is_ok()
}

/// Appends the patch of one path; returns whether it is a binary patch, or `None` when git
/// carries nothing of the change (a directory, an owner, a time). A change of type (file to
/// symlink, say) is a deletion then an addition, as git writes it.
fn file_patch(out: &mut String, rel: &[u8], old: &Blob, new: &Blob) -> io::Result<Option<bool>> {
    let (om, nm) = (git_mode(old), git_mode(new));
    if let (Some(o), Some(n)) = (om, nm)
        && (o == "120000") != (n == "120000")
    {
        let a = one_side(out, rel, old, &Blob::None)?;
        let b = one_side(out, rel, &Blob::None, new)?;
        return Ok(Some(a == Some(true) || b == Some(true)));
    }
    one_side(out, rel, old, new)
}

fn one_side(out: &mut String, rel: &[u8], old: &Blob, new: &Blob) -> io::Result<Option<bool>> {
    let (om, nm) = (git_mode(old), git_mode(new));
    let (od, nd) = (content(old), content(new));
    if (om.is_none() && nm.is_none()) || (om == nm && od == nd) {
        return Ok(None);
    }
    let (a, b) = (quote(b"a/", rel), quote(b"b/", rel));
    let _ = writeln!(out, "diff --git {a} {b}");
    let (oid, nid) = (
        om.map_or(ZERO.to_string(), |_| blob_id(od)),
        nm.map_or(ZERO.to_string(), |_| blob_id(nd)),
    );
    match (om, nm) {
        (None, Some(n)) => {
            let _ = writeln!(out, "new file mode {n}");
        }
        (Some(o), None) => {
            let _ = writeln!(out, "deleted file mode {o}");
        }
        (Some(o), Some(n)) if o != n => {
            let _ = writeln!(out, "old mode {o}\nnew mode {n}");
        }
        _ => {}
    }
    if oid == nid {
        return Ok(Some(false));
    }
    match (om, nm) {
        (Some(o), Some(n)) if o == n => {
            let _ = writeln!(out, "index {oid}..{nid} {o}");
        }
        _ => {
            let _ = writeln!(out, "index {oid}..{nid}");
        }
    }
    if is_text(od) && is_text(nd) {
        let from = if om.is_some() {
            a.as_str()
        } else {
            "/dev/null"
        };
        let to = if nm.is_some() {
            b.as_str()
        } else {
            "/dev/null"
        };
        let _ = writeln!(out, "--- {from}\n+++ {to}");
        unified(out, od, nd);
        Ok(Some(false))
    } else {
        out.push_str("GIT binary patch\n");
        literal(out, nd)?;
        Ok(Some(true))
    }
}

/// The hunks of a line diff, each line as git writes it (a last line without a newline marked).
fn unified(out: &mut String, old: &[u8], new: &[u8]) {
    let (old, new) = (
        std::str::from_utf8(old).unwrap_or_default(),
        std::str::from_utf8(new).unwrap_or_default(),
    );
    let diff = similar::TextDiff::from_lines(old, new);
    for hunk in diff.unified_diff().context_radius(CONTEXT).iter_hunks() {
        let _ = writeln!(out, "{}", hunk.header());
        for change in hunk.iter_changes() {
            let sign = match change.tag() {
                similar::ChangeTag::Equal => ' ',
                similar::ChangeTag::Delete => '-',
                similar::ChangeTag::Insert => '+',
            };
            out.push(sign);
            let line = change.value();
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
}

/// A `literal` binary hunk: the content deflated, in git's base-85 lines.
fn literal(out: &mut String, data: &[u8]) -> io::Result<()> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(data)?;
    let deflated = z.finish()?;
    let _ = writeln!(out, "literal {}", data.len());
    for chunk in deflated.chunks(52) {
        let n = chunk.len() as u8;
        out.push(if n <= 26 {
            (b'A' + n - 1) as char
        } else {
            (b'a' + n - 27) as char
        });
        base85(out, chunk);
        out.push('\n');
    }
    out.push('\n');
    Ok(())
}

/// Git's base-85 alphabet.
const B85: &[u8; 85] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

fn base85(out: &mut String, data: &[u8]) {
    for group in data.chunks(4) {
        let mut word = [0u8; 4];
        word[..group.len()].copy_from_slice(group);
        let mut acc = u32::from_be_bytes(word);
        let mut chars = [0u8; 5];
        for c in chars.iter_mut().rev() {
            *c = B85[(acc % 85) as usize];
            acc /= 85;
        }
        out.extend(chars.iter().map(|&c| c as char));
    }
}

/// A path as git writes it in a patch: `prefix` + path, in double quotes with C escapes when it
/// holds a quote, a backslash, a control character or a byte above 0x7f.
fn quote(prefix: &[u8], rel: &[u8]) -> String {
    let full: Vec<u8> = prefix.iter().chain(rel).copied().collect();
    let needs = full
        .iter()
        .any(|&b| !(0x20..0x7f).contains(&b) || b == b'"' || b == b'\\');
    if !needs {
        return String::from_utf8_lossy(&full).into_owned();
    }
    let mut s = String::from("\"");
    for &b in &full {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            0x20..=0x7e => s.push(b as char),
            _ => {
                let _ = write!(s, "\\{b:03o}");
            }
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn blob_ids_are_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            blob_id(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(blob_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    }

    #[test]
    fn a_change_git_does_not_carry_writes_nothing() {
        let mut s = String::new();
        let file = Blob::File {
            data: b"x\n".to_vec(),
            mode: 0o644,
        };
        // Same content and mode: an owner or a time changed, which a patch cannot say.
        assert_eq!(
            file_patch(&mut s, b"f", &file, &file.clone()).unwrap(),
            None
        );
        assert!(s.is_empty(), "{s}");
        let exec = Blob::File {
            data: b"x\n".to_vec(),
            mode: 0o755,
        };
        assert_eq!(file_patch(&mut s, b"f", &file, &exec).unwrap(), Some(false));
        assert_eq!(s, "diff --git a/f b/f\nold mode 100644\nnew mode 100755\n");
    }

    #[test]
    fn paths_are_quoted_as_git_quotes_them() {
        assert_eq!(quote(b"a/", b"src/main.rs"), "a/src/main.rs");
        assert_eq!(quote(b"a/", "é".as_bytes()), "\"a/\\303\\251\"");
        assert_eq!(quote(b"b/", b"x\"y"), "\"b/x\\\"y\"");
    }

    /// Git's decoding of a literal hunk, to check ours against it.
    fn decode(hunk: &str) -> Vec<u8> {
        use std::io::Read as _;
        let mut deflated = Vec::new();
        for line in hunk.lines().skip(1).take_while(|l| !l.is_empty()) {
            let n = match line.as_bytes()[0] {
                c @ b'A'..=b'Z' => (c - b'A' + 1) as usize,
                c => (c - b'a' + 27) as usize,
            };
            let mut bytes = Vec::new();
            for group in line.as_bytes()[1..].chunks(5) {
                let acc = group.iter().fold(0u32, |acc, c| {
                    acc * 85 + B85.iter().position(|b| b == c).unwrap() as u32
                });
                bytes.extend_from_slice(&acc.to_be_bytes());
            }
            deflated.extend_from_slice(&bytes[..n]);
        }
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(&deflated[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn literal_hunks_decode_to_their_content() {
        for data in [&b""[..], b"\0\x01\xff", &[7u8; 300], b"text\n"] {
            let mut s = String::new();
            literal(&mut s, data).unwrap();
            assert!(s.starts_with(&format!("literal {}\n", data.len())), "{s}");
            assert!(s.ends_with("\n\n"));
            assert_eq!(decode(&s), data);
        }
    }
}
