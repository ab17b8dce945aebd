"""Relaying a job's event stream to a client as it arrives: the gateway's and the
supervisor's one relay (reactor thread).

:func:`relay` takes the model's answer to ``GET /jobs/{job}/events`` once its head is
in (an :class:`~mortred_twisted.http11.upstream_stream.UpstreamStream`, status and headers
already copied to ``request``). A ``200 text/event-stream`` is relayed: the client's
head is sent at once, then every complete record (:class:`~.rewrite.EventRecords`:
cut at blank lines, job URLs rewritten in each ``data:`` line) with
``request.write`` as soon as it arrived, never held until the job ends. Any other
answer (an error JSON) is read whole and returned with its ``Content-Length``.

The returned Deferred fires with the last bytes to send when the upstream body is
complete, fails like the stream's ``done``
(:class:`~mortred_twisted.http11.upstream.UpstreamError` when it broke off), and,
cancelled (the client left), aborts the upstream connection, which ends the
model's stream.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from mortred_twisted.gateway.rewrite import EventRecords
from mortred_twisted.http11.upstream_stream import UpstreamStream

EVENT_STREAM = b"text/event-stream"


def is_event_stream(stream: UpstreamStream) -> bool:
    """A 200 ``text/event-stream`` answer (anything else is read whole)."""
    ctype = (stream.headers.getRawHeaders(b"content-type") or [b""])[0]
    return stream.code == 200 and ctype.startswith(EVENT_STREAM)


def relay(stream: UpstreamStream, request: Any, prefix: str) -> defer.Deferred[bytes]:
    """See the module docstring. ``prefix``: where the client finds the job
    (:func:`~.rewrite.gateway_prefix`, :func:`~.rewrite.supervisor_prefix`). The
    stream is the request's producer: a client that does not read pauses it."""
    if not is_event_stream(stream):
        return stream.read_all().addCallback(_whole, request)
    request.setHeader(b"X-Accel-Buffering", b"no")  # nor should any proxy after us
    request.write(b"")  # the head now, before the first record
    records = EventRecords(prefix)
    write = request.write
    request.registerProducer(stream, True)

    def forward(data: bytes) -> None:
        out = records.feed(data)
        if out:
            write(out)

    def ended(result: Any) -> Any:
        request.unregisterProducer()
        return result

    stream.start(forward)
    return stream.done.addBoth(ended).addCallback(lambda _: records.flush())


def _whole(body: bytes, request: Any) -> bytes:
    request.setHeader(b"Content-Length", b"%d" % len(body))
    return body
