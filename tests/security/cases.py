"""The framing table: one row per RFC 9112/9110 rule and per request-smuggling shape.

Each row is a request (bytes, with ``{path}`` for a POST route of the target and
``{auth}`` for its credentials) and the status that must refuse it. The suite sends
the row followed by a pipelined canary (``GET /healthz``) on the same connection: a
row passes only if the first answer has that status, the connection then closes, and
the canary is never answered (tests/security/test_framing.py; in memory in
tests/http/test_framing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

CANARY = b"GET /healthz HTTP/1.1\r\nHost: canary\r\n\r\n"
#: 42 bytes of JSON: the body a chunk size of 0x2a would announce.
BODY42 = b'{"images":["aGk="],"params":{"x":"12345"}}'
assert len(BODY42) == 42


@dataclass(frozen=True)
class Row:
    """``raw``: the request; ``status``: the refusal; ``slow``: the request stops
    before its end and must be refused by the read deadline."""

    name: str
    raw: bytes
    status: int
    slow: bool = False

    def render(self, path: bytes, auth: bytes) -> bytes:
        return self.raw.replace(b"{path}", path).replace(b"{auth}", auth)


def _post(headers: bytes, body: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return (
        b"POST {path} " + version + b"\r\n{auth}Content-Type: application/json\r\n"
        + headers + b"\r\n" + body
    )  # fmt: skip


_HOST = b"Host: x\r\n"
_CHUNKED = _HOST + b"Transfer-Encoding: chunked\r\n"


def _chunked(size_line: bytes, data: bytes = BODY42) -> bytes:
    return _post(_CHUNKED, size_line + b"\r\n" + data + b"\r\n0\r\n\r\n")


ROWS: tuple[Row, ...] = (
    # -- chunk-size syntax (CVE-2022-24801 shapes) and chunk extensions
    Row("chunk size 0x2a", _chunked(b"0x2a"), 400),
    Row("chunk size +2a", _chunked(b"+2a"), 400),
    Row("chunk size 2_a", _chunked(b"2_a"), 400),
    Row("chunk size with a leading space", _chunked(b" 2a"), 400),
    Row("chunk size -0 as the last chunk", _post(_CHUNKED, b"-0\r\n\r\n"), 400),
    Row("chunk extension with a bare LF", _chunked(b"2a;ext=1\nx"), 400),
    Row("chunk extension with a NUL", _chunked(b"2a;ext=\x00"), 400),
    Row("chunk data longer than its size", _chunked(b"29"), 400),
    # -- Content-Length / Transfer-Encoding conflicts
    Row(
        "Content-Length then Transfer-Encoding",
        _post(_HOST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
        400,
    ),
    Row(
        "Transfer-Encoding then Content-Length",
        _post(_CHUNKED + b"Content-Length: 5\r\n", b"0\r\n\r\n"),
        400,
    ),
    Row(
        "two differing Content-Length lines",
        _post(_HOST + b"Content-Length: 2\r\nContent-Length: 7\r\n", b"{}canary"),
        400,
    ),
    Row("Content-Length list of two values", _post(_HOST + b"Content-Length: 2, 7\r\n"), 400),
    Row("Content-Length with a sign", _post(_HOST + b"Content-Length: +2\r\n", b"{}"), 400),
    Row("Transfer-Encoding gzip only", _post(_HOST + b"Transfer-Encoding: gzip\r\n"), 400),
    Row(
        "Transfer-Encoding chunked twice",
        _post(_HOST + b"Transfer-Encoding: chunked, chunked\r\n", b"0\r\n\r\n"),
        400,
    ),
    Row(
        "Transfer-Encoding gzip before chunked",
        _post(_HOST + b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"),
        501,
    ),
    Row(
        "Transfer-Encoding with a space before the colon",
        _post(_HOST + b"Transfer-Encoding : chunked\r\n", b"0\r\n\r\n"),
        400,
    ),
    # -- HTTP/1.0 framing and Host
    Row(
        "HTTP/1.0 with Transfer-Encoding chunked",
        _post(_CHUNKED, b"0\r\n\r\n", version=b"HTTP/1.0"),
        400,
    ),
    Row("HTTP/1.1 without Host", _post(b"Content-Length: 2\r\n", b"{}"), 400),
    Row("two Host lines", _post(_HOST + b"Host: y\r\nContent-Length: 2\r\n", b"{}"), 400),
    # -- obs-fold, NUL/CR/LF and control bytes in heads
    Row(
        "obs-fold in a header",
        _post(_HOST + b"X-Folded: a\r\n b\r\nContent-Length: 2\r\n", b"{}"),
        400,
    ),
    Row(
        "obs-fold continuing Transfer-Encoding",
        _post(_HOST + b"Transfer-Encoding:\r\n chunked\r\n", b"0\r\n\r\n"),
        400,
    ),
    Row("NUL in a header value", _post(_HOST + b"X-A: a\x00b\r\nContent-Length: 0\r\n"), 400),
    Row("bare CR in a header value", _post(_HOST + b"X-A: a\rb\r\nContent-Length: 0\r\n"), 400),
    Row("bare LF in a header value", _post(_HOST + b"X-A: a\nb\r\nContent-Length: 0\r\n"), 400),
    Row(
        "control byte in a header value", _post(_HOST + b"X-A: a\x01\r\nContent-Length: 0\r\n"), 400
    ),
    Row("NUL in a header name", _post(_HOST + b"X-\x00A: a\r\nContent-Length: 0\r\n"), 400),
    Row("NUL in the request target", b"GET /heal\x00thz HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    Row("bare LF ending the request line", b"GET /healthz HTTP/1.1\nHost: x\r\n\r\n", 400),
    # -- oversize heads
    Row("a 70 kB header", _post(_HOST + b"X-Big: " + b"a" * 70_000 + b"\r\n"), 431),
    Row("1000 headers", _post(_HOST + b"X-Many: a\r\n" * 1000), 431),
    # -- expectations and slow bodies
    Row(
        "Expect other than 100-continue",
        _post(_HOST + b"Expect: 200-ok\r\nContent-Length: 2\r\n", b"{}"),
        417,
    ),
    Row(
        "a body trickling in past the read deadline",
        _post(_HOST + b"Content-Length: 42\r\n", BODY42[:10]),
        408,
        slow=True,
    ),
)
