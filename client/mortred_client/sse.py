"""An incremental ``text/event-stream`` parser (pure; the WHATWG grammar).

Feed it bytes as they arrive, in any split; it returns the complete events. Comments
(``: ping``) are skipped, ``retry:`` is remembered, an event's ``id`` persists to the
following events as the spec says (it is the ``Last-Event-ID`` to send on a
reconnect), and a record without ``data`` dispatches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: its name (``message`` unless named), data and last id."""

    event: str
    data: str
    id: str | None


class SseParser:
    """Bytes in, :class:`SseEvent` s out. One per stream; not thread-safe."""

    def __init__(self) -> None:
        self._buffer = b""
        self._name = ""
        self._data: list[str] = []
        self.last_event_id: str | None = None
        #: The server's reconnection hint in milliseconds (``retry:``), if any.
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events completed by ``chunk`` (an incomplete line waits for more)."""
        self._buffer += chunk
        out: list[SseEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return out
            end, skip = cut
            line = self._buffer[:end].decode("utf-8", "replace")
            self._buffer = self._buffer[end + skip :]
            event = self._line(line)
            if event is not None:
                out.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            data, name = self._data, self._name or "message"
            self._data, self._name = [], ""
            if not data:
                return None
            return SseEvent(name, "\n".join(data), self.last_event_id)
        if line.startswith(":"):
            return None
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._name = value
        elif field == "id" and "\0" not in value:
            self.last_event_id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first line ends and how long its terminator is (CRLF, LF or CR); a
    CR at the very end may be the first half of a CRLF, so it waits."""
    lf = buffer.find(b"\n")
    cr = buffer.find(b"\r")
    if cr == -1 and lf == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, 1
    if cr + 1 == len(buffer):
        return None
    return cr, 2 if buffer[cr + 1 : cr + 2] == b"\n" else 1
