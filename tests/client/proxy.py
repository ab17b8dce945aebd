"""A small TCP proxy with scripted faults, between a client under test and a server.

Each accepted connection takes the next fault from :attr:`FaultProxy.faults` (or
passes through when none is left):

* ``"reset"``: close the client's connection with a TCP reset before anything is
  forwarded (the server never sees the request);
* ``"drop_answer"``: forward the request, wait for the server's first answer bytes
  (the request was handled: a submit has admitted its job), then reset the
  client's connection without sending them;
* ``("status", code, retry_after)``: read the request and answer ``code`` with that
  ``Retry-After`` itself (the server never sees it);
* ``("cut_after_events", n)``: pass through, but reset both sides once ``n`` events
  (``event:`` lines) went to the client.

Every connection's first request bytes are kept in :attr:`requests`. Threads only;
each connection's sockets have timeouts, so nothing hangs a test.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

Fault = str | tuple[Any, ...]


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN (SO_LINGER 0). ``shutdown(SHUT_RD)`` first wakes a
    thread blocked in ``recv`` on it (a plain close would wait for that recv)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()


def _read_request(sock: socket.socket) -> bytes:
    """One request's head and Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class FaultProxy:
    """Listens on 127.0.0.1 (``port``) and forwards to ``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: list[Fault] = []
        self.requests: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                fault = self.faults.pop(0) if self.faults else None
            threading.Thread(target=self._serve, args=(client, fault), daemon=True).start()

    def _serve(self, client: socket.socket, fault: Fault | None) -> None:
        client.settimeout(60)
        try:
            if fault == "reset":
                _reset(client)
                return
            request = _read_request(client)
            with self._lock:
                self.requests.append(request)
            if isinstance(fault, tuple) and fault[0] == "status":
                _, code, retry_after = fault
                body = b'{"error": "injected by the test proxy"}'
                client.sendall(
                    f"HTTP/1.1 {code} Injected\r\nContent-Type: application/json\r\n"
                    f"Retry-After: {retry_after}\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n".encode()
                    + body
                )
                client.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=60)
            upstream.sendall(request)
            if fault == "drop_answer":
                upstream.recv(65536)  # the server answered: the request was handled
                _reset(client)
                upstream.close()
                return
            cut_after = fault[1] if isinstance(fault, tuple) else None
            self._pump(client, upstream, cut_after)
        except OSError:
            client.close()

    def _pump(self, client: socket.socket, upstream: socket.socket, cut_after: int | None) -> None:
        """Copy both ways until either side closes (or the cut)."""

        def up() -> None:
            try:
                while chunk := client.recv(65536):
                    upstream.sendall(chunk)
                upstream.shutdown(socket.SHUT_WR)  # the client is done: so is the server
            except OSError:
                pass

        threading.Thread(target=up, daemon=True).start()
        events = 0
        try:
            while chunk := upstream.recv(65536):
                client.sendall(chunk)
                events += chunk.count(b"\nevent: ")
                if cut_after is not None and events >= cut_after:
                    _reset(client)
                    _reset(upstream)
                    return
        except OSError:
            pass
        client.close()
        upstream.close()

    def close(self) -> None:
        self._listener.close()


@contextmanager
def fault_proxy(upstream_port: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()
