"""A model port's answers made outside a route: reason phrases, header values that
cannot split a head, whole refusals with ``X-Request-ID`` (pure: no reactor).

The model port is served by :mod:`mortred_twisted.http11.server`; the refusals it
makes itself (framing errors, decisions from the head, the body budget) are shaped
here so that they read like the routes' own JSON errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from twisted.web.http import RESPONSES

#: Reason phrases twisted.web does not know.
REASONS: dict[int, bytes] = {
    421: b"Misdirected Request",
    422: b"Unprocessable Entity",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}
#: Visible ASCII and SP but ``%``: what :func:`header_value` leaves unescaped.
_VISIBLE = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25)


def reason(status: int) -> bytes:
    """The reason phrase of ``status``."""
    return REASONS.get(status) or RESPONSES.get(status, b"Error")


def header_value(text: str) -> bytes:
    """``text`` as a header value that encodes safely and cannot split a head.

    Visible ASCII (``!`` to ``~``) and spaces are kept as they are; if anything else
    occurs (non-ASCII, control bytes), every such character and ``%`` are
    percent-encoded (UTF-8), e.g. ``☃`` -> ``%E2%98%83``. The model port's rule for
    the ``X-Request-ID`` it echoes (docs/api.md).
    """
    if text.isascii() and text.isprintable():
        return text.encode("ascii")
    return quote(text, safe=_VISIBLE).encode("ascii")


def response_bytes(
    status: int, body: bytes, headers: Mapping[str, str], *, close: bool = True
) -> bytes:
    """A whole HTTP/1.1 response: status line, ``headers`` (values made safe by
    :func:`header_value`), ``Content-Length`` and, if ``close``, ``Connection: close``."""
    lines = [b"HTTP/1.1 %d %s" % (status, reason(status))]
    for name, value in headers.items():
        lines.append(name.encode("ascii") + b": " + header_value(value))
    lines.append(b"Content-Length: %d" % len(body))
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def refusal_bytes(
    status: int,
    body: bytes,
    extra: Mapping[str, str],
    given_id: bytes | None,
    make_id: Callable[[], str] | None,
) -> bytes:
    """A model port's refusal (any of its servers): JSON, ``no-store``, ``extra``
    headers, an ``X-Request-ID`` (``extra``'s, else the client's ``given_id`` cut to
    256 characters, else ``make_id()``), then ``Connection: close``."""
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    }
    headers.update(extra)
    if "X-Request-ID" not in headers:
        if given_id:
            headers["X-Request-ID"] = given_id.decode("utf-8", "replace")[:256]
        elif make_id is not None:
            headers["X-Request-ID"] = make_id()
    return response_bytes(status, body, headers)


@dataclass(frozen=True)
class EarlyResponse:
    """A complete response decided from the request line and headers alone (the
    model server's answer to a head it refuses, :meth:`~mortred_twisted.http.
    request_checks.RequestChecks.refuse_from_head`)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


#: (method, target, headers, declared or observed body length) -> response
EarlyReject = Callable[[bytes, bytes, Any, int], EarlyResponse]
