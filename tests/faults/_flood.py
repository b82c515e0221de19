"""Open COUNT TCP connections to HOST:PORT from the address SOURCE and hold them (a flood for
tests/faults/test_listener_flood.py; loopback only, bounded in count and time).

    python -m tests.faults._flood HOST PORT COUNT SOURCE

Connects without blocking, at most 512 handshakes in flight, each given 10 s. Prints one JSON
line once every connection is established or has failed: {"opened": n, "failed": {errno
name: n}, "closed": n (already closed by the server)}, then holds the open ones until stdin
closes. Raises its own open-files limit to the hard limit.
"""

from __future__ import annotations

import errno
import json
import resource
import selectors
import socket
import sys
import time

IN_FLIGHT = 512
CONNECT_TIMEOUT = 10.0


def main() -> None:
    host, port, count, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    selector = selectors.DefaultSelector()
    opened: list[socket.socket] = []
    failed: dict[str, int] = {}
    started = 0
    pending: dict[socket.socket, float] = {}

    def fail(code: int) -> None:
        name = errno.errorcode.get(code, str(code))
        failed[name] = failed.get(name, 0) + 1

    while started < count or pending:
        while started < count and len(pending) < IN_FLIGHT:
            started += 1
            sock = socket.socket()
            try:
                sock.bind((source, 0))
                sock.setblocking(False)
                code = sock.connect_ex((host, port))
            except OSError as exc:
                sock.close()
                fail(exc.errno or 0)
                continue
            if code not in (0, errno.EINPROGRESS):
                sock.close()
                fail(code)
                continue
            pending[sock] = time.monotonic() + CONNECT_TIMEOUT
            selector.register(sock, selectors.EVENT_WRITE)
        for key, _ in selector.select(0.1):
            sock = key.fileobj  # type: ignore[assignment]
            selector.unregister(sock)
            del pending[sock]
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                sock.close()
                fail(code)
            else:
                opened.append(sock)
        now = time.monotonic()
        for sock, deadline in list(pending.items()):
            if deadline < now:
                selector.unregister(sock)
                del pending[sock]
                sock.close()
                fail(errno.ETIMEDOUT)
    closed = 0
    for sock in opened:
        try:
            if sock.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    print(json.dumps({"opened": len(opened), "failed": failed, "closed": closed}), flush=True)
    sys.stdin.read()
    for sock in opened:
        sock.close()


if __name__ == "__main__":
    main()
