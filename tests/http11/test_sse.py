"""SSE framing: records a browser's EventSource parses, and no value can split a record."""

from __future__ import annotations

import pytest

from mortred_twisted.http11 import sse


def test_event_record_has_id_event_and_data_then_a_blank_line() -> None:
    """An event is id, event and data lines ended by an empty line."""
    assert sse.event("state", '{"state":"running"}', 3) == (
        b'id: 3\nevent: state\ndata: {"state":"running"}\n\n'
    )


def test_multi_line_data_becomes_several_data_lines() -> None:
    """Each line of data gets its own data: field (the client joins them with LF)."""
    assert sse.event("x", "a\nb\r\nc") == b"event: x\ndata: a\ndata: b\ndata: c\n\n"


@pytest.mark.parametrize("bad", ["done\nevent: evil", "a\rb"])
def test_a_field_with_a_line_break_is_refused(bad: str) -> None:
    """An event name or comment with CR/LF would start a new field: refused."""
    with pytest.raises(ValueError):
        sse.event(bad, "{}")
    with pytest.raises(ValueError):
        sse.comment(bad)


def test_comment_and_retry_records() -> None:
    """A heartbeat is a comment record; retry tells the client its reconnect delay."""
    assert sse.comment("ping") == b": ping\n\n"
    assert sse.retry(1500) == b"retry: 1500\n\n"
