"""HTTP/1.1 framing rules twisted.web leaves to the application (model ports).

twisted.web's :class:`~twisted.web.http.HTTPChannel` parses the request line, header
names, ``Content-Length`` syntax and chunked bodies itself (strict since Twisted
22.4, CVE-2022-24801: chunk sizes such as ``0x2a``, ``+2a``, ``2_a``, `` 2a`` and
``-0``, and chunk extensions with control bytes are refused with a bare 400). It
does not apply these RFC 9112/9110 rules, which :class:`FramingChannel` adds by
overriding the channel's public methods (``dataReceived``, ``lineReceived``,
``lineLengthExceeded``, ``headerReceived``, ``allHeadersReceived``,
``allContentReceived``, ``requestDone``, ``connectionMade``, ``connectionLost``):

========================================================  ======
rule                                                      answer
========================================================  ======
HTTP/1.1 request without exactly one ``Host``             400
``Transfer-Encoding`` in an HTTP/1.0 request              400
both ``Content-Length`` and ``Transfer-Encoding``         400
more than one ``Content-Length`` line                     400
``chunked`` not the final coding, or given twice          400
another coding before a final ``chunked``                 501
obs-fold (a header line starting with SP/HTAB)            400
a control byte (not HTAB) in a header value               400
a head over ``totalHeadersSize`` bytes/``maxHeaders``     431
a request line over ``MAX_LENGTH`` bytes                  414
an ``Expect`` other than ``100-continue``                 417
a declared body over the site's ``body_limit``            413*
head and body not in ``read_timeout_s`` after 1st byte    408
========================================================  ======

(*) the 413 answer itself comes from the site's ``early_reject`` policy, so the
documented pre-check order holds. Every refusal is written at once with
``Connection: close``; the channel then closes and reads nothing more, so bytes
after a refused request are never taken as a request. Header values we write are
made safe by :func:`header_value`. Thread contract: reactor thread only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from twisted.web.http import RESPONSES, HTTPChannel

#: Reason phrases twisted.web does not know.
REASONS: dict[int, bytes] = {
    422: b"Unprocessable Entity",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}
#: Control bytes never allowed in a header value (RFC 9110 5.5; HTAB is allowed).
_CTL = bytes(range(0x20)).replace(b"\t", b"") + b"\x7f"
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


@dataclass
class Head:
    """What the channel learnt of the request it is reading (request line, framing
    headers); ``method``/``target``/``version`` are empty when the line is invalid
    (twisted.web refuses it then)."""

    method: bytes = b""
    target: bytes = b""
    version: bytes = b""
    size: int = 0
    headers: int = 0
    hosts: int = 0
    content_length: int = 0
    chunked: bool = False
    expect: list[bytes] = field(default_factory=list)

    @classmethod
    def from_request_line(cls, line: bytes) -> Head:
        parts = line.split(b" ")
        if len(parts) != 3:
            return cls(size=len(line) + 2)
        return cls(parts[0], parts[1], parts[2], size=len(line) + 2)


@dataclass(frozen=True)
class EarlyResponse:
    """A complete response decided from the request line and headers alone (the
    site's ``early_reject`` answer to a body over the limit)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class FramingChannel(HTTPChannel):
    """An :class:`HTTPChannel` applying the rules of the module docstring.

    Its site (``self.site``, set by ``Site.buildProtocol``) may provide
    ``body_limit`` (int bytes or None), ``early_reject(method, target, headers,
    length) -> EarlyResponse``,
    ``request_id() -> str`` (for refusals of requests without an ``X-Request-ID``
    of their own), and ``channel_opened(channel)`` /
    ``channel_closed(channel)``; a plain ``Site`` works too (rules only).
    """

    #: Header fields per request (twisted.web allows 500); the gateway's limit too.
    maxHeaders = 200

    def __init__(self) -> None:
        super().__init__()
        #: True once a refusal was written: nothing more is read.
        self.refused = False
        self.mortred_head: Head | None = None
        self.mortred_busy = False
        #: When the request being read began (its first byte), else None; the
        #: site's sweep answers 408 to a request still being read long after.
        self.reading_since: float | None = None

    # -- connection ------------------------------------------------------------------

    def connectionMade(self) -> None:
        super().connectionMade()
        opened: Callable[[FramingChannel], None] | None = getattr(self.site, "channel_opened", None)
        if opened is not None:
            opened(self)

    def connectionLost(self, reason: Any) -> None:
        self.reading_since = None
        closed: Callable[[FramingChannel], None] | None = getattr(self.site, "channel_closed", None)
        if closed is not None:
            closed(self)
        super().connectionLost(reason)

    # -- reading ---------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self.refused:
            return
        if self.reading_since is None and not self.mortred_busy:
            self.reading_since = self.factory.reactor.seconds()
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        if self.refused:
            return
        head = self.mortred_head
        if head is None:
            if line:  # a request line (an empty one is twisted's to ignore once)
                self.mortred_head = Head.from_request_line(line)
            super().lineReceived(line)
            return
        head.size += len(line) + 2
        if line:
            head.headers += 1
            if head.size > self.totalHeadersSize or head.headers > self.maxHeaders:
                self.refuse(431, "request head too large")
                return
            if line[0] in b" \t":
                self.refuse(400, "obsolete line folding in the request head")
                return
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        if self.mortred_head is None:
            self.refuse(414, "request line too long")
        else:
            self.refuse(431, "request head too large")

    def headerReceived(self, line: bytes) -> bool:
        if self.refused:
            return False
        head = self.mortred_head
        name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        if value.translate(None, _CTL) != value:
            return self.refuse(400, "control character in a header value")
        lname = name.lower()
        if head is not None:
            if lname == b"transfer-encoding":
                if head.version != b"HTTP/1.1":
                    return self.refuse(400, "Transfer-Encoding in an HTTP/1.0 request")
                if head.content_length or head.chunked:
                    return self.refuse(400, "ambiguous body length")
                codings = [c.strip().lower() for c in value.split(b",")]
                if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
                    return self.refuse(400, "chunked must be the final transfer coding")
                if len(codings) > 1:
                    return self.refuse(501, "transfer coding not implemented")
                head.chunked = True
            elif lname == b"content-length":
                if head.content_length or head.chunked:
                    return self.refuse(400, "ambiguous body length")
                head.content_length += 1
            elif lname == b"host":
                head.hosts += 1
            elif lname == b"expect":
                head.expect.append(value)
        return bool(super().headerReceived(line))

    def allHeadersReceived(self) -> None:
        if self.refused:
            return
        head = self.mortred_head or Head()
        if head.hosts > 1 or (head.hosts == 0 and head.version == b"HTTP/1.1"):
            self.refuse(400, "an HTTP/1.1 request needs exactly one Host header")
            return
        if any(e.lower() != b"100-continue" for e in head.expect):
            self.refuse(417, "only Expect: 100-continue is supported")
            return
        limit = getattr(self.site, "body_limit", None)
        if limit is not None and self.length is not None and self.length > limit:
            self.refuse_too_large(self.length)
            return
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        if self.refused:
            return  # the rest of a refused chunked body: never a request
        self.reading_since = None
        self.mortred_head = None
        self.mortred_busy = True
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        self.mortred_busy = False
        super().requestDone(request)

    # -- refusing --------------------------------------------------------------------

    def refuse_too_large(self, length: int) -> None:
        """A body over the site's limit: the site's ``early_reject`` answer, then close."""
        head = self.mortred_head or Head()
        early = getattr(self.site, "early_reject", None)
        if early is None:
            self.refuse(413, "request body too large")
            return
        request = self.requests[-1] if self.requests else None
        headers = request.requestHeaders if request is not None else None
        answer = early(head.method, head.target, headers, length)
        self._write_refusal(answer.status, answer.body, answer.headers)

    def refuse(self, status: int, message: str) -> bool:
        """Answer ``status`` with ``{"error": message}`` and close; read nothing more.
        Returns False (what ``headerReceived`` returns for a refused header)."""
        body = json.dumps({"error": message}).encode("utf-8")
        self._write_refusal(status, body, {})
        return False

    def _write_refusal(self, status: int, body: bytes, extra: Mapping[str, str]) -> None:
        if self.refused:
            return
        self.refused = True
        self.reading_since = None
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "Cache-Control": "no-store",
            **extra,
        }
        if "X-Request-ID" not in headers:
            given = self.requests[-1].getHeader(b"x-request-id") if self.requests else None
            make_id: Callable[[], str] | None = getattr(self.site, "request_id", None)
            if given:
                headers["X-Request-ID"] = given.decode("utf-8", "replace")[:256]
            elif make_id is not None:
                headers["X-Request-ID"] = make_id()
        self.transport.write(response_bytes(status, body, headers))
        self.loseConnection()

    def expire(self, before: float) -> None:
        """The site's sweep: a request whose first byte came before ``before`` and that
        is still being read (head or body) is answered 408 and the connection closes.
        A request being answered (a long ``/wait``) is never timed out here."""
        since = self.reading_since
        if since is not None and since < before and not self.mortred_busy:
            self.refuse(408, "request not received in time")
