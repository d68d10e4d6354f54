//! HTTP/1.1 on a bare TCP connection, for what a client library hides: whether an answer lets
//! the client use its connection again.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a server answered on one connection: the head (status line and headers, names
/// lowercased) and whether the server closed the connection after the answer.
pub struct WireAnswer {
    pub head: String,
    pub closed: bool,
}

impl WireAnswer {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Whether the head says `Connection: close`.
    pub fn says_close(&self) -> bool {
        self.head
            .lines()
            .any(|l| l.eq_ignore_ascii_case("connection: close"))
    }
}

/// Sends a request to `addr` (`host:port`): `head` (request line and headers, each line ending
/// in CRLF, without `Content-Length`), then a body of `body_len` bytes of `x` while the answer
/// is read (a server may answer before reading it, or never read it). The connection is closed
/// by us after 20 s of silence at most.
pub async fn send_raw(addr: &str, head: &str, body_len: usize) -> WireAnswer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let head = format!("{head}Content-Length: {body_len}\r\n\r\n");
    let writer = tokio::spawn(async move {
        write.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 * 1024];
        let mut left = body_len;
        while left > 0 {
            let n = left.min(chunk.len());
            write.write_all(&chunk[..n]).await?;
            left -= n;
        }
        // Keep our side open: the question is whether the server closes.
        std::future::pending::<()>().await;
        Ok::<_, std::io::Error>(write)
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut closed = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(20), read.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
        // A connection kept alive goes quiet after the answer: once the head and a body of
        // its stated length are in, stop listening.
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse::<usize>().ok());
            if length.is_some_and(|n| got.len() >= end + 4 + n)
                && !head
                    .lines()
                    .any(|l| l.eq_ignore_ascii_case("connection: close"))
            {
                break;
            }
        }
    }
    writer.abort();
    let end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no answer: {:?}", String::from_utf8_lossy(&got)));
    WireAnswer {
        head: String::from_utf8_lossy(&got[..end]).to_ascii_lowercase(),
        closed,
    }
}
