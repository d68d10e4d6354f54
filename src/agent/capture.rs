//! Bounded capture of a command's output stream: the first and last bytes, and an exact count.
//!
//! Memory stays at the cap however much a command prints; `yes | head -c 1G` costs 32 KiB.

use std::collections::VecDeque;

/// Keeps the head and tail of a byte stream within `cap` bytes of rendered text.
#[derive(Debug)]
pub struct Capture {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
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
        }
    }

    fn half(&self) -> usize {
        self.cap.saturating_sub(MARKER_ROOM) / 2
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let half = self.half();
        if self.head.len() < half {
            let take = (half - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
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
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The captured text (invalid UTF-8 replaced), at most `cap` bytes long.
    pub fn render(&self) -> String {
        let (tail_a, tail_b) = self.tail.as_slices();
        let mut tail = Vec::with_capacity(self.tail.len());
        tail.extend_from_slice(tail_a);
        tail.extend_from_slice(tail_b);
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            if all.len() <= self.cap {
                return clip(String::from_utf8_lossy(&all).into_owned(), self.cap);
            }
        }
        let omitted = self.total - (self.head.len() + tail.len()) as u64;
        let head = clip(String::from_utf8_lossy(&self.head).into_owned(), self.half());
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
        let expected: u64 = (0..100_000u32).map(|i| format!("line {i}\n").len() as u64).sum();
        assert_eq!(c.total(), expected);
    }

    #[test]
    fn binary_output_stays_within_cap() {
        let mut c = Capture::new(1024);
        c.push(&[0xff; 10_000]);
        assert!(c.render().len() <= 1024);
    }

    #[test]
    fn output_just_over_half_is_not_truncated() {
        let mut c = Capture::new(200);
        let data: Vec<u8> = (0..150u8).map(|b| b'a' + b % 26).collect();
        c.push(&data);
        assert!(!c.truncated());
        assert_eq!(c.render().as_bytes(), &data[..]);
    }
}
