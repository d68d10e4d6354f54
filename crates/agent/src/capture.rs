//! Bounded capture of a command's output stream: the first and last bytes, and an exact count.
//!
//! Memory stays at the cap however much a command prints; `yes | head -c 1G` costs 32 KiB. When a
//! stream overflows the cap, everything it printed (up to a per-file limit) is also written to a
//! file inside the sandbox, whose path the result names, so the model can page through it instead
//! of running the command again. Those files live in one directory whose total size is bounded:
//! the oldest are deleted first.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where full copies of truncated output go, inside the sandbox.
pub(crate) const SPILL_DIR: &str = "/tmp/sandbox-mcp/output";
/// Most bytes kept of one stream.
pub(crate) const SPILL_FILE_LIMIT: u64 = 64 * 1024 * 1024;
/// Most bytes kept in the spill directory in all.
pub(crate) const SPILL_DIR_LIMIT: u64 = 256 * 1024 * 1024;

/// Makes room in `dir` for a new file of up to `file_limit` bytes: deletes the oldest files until
/// the total plus the new file fits in `dir_limit`.
pub(crate) fn make_room(dir: &Path, file_limit: u64, dir_limit: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file().then(|| {
                (
                    m.modified().unwrap_or(std::time::UNIX_EPOCH),
                    m.len(),
                    e.path(),
                )
            })
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    for (_, len, path) in files {
        if total + file_limit <= dir_limit {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
        }
    }
}

/// The file a stream spills into once it overflows.
#[derive(Debug)]
struct Spill {
    path: PathBuf,
    file: Option<File>,
    written: u64,
    failed: bool,
}

impl Spill {
    fn write(&mut self, data: &[u8]) {
        if self.failed || self.written >= SPILL_FILE_LIMIT {
            return;
        }
        if self.file.is_none() {
            if let Some(parent) = self.path.parent() {
                let _ = std::fs::create_dir_all(parent);
                make_room(parent, SPILL_FILE_LIMIT, SPILL_DIR_LIMIT);
            }
            // Created exclusively and never through a link: sandbox code may have planted a FIFO
            // or a symlink at this path to block or redirect the agent.
            match super::safe_open::create_new(&self.path, 0o644) {
                Ok(f) => self.file = Some(f),
                Err(_) => {
                    self.failed = true;
                    return;
                }
            }
        }
        let take = data.len().min((SPILL_FILE_LIMIT - self.written) as usize);
        if let Some(f) = &mut self.file {
            if f.write_all(&data[..take]).is_ok() {
                self.written += take as u64;
            } else {
                self.failed = true;
            }
        }
    }
}

/// Keeps a byte stream whole while it fits in `cap` bytes, and its head and tail once it does not.
#[derive(Debug)]
pub(crate) struct Capture {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    overflowed: bool,
    spill: Option<Spill>,
}

/// Room reserved in the rendered text for the omission marker.
const MARKER_ROOM: usize = 64;

impl Capture {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            overflowed: false,
            spill: None,
        }
    }

    /// Also keeps the whole stream (up to [`SPILL_FILE_LIMIT`]) in `path` once it overflows.
    pub(crate) fn spilling_to(mut self, path: PathBuf) -> Self {
        self.spill = Some(Spill {
            path,
            file: None,
            written: 0,
            failed: false,
        });
        self
    }

    /// The file holding the full stream, when it overflowed and the file could be written.
    pub(crate) fn spill_path(&self) -> Option<String> {
        self.spill
            .as_ref()
            .filter(|s| s.written > 0 && !s.failed)
            .map(|s| s.path.display().to_string())
    }

    fn half(&self) -> usize {
        self.cap.saturating_sub(MARKER_ROOM) / 2
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if !self.overflowed {
            if self.head.len() + data.len() <= self.cap {
                self.head.extend_from_slice(data);
                return;
            }
            // From now on keep only the first and last `half` bytes (and, when spilling, all of
            // it on disk, starting with what was kept so far).
            self.overflowed = true;
            if let Some(spill) = &mut self.spill {
                spill.write(&self.head);
            }
            let half = self.half();
            if self.head.len() > half {
                let rest = self.head.split_off(half);
                self.head.shrink_to_fit();
                self.push_tail(&rest);
            }
        }
        if let Some(spill) = &mut self.spill {
            spill.write(data);
        }
        // Top the head up first (possible only at the moment of overflow, while the tail is
        // still empty), then the rest goes to the tail.
        let take = self.half().saturating_sub(self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..take]);
        self.push_tail(&data[take..]);
    }

    fn push_tail(&mut self, data: &[u8]) {
        let half = self.half();
        if data.len() >= half {
            self.tail.clear();
            self.tail.extend(&data[data.len() - half..]);
        } else {
            let overflow = (self.tail.len() + data.len()).saturating_sub(half);
            self.tail.drain(..overflow);
            self.tail.extend(data);
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Whether bytes were dropped between head and tail.
    pub(crate) fn truncated(&self) -> bool {
        self.overflowed
    }

    /// The captured text (invalid UTF-8 replaced), at most `cap` bytes long.
    pub(crate) fn render(&self) -> String {
        if !self.overflowed {
            return clip(String::from_utf8_lossy(&self.head).into_owned(), self.cap);
        }
        let (tail_a, tail_b) = self.tail.as_slices();
        let mut tail = Vec::with_capacity(self.tail.len());
        tail.extend_from_slice(tail_a);
        tail.extend_from_slice(tail_b);
        let omitted = self.total - (self.head.len() + tail.len()) as u64;
        let head = clip(
            String::from_utf8_lossy(&self.head).into_owned(),
            self.half(),
        );
        let tail = clip_front(String::from_utf8_lossy(&tail).into_owned(), self.half());
        format!("{head}\n…[{omitted} bytes omitted]…\n{tail}")
    }
}

/// At most `max` bytes from the start of `s`, on a character boundary. Invalid bytes rendered as
/// U+FFFD take three bytes each, so binary output can need this after lossy decoding.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// At most `max` bytes from the end of `s`, on a character boundary.
fn clip_front(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_exact() {
        let mut c = Capture::new(100);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.render(), "hello world");
        assert!(!c.truncated());
        assert_eq!(c.total(), 11);
    }

    #[test]
    fn large_output_keeps_head_and_tail_with_exact_count() {
        let mut c = Capture::new(32 * 1024);
        for i in 0..100_000u32 {
            c.push(format!("line {i}\n").as_bytes());
        }
        let text = c.render();
        assert!(text.len() <= 32 * 1024, "{}", text.len());
        assert!(text.starts_with("line 0\n"));
        assert!(text.ends_with("line 99999\n"));
        assert!(c.truncated());
        let expected: u64 = (0..100_000u32)
            .map(|i| format!("line {i}\n").len() as u64)
            .sum();
        assert_eq!(c.total(), expected);
    }

    #[test]
    fn overflowing_output_spills_whole_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.stdout");
        let mut c = Capture::new(100).spilling_to(path.clone());
        let data: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        for chunk in data.chunks(37) {
            c.push(chunk);
        }
        assert!(c.truncated());
        assert_eq!(c.spill_path().as_deref(), Some(path.to_str().unwrap()));
        assert_eq!(std::fs::read(&path).unwrap(), data);
        // A stream that fits never creates a file.
        let mut small = Capture::new(100).spilling_to(dir.path().join("y"));
        small.push(b"short");
        assert!(small.spill_path().is_none() && !dir.path().join("y").exists());
    }

    #[test]
    fn the_spill_directory_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("{i}")), vec![0u8; 100]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        make_room(dir.path(), 100, 500);
        let left = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, 4, "400 bytes left + 100 new ≤ 500");
        assert!(
            dir.path().join("9").exists() && !dir.path().join("0").exists(),
            "oldest go first"
        );
    }

    #[test]
    fn one_huge_first_chunk_keeps_its_head() {
        let mut c = Capture::new(1000);
        let data: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        c.push(&data);
        let text = c.render();
        assert!(text.starts_with("abcdefghij"), "{text}");
        assert!(text.len() <= 1000);
        let tail: String = String::from_utf8(data[data.len() - 20..].to_vec()).unwrap();
        assert!(text.ends_with(&tail));
    }

    #[test]
    fn binary_output_stays_within_cap() {
        let mut c = Capture::new(1024);
        c.push(&[0xff; 10_000]);
        assert!(c.render().len() <= 1024);
    }

    #[test]
    fn output_up_to_the_cap_is_kept_whole() {
        let mut c = Capture::new(200);
        let data: Vec<u8> = (0..200u8).map(|b| b'a' + b % 26).collect();
        c.push(&data[..150]);
        c.push(&data[150..]);
        assert!(!c.truncated());
        assert_eq!(c.render().as_bytes(), &data[..]);
        c.push(b"!");
        assert!(c.truncated());
        let text = c.render();
        assert!(
            text.len() <= 200 && text.ends_with('!') && text.starts_with("abc"),
            "{text}"
        );
    }
}
