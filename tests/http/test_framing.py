"""The framing table (tests/security/cases.py) against the model port's Site in memory:
every row refused with its status, the connection closed, the canary never answered,
whether the bytes arrive at once or one by one."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mortred_twisted.http.limits import LimitedSite
from tests.http.test_model_server_app import make_app
from tests.security.cases import CANARY, ROWS, Row
from tests.security.wire import parse_answers

READ_TIMEOUT_S = 5.0


def model_site() -> tuple[LimitedSite, Clock]:
    app, _clock, _threads, _stub = make_app()
    clock = Clock()
    site = LimitedSite(
        app.resource(), app.config.request_size_limit_bytes, app.early_reject,
        read_timeout_s=READ_TIMEOUT_S, reactor=clock,
    )  # fmt: skip
    site.startFactory()
    return site, clock


def connect(site: LimitedSite) -> tuple[Any, StringTransport]:
    proto = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_row_is_refused_and_the_canary_is_never_answered(row: Row, bytewise: bool) -> None:
    """A framing refusal has the table's status, closes, and nothing after it is read."""
    site, clock = model_site()
    proto, transport = connect(site)
    data = row.render(b"/jobs", b"") + (b"" if row.slow else CANARY)
    pieces = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
    for piece in pieces:
        if transport.disconnecting:
            break
        proto.dataReceived(piece)
    if row.slow:
        assert transport.value() == b""
        clock.advance(READ_TIMEOUT_S * 1.25)
    answers = parse_answers(transport.value())
    assert [a.status for a in answers] == [row.status], transport.value()[:300]
    assert transport.disconnecting
    assert answers[0].headers.get("connection") in ("close", None)


def test_a_well_framed_pipeline_is_answered_in_order() -> None:
    """Valid chunked and Content-Length requests, pipelined with the canary, are all
    answered in order on one connection (the rules refuse only what they must)."""
    site, _clock = model_site()
    proto, transport = connect(site)
    chunked = (
        b"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2;ext=1\r\n{}\r\n0\r\n\r\n"
    )
    sized = b"POST /nope HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"
    old = b"GET /healthz HTTP/1.0\r\n\r\n"
    proto.dataReceived(chunked + sized + CANARY + old)
    answers = parse_answers(transport.value())
    assert [a.status for a in answers] == [404, 404, 200, 200]
    assert all(a.headers.get("x-request-id") for a in answers)
