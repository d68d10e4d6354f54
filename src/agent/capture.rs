//! Bounded capture of a command's output stream: the first and last bytes, and an exact count.
//!
//! Memory stays at the cap however much a command prints; `yes | head -c 1G` costs 32 KiB.

use std::collections::VecDeque;

/// Keeps a byte stream whole while it fits in `cap` bytes, and its head and tail once it does not.
#[derive(Debug)]
pub struct Capture {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    overflowed: bool,
}

/// Room reserved in the rendered text for the omission marker.
const MARKER_ROOM: usize = 64;

impl Capture {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            overflowed: false,
        }
    }

    fn half(&self) -> usize {
        self.cap.saturating_sub(MARKER_ROOM) / 2
    }

    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if !self.overflowed {
            if self.head.len() + data.len() <= self.cap {
                self.head.extend_from_slice(data);
                return;
            }
            // From now on keep only the first and last `half` bytes.
            self.overflowed = true;
            let half = self.half();
            let rest = self.head.split_off(half.min(self.head.len()));
            self.head.shrink_to_fit();
            self.push_tail(&rest);
        }
        self.push_tail(data);
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

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether bytes were dropped between head and tail.
    pub fn truncated(&self) -> bool {
        self.overflowed
    }

    /// The captured text (invalid UTF-8 replaced), at most `cap` bytes long.
    pub fn render(&self) -> String {
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
