"""The framing table (cases.py) against a real gateway and a real model server: each
row is refused with its status, the connection closes, and the pipelined canary is
never answered; every process keeps serving."""

from __future__ import annotations

import socket

import pytest

from tests.security.cases import CANARY, ROWS, Row
from tests.security.conftest import READ_DEADLINE_S, Target
from tests.security.wire import exchange, healthz, parse_answers, read_until_closed

pytestmark = pytest.mark.slow

TARGETS = ("model", "gateway", "supervisor")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_row_is_refused_and_the_canary_is_never_answered(
    processes: dict[str, Target], target: str, row: Row
) -> None:
    """The refusal has the table's status, the connection closes, the canary gets nothing."""
    t = processes[target]
    request = row.render(t.post_path, t.auth)
    if row.slow:
        # The canary cannot follow: it would be read as the rest of the body.
        answers, closed = exchange(t.port, request, timeout=READ_DEADLINE_S + 15)
    else:
        answers, closed = exchange(t.port, request + CANARY)
    assert [a.status for a in answers] == [row.status], answers
    assert closed, "the connection stayed open after a refusal"
    assert healthz(t.port) == 200 and t.alive()


@pytest.mark.parametrize("target", TARGETS)
def test_a_valid_pipeline_is_answered_in_order(processes: dict[str, Target], target: str) -> None:
    """The control row: a chunked POST (extension included) and the canary on one
    connection are both answered, in order, and the connection stays open."""
    t = processes[target]
    chunked = (
        b"POST " + t.post_path + b" HTTP/1.1\r\nHost: x\r\n" + t.auth
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"2;ext=1\r\n{}\r\n0\r\n\r\n"
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", t.port), timeout=10) as sock:
        sock.sendall(chunked + CANARY)
        raw = b""
        while len(parse_answers(raw)) < 2:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no second answer: {raw!r}") from None
            assert chunk, f"closed early: {raw!r}"
            raw += chunk
        answers = parse_answers(raw)
        assert [a.status for a in answers] == [t.empty_post_status, 200]
        assert answers[1].body == b'{"status":"ok"}'
        sock.sendall(CANARY)  # still open and in step
        rest, _ = read_until_closed(sock, 0.5)
        assert [a.status for a in parse_answers(rest)] == [200]


@pytest.mark.parametrize("target", TARGETS)
def test_non_latin1_request_id_on_an_oversized_post_is_answered(
    processes: dict[str, Target], target: str
) -> None:
    """A POST over the size limit whose X-Request-ID is a snowman is answered 413 (the
    early path used to raise UnicodeEncodeError and answer nothing)."""
    t = processes[target]
    head = (
        b"POST " + t.post_path + b" HTTP/1.1\r\nHost: x\r\n" + t.auth
        + b"Content-Type: application/json\r\nContent-Length: 999999999\r\n"
        + "X-Request-ID: ☃\r\n\r\n".encode()
    )  # fmt: skip
    answers, closed = exchange(t.port, head)
    assert [a.status for a in answers] == [413] and closed
    rid = answers[0].headers.get("x-request-id", "")
    assert rid.isascii() and "☃" not in rid
    if target == "model":  # the model echoes it, percent-encoded
        assert rid == "%E2%98%83"
