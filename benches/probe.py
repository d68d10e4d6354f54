"""The client of every network figure, run with the system's Python as the same script on
the host and in a sandbox (which sees the host's /usr), timing itself:

- `bytes IP PORT N`: one `GET /bytes/N`, read into a 1 MiB buffer; prints the body's bytes
  and the seconds from before connect to the last byte;
- `tcp IP PORT N`: N times (after one untimed) connect, send one byte, read it back, close;
  prints each in microseconds;
- `http IP PORT HOST PATH N [NAME:VALUE...]`: N times (after one untimed) connect, `GET PATH`
  with `Host: HOST` and these headers, read to the end (a 200 answer), close; prints each in
  microseconds;
- `tls IP PORT NAME CAFILE N [NAME:VALUE...]`: one TLS connection (server name NAME, trusting
  the CAs in CAFILE), then N times (after one untimed) `GET` with `Host: NAME` and these
  headers, reading the whole answer: requests on a warm keep-alive connection; prints each
  in microseconds;
- `tlsnew IP PORT NAMES CAFILE N [NAME:VALUE...]`: N times (after one untimed) connect, TLS
  handshake, the `GET` above, close; each time with a new server name, NAMES with `@`
  replaced by the count; prints each in microseconds;
- `tlsup IP PORT NAME CAFILE BYTES [NAME:VALUE...]`: one TLS connection, one untimed `GET`,
  then a `POST` of BYTES (sent from a 1 MiB buffer) and its answer; prints BYTES and the
  seconds from the first byte sent to the answer.
"""
import socket, ssl, sys, time

def connect(ip, port):
    s = socket.create_connection((ip, int(port)), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def tcp(ip, port):
    s = connect(ip, port)
    s.sendall(b"x")
    assert s.recv(1) == b"x", "no echo"
    s.close()

def http(ip, port, host, path, *headers):
    s = connect(ip, port)
    extra = "".join(f"{h}\r\n" for h in headers)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode())
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    assert got[:9] in (b"HTTP/1.0 ", b"HTTP/1.1 ") and got[9:12] == b"200", got[:200]
    s.close()

def answer(s):
    got = b""
    while b"\r\n\r\n" not in got:
        d = s.recv(65536)
        assert d, "closed before the answer"
        got += d
    head, _, body = got.partition(b"\r\n\r\n")
    assert head[:9] == b"HTTP/1.1 " and head[9:12] == b"200", got[:300]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        d = s.recv(65536)
        assert d, "closed in the answer"
        body += d

def request(s, name, headers, size=0, chunk=None):
    extra = "".join(f"{h}\r\n" for h in headers)
    if size:
        s.sendall(f"POST /upload HTTP/1.1\r\nHost: {name}\r\n{extra}Content-Length: {size}\r\n\r\n".encode())
        while size:
            k = min(size, len(chunk))
            s.sendall(chunk[:k])
            size -= k
    else:
        s.sendall(f"GET /hello HTTP/1.1\r\nHost: {name}\r\n{extra}\r\n".encode())
    answer(s)

def tls(ctx, ip, port, name):
    return ctx.wrap_socket(connect(ip, port), server_hostname=name)

def timed(n, once):
    once()
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        once()
        out.append((time.perf_counter_ns() - t) / 1000)
    print(" ".join(f"{x:.1f}" for x in out))

mode, args = sys.argv[1], sys.argv[2:]
if mode == "bytes":
    ip, port, n = args
    t = time.perf_counter()
    s = connect(ip, port)
    s.sendall(f"GET /bytes/{n} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    buf = memoryview(bytearray(1 << 20))
    head = b""
    while b"\r\n\r\n" not in head:
        k = s.recv_into(buf)
        assert k, "closed before the head"
        head += bytes(buf[:k])
    assert head[:9] in (b"HTTP/1.0 ", b"HTTP/1.1 ") and head[9:12] == b"200", head[:200]
    body = len(head) - head.index(b"\r\n\r\n") - 4
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        body += k
    print(body, time.perf_counter() - t)
elif mode == "tcp":
    ip, port, n = args
    timed(int(n), lambda: tcp(ip, port))
elif mode == "http":
    ip, port, host, path, n, *headers = args
    timed(int(n), lambda: http(ip, port, host, path, *headers))
elif mode == "tls":
    ip, port, name, cafile, n, *headers = args
    s = tls(ssl.create_default_context(cafile=cafile), ip, port, name)
    timed(int(n), lambda: request(s, name, headers))
    s.close()
elif mode == "tlsnew":
    ip, port, names, cafile, n, *headers = args
    ctx = ssl.create_default_context(cafile=cafile)
    count = iter(range(1 << 30))
    def first():
        name = names.replace("@", str(next(count)))
        s = tls(ctx, ip, port, name)
        request(s, name, headers)
        s.close()
    timed(int(n), first)
elif mode == "tlsup":
    ip, port, name, cafile, size, *headers = args
    s = tls(ssl.create_default_context(cafile=cafile), ip, port, name)
    request(s, name, headers)
    chunk = memoryview(b"x" * (1 << 20))
    t = time.perf_counter()
    request(s, name, headers, int(size), chunk)
    print(size, time.perf_counter() - t)
    s.close()
