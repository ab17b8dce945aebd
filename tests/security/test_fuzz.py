"""Fuzzed request heads and chunk streams against the real gateway and model server:
no 5xx, no desync (a refusal is the last answer; the pipelined canary is answered only
after a request that was read whole, and then last), and the process keeps answering
``/healthz``. Examples are bounded so the whole file runs in seconds."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.security.conftest import Target
from tests.security.wire import Answer, healthz, parse_answers

pytestmark = pytest.mark.slow

TARGETS = ("model", "gateway", "supervisor")
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
#: The canary, told apart from a fuzzed /healthz by the id both processes echo.
CANARY = b"GET /healthz HTTP/1.1\r\nHost: canary\r\nX-Request-ID: fuzz-canary\r\n\r\n"


def is_canary(answer: Answer) -> bool:
    return answer.status == 200 and answer.headers.get("x-request-id") == "fuzz-canary"


# -- request heads ---------------------------------------------------------------------

_NAMES = [
    b"Host", b"Content-Length", b"Transfer-Encoding", b"Expect", b"Connection",
    b"Content-Type", b"X-Request-ID", b"Authorization", b"Upgrade", b"Trailer",
]  # fmt: skip
_VALUES = [
    b"x", b"0", b"2", b"-1", b"+2", b"2, 2", b"99999999999999999999", b"chunked",
    b"gzip, chunked", b"chunked, gzip", b"identity", b"100-continue", b"close",
    b"keep-alive", b"application/json", b"\xe2\x98\x83", b"a\x00b", b"a\rb", b"a\nb",
    b" ", b"",
]  # fmt: skip
_header_name = st.one_of(
    st.sampled_from(_NAMES),
    st.binary(min_size=0, max_size=12),
    st.sampled_from(_NAMES).map(lambda n: n + b" "),
)
_header_value = st.one_of(st.sampled_from(_VALUES), st.binary(max_size=24))
_separator = st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r", b"\r\n ", b"\r\n\t"])


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """A request head (often nearly valid) and a short body."""
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"G\x00T", b""]))
    target = draw(
        st.sampled_from([b"/healthz", b"{path}", b"/jobs/job_x", b"*", b"http://x/healthz"])
        | st.binary(max_size=16)
    )
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b""]))
    sep = draw(_separator)
    lines = [method + b" " + target + b" " + version]
    if draw(st.booleans()):
        lines.append(b"Host: x")
    for name, value in draw(st.lists(st.tuples(_header_name, _header_value), max_size=6)):
        lines.append(name + b":" + draw(st.sampled_from([b" ", b"", b"\t"])) + value)
    body = draw(st.binary(max_size=32))
    return sep.join(lines) + b"\r\n\r\n" + body


# -- chunk streams -----------------------------------------------------------------------

_MUTATIONS = [
    lambda n: b"0x" + n, lambda n: b"+" + n, lambda n: b"-" + n, lambda n: b" " + n,
    lambda n: n[:1] + b"_" + n[1:], lambda n: n + b"g", lambda n: b"",
]  # fmt: skip
_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=6)


@st.composite
def chunk_streams(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A chunked body and whether it is well formed. Malformed ones are broken in a
    way that every conforming parser must refuse at once (size syntax, extension
    bytes, data longer than its size, a missing CRLF after the data)."""
    out, valid = [], True
    for _ in range(draw(st.integers(0, 4))):
        data = draw(st.binary(min_size=1, max_size=20))
        size = draw(st.sampled_from(["{:x}", "{:X}", "{:04x}"])).format(len(data)).encode()
        ext = b""
        if draw(st.booleans()):
            ext = b";" + draw(_token).encode()
            if draw(st.booleans()):
                ext += b"=" + draw(_token).encode()
        end = b"\r\n"
        fault = draw(st.sampled_from(["none"] * 6 + ["size", "ext", "long", "end"]))
        if fault == "size":
            size = draw(st.sampled_from(_MUTATIONS))(size)
        elif fault == "ext":
            ext = b";a" + draw(st.sampled_from([b"\n", b"\x00", b"\r", b"\x01"])) + b"b"
        elif fault == "long":
            data += b"xx"
        elif fault == "end":
            end = draw(st.sampled_from([b"\n", b"xx", b"\r"]))
        valid = valid and fault == "none"
        out.append(size + ext + b"\r\n" + data + end)
    last = b"0" + (b";z" if draw(st.booleans()) else b"") + b"\r\n"
    trailer = b"X-T: 1\r\n" if draw(st.booleans()) else b""
    return b"".join(out) + last + trailer + b"\r\n", valid


# -- properties --------------------------------------------------------------------------


def send(port: int, data: bytes, *, half_close: bool, timeout: float) -> tuple[list[Answer], bool]:
    """Send ``data`` and read answers until the server closes or answers the canary:
    ``(answers, closed)``."""
    head = data.startswith(b"HEAD ")  # its answer has no body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-send
        raw = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return parse_answers(raw, head), True
            raw += chunk
            answers = parse_answers(raw, head)
            if answers and is_canary(answers[-1]):
                return answers, False


def check_in_step(answers: list[Answer], t: Target) -> None:
    """No 5xx; nothing after a ``Connection: close`` answer; the canary last if at all."""
    assert all(a.status < 500 for a in answers), [a.status for a in answers]
    for i, a in enumerate(answers[:-1]):
        assert a.headers.get("connection", "").lower() != "close", (i, answers)
        assert not is_canary(a), ("canary not last", answers)
    assert healthz(t.port) == 200 and t.alive(), f"{t.name} stopped answering"


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzed_heads_never_desync(processes: dict[str, Target], target: str) -> None:
    """Whatever the head, the answers are well-formed HTTP, never 5xx, never out of step."""
    t = processes[target]

    @FUZZ
    @given(head=heads())
    def one(head: bytes) -> None:
        data = head.replace(b"{path}", t.post_path) + CANARY
        answers, _closed = send(t.port, data, half_close=True, timeout=10)
        check_in_step(answers, t)

    one()


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzed_chunk_streams_are_framed_exactly(processes: dict[str, Target], target: str) -> None:
    """A well-formed chunked POST is answered and then the canary; a malformed one is
    refused with 400 and the connection closes before the canary is read."""
    t = processes[target]
    head = (
        b"POST " + t.post_path + b" HTTP/1.1\r\nHost: x\r\n" + t.auth
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )  # fmt: skip

    @FUZZ
    @given(stream=chunk_streams())
    def one(stream: tuple[bytes, bool]) -> None:
        body, valid = stream
        answers, closed = send(t.port, head + body + CANARY, half_close=not valid, timeout=10)
        check_in_step(answers, t)
        if valid:
            assert len(answers) == 2 and is_canary(answers[1]), answers
        else:
            assert [a.status for a in answers] in ([], [400]), answers
            assert closed

    one()
