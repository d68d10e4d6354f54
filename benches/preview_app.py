import socket, sys
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(128)
while True:
    c, _ = s.accept()
    try:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        got = b""
        while b"\r\n\r\n" not in got:
            d = c.recv(65536)
            if not d:
                break
            got += d
        if got:
            c.sendall(ANSWER)
    except OSError:
        pass
    c.close()
