"""Reading answers off a raw connection for the framing suite (blocking sockets)."""

from __future__ import annotations

import contextlib
import re
import socket
from dataclasses import dataclass, field

_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")


@dataclass
class Answer:
    status: int
    head: bytes
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def parse_answers(data: bytes, first_is_head: bool = False) -> list[Answer]:
    """Every response in ``data`` (interim 1xx answers skipped): framed by
    ``Content-Length``, or by the end of the data when it has none; the first has
    no body at all when it answers a ``HEAD`` (``first_is_head``)."""
    answers: list[Answer] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise AssertionError(f"not an HTTP answer: {data[:200]!r}")
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if 100 <= status < 200:
            data = rest
            continue
        m = _LENGTH.search(head)
        length = int(m.group(1)) if m else len(rest)
        if first_is_head and not answers:
            length = 0
        answers.append(Answer(status, head, rest[:length], headers))
        data = rest[length:]
    return answers


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the peer sends until it closes (True) or ``timeout`` passes
    without a byte (False)."""
    sock.settimeout(timeout)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return b"".join(chunks), False
        except ConnectionResetError:
            return b"".join(chunks), True
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[list[Answer], bool]:
    """Send ``data`` on a fresh connection (write side kept open) and read every
    answer until the server closes: ``(answers, closed)``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # Refused mid-send: what was answered is still readable.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        raw, closed = read_until_closed(sock, timeout)
    return parse_answers(raw), closed


def healthz(port: int, timeout: float = 10.0) -> int:
    """The status of ``GET /healthz`` on a fresh connection (0 when none came)."""
    answers, _ = exchange(
        port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout
    )
    return answers[0].status if answers else 0
