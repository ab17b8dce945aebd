"""The incremental event-stream parser: any split of the bytes gives the same events."""

from __future__ import annotations

from mortred_client.sse import SseEvent, SseParser

STREAM = (
    b"retry: 2000\n\n"
    b'id: 1\nevent: state\ndata: {"state":"pending"}\n\n'
    b": ping\n\n"
    b"id: 2\r\nevent: progress\r\ndata: a\r\ndata: b\r\n\r\n"
    b"data: no id given\rdata:x\r\r"
    b"event: ignored\n\n"
)
EXPECTED = [
    SseEvent("state", '{"state":"pending"}', "1"),
    SseEvent("progress", "a\nb", "2"),
    SseEvent("message", "no id given\nx", "2"),
]


def test_whole_stream() -> None:
    """Events, comments, multi-line data, CRLF and CR endings, the id kept across
    events, the retry hint, and a record without data dispatching nothing."""
    parser = SseParser()
    assert parser.feed(STREAM) == EXPECTED
    assert parser.retry_ms == 2000
    assert parser.last_event_id == "2"


def test_every_split_point() -> None:
    """Fed in two pieces cut anywhere (a CRLF cut in half included), or byte by byte,
    the parser yields the same events."""
    for cut in range(len(STREAM) + 1):
        parser = SseParser()
        assert parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:]) == EXPECTED, cut
    parser = SseParser()
    assert [e for i in range(len(STREAM)) for e in parser.feed(STREAM[i : i + 1])] == EXPECTED


def test_incomplete_event_waits() -> None:
    """An event is dispatched only at its blank line."""
    parser = SseParser()
    assert parser.feed(b"data: half") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\n") == [SseEvent("message", "half", None)]
