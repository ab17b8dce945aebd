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


def test_a_models_own_events_are_followed_once_when_asked() -> None:
    """preview/output events (ids m<n>) come with the last status, once each, even
    when a reopened stream sends them again; without model_events they are skipped."""
    from mortred_client.protocol import EventFollow

    status = '{"job_id":"job_1","state":"running","progress":{"step":1,"total":3}}'
    events = [
        SseEvent("state", status, "1"),
        SseEvent("preview", '{"frame":0}', "m1"),
        SseEvent("output", '{"name":"output-0.png"}', "m2"),
        SseEvent("state", status, "1"),  # the stream reopened: status again
        SseEvent("preview", '{"frame":0}', "m1"),
        SseEvent("output", '{"name":"output-0.png"}', "m2"),
        SseEvent("preview", '{"frame":1}', "m3"),
    ]
    follow = EventFollow(model_events=True)
    seen = [e for e in (follow.accept(s) for s in events) if e is not None]
    assert [(e.name, e.data) for e in seen if e.model_event] == [
        ("preview", {"frame": 0}),
        ("output", {"name": "output-0.png"}),
        ("preview", {"frame": 1}),
    ]
    assert all(e.status.state == "running" and not e.terminal for e in seen)
    plain = EventFollow()
    assert [e.name for e in (plain.accept(s) for s in events) if e is not None] == ["state"]
