//! The response side of the swap: a secret's value must never come back to the sandbox.
//!
//! The value goes out in a request header, and a host can hand it back in many ways: an echo
//! endpoint, CORS headers mirroring a request header, `TRACE`, an error page quoting
//! `Authorization`, a log of earlier requests, a redirect carrying it in its URL. Each comes back
//! as the value itself or encoded (JSON or HTML escaped, percent-encoded, base64 — alone or
//! inside a longer base64 string —, hex, case-folded), whole or cut short. So every response on a
//! decrypted connection — status line aside, its header names and values, its body and
//! trailers — is searched for every window of [`WINDOW`] bytes of each of those forms of the
//! value of every secret the sandbox binds for that host; a value shorter than that is searched
//! whole. A hit in the headers withholds the response; a hit in the body ends it before the
//! bytes of the hit, and the body is passed on with its last `WINDOW - 1` bytes held back until
//! the next ones show they begin no hit, so no prefix of a hit ever reaches the sandbox. What the
//! sandbox can still learn: that a response was withheld or cut, and where; the value's length,
//! from a response that echoes it whole (its `Content-Length`); runs of a form shorter than
//! [`WINDOW`].
//!
//! The search is a rolling hash per pattern length (a few lengths at most), with a 64 Ki-bit
//! filter in front of the hash table: about a nanosecond a byte.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::http::HeaderMap;
use hyper::body::{Body as HttpBody, Frame};

mod forms;

use forms::forms;

/// The length of the runs of a value's forms that are searched for.
pub(crate) const WINDOW: usize = 16;
/// Encoded forms shorter than this are not searched for (they would match ordinary text); the
/// value itself always is.
const MIN_ENCODED: usize = 8;
const BASE: u64 = 0x100_0000_01b3;

/// The forms of the values of the secrets a response must not carry, as runs to search for.
pub(crate) struct Reflections {
    by_len: Vec<Matcher>,
    /// Which secret each pattern belongs to, by index.
    secrets: Vec<String>,
    /// The longest pattern, less one: how much of a body is held back.
    hold: usize,
}

struct Matcher {
    len: usize,
    /// BASE^(len-1), to roll the first byte out.
    top: u64,
    filter: Box<[u64; 1024]>,
    /// Patterns by hash, each with the index of its secret.
    patterns: HashMap<u64, Vec<Pattern>>,
}

impl Matcher {
    fn new(len: usize) -> Matcher {
        Matcher {
            len,
            top: (1..len).fold(1u64, |p, _| p.wrapping_mul(BASE)),
            filter: Box::new([0; 1024]),
            patterns: HashMap::new(),
        }
    }

    fn add(&mut self, pattern: &[u8], secret: usize) {
        let h = hash(pattern);
        let slot = self.patterns.entry(h).or_default();
        if !slot.iter().any(|(p, _)| &**p == pattern) {
            slot.push((pattern.into(), secret));
        }
        self.filter[(h as usize >> 6) & 1023] |= 1 << (h & 63);
    }

    fn find(&self, hay: &[u8]) -> Option<usize> {
        if hay.len() < self.len {
            return None;
        }
        let mut h = hash(&hay[..self.len]);
        let mut at = 0;
        loop {
            if self.filter[(h as usize >> 6) & 1023] & (1 << (h & 63)) != 0
                && let Some(slot) = self.patterns.get(&h)
                && let Some((_, secret)) = slot.iter().find(|(p, _)| **p == hay[at..at + self.len])
            {
                return Some(*secret);
            }
            if at + self.len == hay.len() {
                return None;
            }
            h = h
                .wrapping_sub(u64::from(hay[at]).wrapping_mul(self.top))
                .wrapping_mul(BASE)
                .wrapping_add(u64::from(hay[at + self.len]));
            at += 1;
        }
    }
}

/// A run to search for, and the index of the secret it belongs to.
type Pattern = (Box<[u8]>, usize);

/// Called once with a secret's name when a body is cut for carrying its value.
pub(crate) type Tripped = Box<dyn FnOnce(&str) + Send + Sync>;

fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |h, b| {
        h.wrapping_mul(BASE).wrapping_add(u64::from(*b))
    })
}

impl Reflections {
    /// The forms of `values` (secret name, value), searched for in everything a response
    /// carries.
    pub(crate) fn new(values: &[(String, &[u8])]) -> Reflections {
        let mut by_len: Vec<Matcher> = Vec::new();
        let mut secrets = Vec::new();
        for (i, (name, value)) in values.iter().enumerate() {
            secrets.push(name.clone());
            for (form, encoded) in forms(value) {
                if encoded && form.len() < MIN_ENCODED.min(value.len()) {
                    continue;
                }
                let len = form.len().min(WINDOW);
                if len == 0 {
                    continue;
                }
                let at = match by_len.iter().position(|m| m.len == len) {
                    Some(at) => at,
                    None => {
                        by_len.push(Matcher::new(len));
                        by_len.len() - 1
                    }
                };
                for run in form.windows(len) {
                    by_len[at].add(run, i);
                }
            }
        }
        let hold = by_len.iter().map(|m| m.len).max().unwrap_or(1) - 1;
        Reflections {
            by_len,
            secrets,
            hold,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_len.is_empty()
    }

    /// The secret whose value (in some form) `hay` holds, if any.
    pub(crate) fn find(&self, hay: &[u8]) -> Option<&str> {
        self.by_len
            .iter()
            .find_map(|m| m.find(hay))
            .map(|i| self.secrets[i].as_str())
    }

    /// The secret whose value some header name or value holds.
    pub(crate) fn in_headers(&self, headers: &HeaderMap) -> Option<&str> {
        headers.iter().find_map(|(k, v)| {
            self.find(k.as_str().as_bytes())
                .or_else(|| self.find(v.as_bytes()))
        })
    }
}

/// A response body on its way to the sandbox, searched for reflections. Its last bytes are held
/// back until the next ones (or its end) show they begin no hit; a hit ends the body with an
/// error before any of its bytes (hyper then resets the stream or closes the connection), and
/// `tripped` is called once with the secret's name.
pub(crate) struct Guarded<B> {
    inner: B,
    guard: std::sync::Arc<Reflections>,
    held: Vec<u8>,
    trailers: Option<HeaderMap>,
    tripped: Option<Tripped>,
}

impl<B> Guarded<B> {
    pub(crate) fn new(inner: B, guard: std::sync::Arc<Reflections>, tripped: Tripped) -> Self {
        Guarded {
            inner,
            guard,
            held: Vec::new(),
            trailers: None,
            tripped: Some(tripped),
        }
    }

    fn trip(&mut self, secret: &str) -> Box<dyn std::error::Error + Send + Sync> {
        if let Some(f) = self.tripped.take() {
            f(secret);
        }
        self.held.clear();
        "the response carried a secret's value".into()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> HttpBody for Guarded<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.tripped.is_none() {
                return Poll::Ready(None);
            }
            if let Some(trailers) = self.trailers.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    // Everything held was searched already, with what came before it.
                    if self.held.is_empty() {
                        return Poll::Ready(None);
                    }
                    let rest = std::mem::take(&mut self.held);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let frame = match frame.into_data() {
                Ok(data) => {
                    let mut joined = std::mem::take(&mut self.held);
                    joined.extend_from_slice(&data);
                    if let Some(secret) = self.guard.find(&joined).map(str::to_string) {
                        return Poll::Ready(Some(Err(self.trip(&secret))));
                    }
                    let keep = joined.len().min(self.guard.hold);
                    self.held = joined.split_off(joined.len() - keep);
                    if joined.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(joined)))));
                }
                Err(frame) => frame,
            };
            if let Ok(trailers) = frame.into_trailers() {
                if let Some(secret) = self.guard.in_headers(&trailers).map(str::to_string) {
                    return Poll::Ready(Some(Err(self.trip(&secret))));
                }
                if self.held.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                // What is held goes first; the trailers on the next poll.
                self.trailers = Some(trailers);
                let rest = std::mem::take(&mut self.held);
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.trailers.is_none() && self.inner.is_end_stream()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::forms::{hex, html_escaped, percent};
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    const VALUE: &str = "sk-live/Az+9q_Ke\"y<&>'0123456789";

    fn guard() -> Reflections {
        Reflections::new(&[("api".into(), VALUE.as_bytes())])
    }

    fn hits(text: &[u8]) -> bool {
        guard().find(text).is_some()
    }

    #[test]
    fn every_form_of_the_value_whole_or_cut_short_is_found() {
        let v = VALUE.as_bytes();
        let embedded = |inner: &[u8]| [b"{\"echo\": \"".as_slice(), inner, b"\"}"].concat();
        let basic = STANDARD.encode(format!("user:{VALUE}"));
        let mut forms: Vec<(&str, Vec<u8>)> = vec![
            ("raw", v.to_vec()),
            ("lower", VALUE.to_lowercase().into_bytes()),
            ("upper", VALUE.to_uppercase().into_bytes()),
            ("json", serde_json::to_string(VALUE).unwrap().into_bytes()),
            (
                "json \\/",
                serde_json::to_string(VALUE)
                    .unwrap()
                    .replace('/', "\\/")
                    .into_bytes(),
            ),
            ("html", html_escaped(VALUE, "&#x27;")),
            ("percent", percent(v, true, false)),
            ("percent lower", percent(v, false, false)),
            ("base64", STANDARD.encode(v).into_bytes()),
            ("base64url", URL_SAFE.encode(v).into_bytes()),
            ("basic credentials", basic.into_bytes()),
            (
                "base64 at 1",
                STANDARD.encode(format!("x{VALUE}")).into_bytes(),
            ),
            (
                "base64 at 2",
                STANDARD.encode(format!("xy{VALUE}")).into_bytes(),
            ),
            ("hex", hex(v, false)),
            ("HEX", hex(v, true)),
            ("cut short", v[..WINDOW + 2].to_vec()),
            ("its tail", v[v.len() - WINDOW..].to_vec()),
        ];
        forms.push(("inside json", embedded(v)));
        for (what, form) in forms {
            assert!(hits(&form), "{what}: {}", String::from_utf8_lossy(&form));
        }
    }

    /// A value with a character some encoder escapes in every 16-byte window, written out as
    /// each encoder writes it (by hand, not by `json_escaped`): each is found.
    #[test]
    fn every_json_encoders_form_of_a_value_full_of_escapes_is_found() {
        let value = "k<e&y>'+`/\u{e9}\"a<b&c>d'e+f`g/h\"i<j&k>l'm+n";
        let guard = Reflections::new(&[("api".into(), value.as_bytes())]);
        let forms = [
            // Python (ensure_ascii).
            r#"k<e&y>'+`/\u00e9\"a<b&c>d'e+f`g/h\"i<j&k>l'm+n"#,
            // PHP.
            r#"k<e&y>'+`\/\u00e9\"a<b&c>d'e+f`g\/h\"i<j&k>l'm+n"#,
            // JavaScript, serde_json: UTF-8 as it is.
            "k<e&y>'+`/\u{e9}\\\"a<b&c>d'e+f`g/h\\\"i<j&k>l'm+n",
            // Go.
            "k\\u003ce\\u0026y\\u003e'+`/\u{e9}\\\"a\\u003cb\\u0026c\\u003ed'e+f`g/h\\\"i\\u003cj\\u0026k\\u003el'm+n",
            // .NET.
            r#"k\u003Ce\u0026y\u003E\u0027\u002B\u0060/\u00E9\"a\u003Cb\u0026c\u003Ed\u0027e\u002Bf\u0060g/h\"i\u003Cj\u0026k\u003El\u0027m\u002Bn"#,
        ];
        for form in forms {
            assert!(guard.find(form.as_bytes()).is_some(), "not found: {form}");
        }
        assert!(serde_json::to_string(value).unwrap().contains(forms[2]));
    }

    #[test]
    fn ordinary_text_and_short_runs_of_the_value_are_not_hits() {
        let v = VALUE.as_bytes();
        for text in [
            b"{\"ok\": true, \"id\": \"sk-live-0000\"}".as_slice(),
            &v[..WINDOW - 1],
            &v[v.len() - (WINDOW - 1)..],
            b"sk-live/****************6789",
            &[0u8; 4096],
        ] {
            assert!(!hits(text), "{}", String::from_utf8_lossy(text));
        }
        // A value shorter than the window is searched whole, and only whole.
        let short = Reflections::new(&[("s".into(), b"abc123XYZ")]);
        assert!(short.find(b"..abc123XYZ..").is_some());
        assert!(short.find(b"..abc123XY..").is_none());
    }

    #[test]
    fn headers_names_and_values_are_searched() {
        let g = guard();
        let mut h = HeaderMap::new();
        h.insert("x-ok", "fine".parse().unwrap());
        assert!(g.in_headers(&h).is_none());
        h.insert(
            "access-control-allow-origin",
            axum::http::HeaderValue::from_bytes(&percent(VALUE.as_bytes(), true, false)).unwrap(),
        );
        assert_eq!(g.in_headers(&h), Some("api"));
        let mut h = HeaderMap::new();
        let name = format!("x-{}", &VALUE[8..8 + WINDOW]).to_lowercase();
        if let Ok(n) = axum::http::HeaderName::from_bytes(name.as_bytes()) {
            h.insert(n, "1".parse().unwrap());
            assert_eq!(g.in_headers(&h), Some("api"));
        }
    }

    /// A body split anywhere: the hit is found, and nothing of it got out before.
    #[test]
    fn a_body_is_cut_before_the_hit_wherever_its_chunks_split() {
        use http_body_util::BodyExt;
        let body = format!("{}{VALUE}{}", "a".repeat(40), "b".repeat(40)).into_bytes();
        let start = 40;
        for cut in 1..body.len() {
            let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
                Ok(Frame::data(Bytes::copy_from_slice(&body[..cut]))),
                Ok(Frame::data(Bytes::copy_from_slice(&body[cut..]))),
            ];
            let inner = http_body_util::StreamBody::new(futures::stream::iter(chunks));
            let tripped = std::sync::Arc::new(std::sync::Mutex::new(None));
            let t = tripped.clone();
            let mut g = Guarded::new(
                inner,
                std::sync::Arc::new(guard()),
                Box::new(move |s| *t.lock().unwrap() = Some(s.to_string())),
            );
            let mut passed = Vec::new();
            let failed = futures::executor::block_on(async {
                while let Some(f) = g.frame().await {
                    match f {
                        Ok(f) => passed.extend_from_slice(f.data_ref().unwrap()),
                        Err(_) => return true,
                    }
                }
                false
            });
            assert!(failed, "cut at {cut}");
            assert!(
                passed.len() < start + 1,
                "cut at {cut}: {} bytes passed",
                passed.len()
            );
            assert_eq!(tripped.lock().unwrap().as_deref(), Some("api"));
        }
        // A clean body passes whole, in order, trailers last.
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"hello "))),
            Ok(Frame::data(Bytes::from_static(b"world"))),
            Ok(Frame::trailers(HeaderMap::new())),
        ];
        let inner = http_body_util::StreamBody::new(futures::stream::iter(chunks));
        let g = Guarded::new(inner, std::sync::Arc::new(guard()), Box::new(|_| {}));
        let all = futures::executor::block_on(g.collect()).unwrap();
        assert!(all.trailers().is_some());
        assert_eq!(&all.to_bytes()[..], b"hello world");
    }
}
