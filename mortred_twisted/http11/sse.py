"""Server-sent events framing (pure): ``text/event-stream`` records.

Each record is ``id:``, ``event:`` and one ``data:`` line per line of data, ended by
a blank line (WHATWG HTML § server-sent events). Values are ours (event names, a
per-job sequence, compact JSON), but every field is still checked for CR/LF so a
value can never start a second record.
"""

from __future__ import annotations

CONTENT_TYPE = b"text/event-stream; charset=utf-8"


def _field(name: str, value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"SSE {name} must be one line")
    return f"{name}: {value}\n"


def event(name: str, data: str, event_id: int | None = None) -> bytes:
    """One event record; multi-line ``data`` becomes several ``data:`` lines."""
    parts = []
    if event_id is not None:
        parts.append(_field("id", str(event_id)))
    parts.append(_field("event", name))
    parts.extend(f"data: {line}\n" for line in data.replace("\r\n", "\n").split("\n"))
    parts.append("\n")
    return "".join(parts).encode("utf-8")


def comment(text: str) -> bytes:
    """A comment line (a heartbeat): clients ignore it, idle proxies see traffic."""
    if "\r" in text or "\n" in text:
        raise ValueError("SSE comment must be one line")
    return f": {text}\n\n".encode()


def retry(ms: int) -> bytes:
    """Tells the client how long to wait before reconnecting."""
    return f"retry: {int(ms)}\n\n".encode("ascii")
