//! The name a client-first connection names itself by: the server name of a TLS ClientHello, or
//! the Host of an HTTP/1 request. Reads only what the client already sent; parses defensively
//! (the bytes come from the sandbox).

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A TLS ClientHello, with its server name if it sent one.
    Tls(Option<String>),
    /// An HTTP/1 request: its Host (without port) if it sent one.
    Http(Option<String>),
    /// Neither, or not enough bytes yet to tell.
    Other,
}

impl Hello {
    /// The host the client named, if it named one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Hello::Tls(n) | Hello::Http(n) => n.as_deref(),
            Hello::Other => None,
        }
    }

    /// The protocol, as the network log names it.
    pub fn protocol(&self) -> &'static str {
        match self {
            Hello::Tls(_) => "tls",
            Hello::Http(_) => "http",
            Hello::Other => "tcp",
        }
    }
}

/// Whether `buf` may still grow into a ClientHello or an HTTP request head worth waiting for.
pub fn incomplete(buf: &[u8]) -> bool {
    if buf.first() == Some(&0x16) {
        // TLS record: header of 5 bytes, then the length it announces.
        return buf.len() < 5 || buf.len() < 5 + usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    }
    looks_like_http(buf) && !buf.windows(4).any(|w| w == b"\r\n\r\n")
}

fn looks_like_http(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    const METHODS: [&[u8]; 9] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"HEAD ",
        b"DELETE ",
        b"OPTIONS ",
        b"PATCH ",
        b"CONNECT ",
        b"TRACE ",
    ];
    METHODS
        .iter()
        .any(|m| buf.starts_with(m) || (buf.len() < m.len() && m.starts_with(buf)))
}

/// Reads the first bytes of a connection.
pub fn parse(buf: &[u8]) -> Hello {
    if buf.first() == Some(&0x16) {
        return Hello::Tls(sni(buf).and_then(|n| clean(&n)));
    }
    if looks_like_http(buf) {
        return Hello::Http(http_host(buf).and_then(|h| clean(&h)));
    }
    Hello::Other
}

/// A lowercase name without a trailing dot, or nothing if it is not a DNS name.
fn clean(name: &str) -> Option<String> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    crate::valid_name(&name).then_some(name)
}

/// The Host header of an HTTP/1 request head, without its port. A request with two Host headers
/// has none (a smuggling attempt names one host to the policy and another to the server).
fn http_host(buf: &[u8]) -> Option<String> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut hosts = head
        .split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.trim());
    let host = hosts.next()?;
    if hosts.next().is_some() {
        return None;
    }
    // `[v6]:port` or `name:port`.
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
        _ => host,
    };
    Some(host.to_string())
}

/// The server_name extension of a TLS ClientHello (RFC 8446 4.1.2, RFC 6066 3).
fn sni(buf: &[u8]) -> Option<String> {
    let mut r = Reader(buf);
    // Record header: type 22 (handshake), version, length.
    if r.u8()? != 0x16 {
        return None;
    }
    r.skip(2)?;
    let len = usize::from(r.u16()?);
    let record = r.take(len)?;
    let mut r = Reader(record);
    // Handshake header: type 1 (ClientHello), 24-bit length.
    if r.u8()? != 1 {
        return None;
    }
    let len = (usize::from(r.u8()?) << 16) | usize::from(r.u16()?);
    let mut r = Reader(r.take(len)?);
    r.skip(2 + 32)?; // version, random
    let sid = r.u8()?;
    r.skip(usize::from(sid))?;
    let suites = r.u16()?;
    r.skip(usize::from(suites))?;
    let comp = r.u8()?;
    r.skip(usize::from(comp))?;
    let len = usize::from(r.u16()?);
    let mut exts = Reader(r.take(len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let body = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(body);
        let len = usize::from(list.u16()?);
        let mut names = Reader(list.take(len)?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let len = usize::from(names.u16()?);
            let name = names.take(len)?;
            if name_type == 0 {
                return std::str::from_utf8(name).ok().map(str::to_string);
            }
        }
    }
    None
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A minimal ClientHello carrying `name` as its server name.
    pub(crate) fn client_hello(name: &str) -> Vec<u8> {
        let n = name.as_bytes();
        let mut sni = Vec::new();
        sni.extend_from_slice(&((n.len() + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(n.len() as u16).to_be_bytes());
        sni.extend_from_slice(n);
        let mut exts = Vec::new();
        exts.extend_from_slice(&0u16.to_be_bytes());
        exts.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sni);
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[7; 32]);
        hello.push(0); // session id
        hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        hello.extend_from_slice(&[1, 0]); // null compression
        hello.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        hello.extend_from_slice(&exts);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(hello.len() as u16).to_be_bytes());
        hs.extend_from_slice(&hello);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn reads_the_server_name_of_a_client_hello() {
        let hello = client_hello("PyPI.org");
        assert_eq!(parse(&hello), Hello::Tls(Some("pypi.org".into())));
        assert!(!incomplete(&hello));
        assert!(incomplete(&hello[..hello.len() - 1]));
        // Every truncation parses to no name, never a panic.
        for n in 0..hello.len() {
            let _ = parse(&hello[..n]);
        }
    }

    #[test]
    fn reads_the_host_of_an_http_request() {
        let req = b"GET / HTTP/1.1\r\nHost: Api.Example.test:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(parse(req), Hello::Http(Some("api.example.test".into())));
        assert!(incomplete(&req[..20]));
        assert!(incomplete(b"GE"));
        assert!(!incomplete(req));
        // Two Host headers name no host.
        let smuggled = b"GET / HTTP/1.1\r\nHost: allowed.test\r\nhost: evil.test\r\n\r\n";
        assert_eq!(parse(smuggled), Hello::Http(None));
        assert_eq!(parse(b"SSH-2.0-OpenSSH\r\n"), Hello::Other);
        assert_eq!(parse(b""), Hello::Other);
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: 1.2.3.4\r\n\r\n"),
            Hello::Http(None)
        );
    }
}
