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
a control byte (not HTAB) in a header line                400
a head over ``totalHeadersSize`` bytes/``maxHeaders``     431
a request line over ``MAX_LENGTH`` bytes                  414
an ``Expect`` other than ``100-continue``                 417
a declared body over the site's ``body_limit``            413*
head and body not in ``read_timeout_s`` after 1st byte    408**
========================================================  ======

(*) the 413 answer itself comes from the site's ``early_reject`` policy, so the
documented pre-check order holds. (**) decided by the site's sweep
(:meth:`FramingChannel.expire`), not by a timer per request. Every refusal is written at once with
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
#: First bytes of a line that is obs-fold (a continuation of the previous field).
_FOLD = b" \t"
#: Lower-cased first letters of the framing fields (Transfer-Encoding, Content-Length,
#: Host, Expect): only those lines are looked at by name.
_FRAMING_INITIALS = frozenset(b"tche")
_CONTENT_LENGTH, _CHUNKED = 1, 2
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
    headers = {"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-store"}
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
    site's ``early_reject`` answer to a body over the limit)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class FramingChannel(HTTPChannel):
    """An :class:`HTTPChannel` applying the rules of the module docstring.

    Its site (``self.site``, set by ``Site.buildProtocol``) may provide
    ``body_limit`` (int bytes or None), ``early_reject(method, target, headers,
    length) -> EarlyResponse``, ``request_id() -> str`` (for refusals of requests
    without an ``X-Request-ID`` of their own) and ``channel_opened(channel)`` /
    ``channel_closed(channel)``; a plain ``Site`` works too (rules, no deadlines).
    """

    #: Header fields per request (twisted.web allows 500); the gateway's limit too.
    maxHeaders = 200

    #: True once a refusal was written: nothing more is read.
    refused = False
    #: When the request being read began (its first byte), else None; the site's
    #: sweep answers 408 to a request still being read long after.
    reading_since: float | None = None
    #: The request line of the request being read (None between requests), and what
    #: its head has shown so far. Plain attributes, not a record: this runs per line.
    mortred_line: bytes | None = None
    mortred_size = 0
    mortred_fields = 0
    mortred_hosts = 0
    mortred_length = 0  # _CONTENT_LENGTH | _CHUNKED seen
    mortred_bad_expect = False
    #: True while a request is being answered (bytes then wait in twisted.web's buffer).
    mortred_busy = False
    #: When the connection last received bytes or finished an answer.
    last_active = 0.0

    # -- connection ------------------------------------------------------------------

    def connectionMade(self) -> None:
        HTTPChannel.connectionMade(self)
        self.mortred_now = self.factory.reactor.seconds
        self.last_active = self.mortred_now()
        opened: Callable[[FramingChannel], None] | None = getattr(self.site, "channel_opened", None)
        if opened is not None:
            opened(self)

    def connectionLost(self, reason: Any) -> None:
        self.reading_since = None
        closed: Callable[[FramingChannel], None] | None = getattr(self.site, "channel_closed", None)
        if closed is not None:
            closed(self)
        HTTPChannel.connectionLost(self, reason)

    # -- reading (base methods called directly: this is the per-line hot path) --------

    def dataReceived(self, data: bytes) -> None:
        if self.refused:
            return
        now = self.last_active = self.mortred_now()
        if self.reading_since is None and not self.mortred_busy:
            self.reading_since = now
        HTTPChannel.dataReceived(self, data)

    def lineReceived(self, line: bytes) -> None:
        if self.refused:
            return
        if self.mortred_line is None:
            if line:  # a request line (an empty one is twisted's to ignore once)
                self.mortred_line = line
                self.mortred_size = len(line) + 2
                self.mortred_fields = self.mortred_hosts = self.mortred_length = 0
                self.mortred_bad_expect = False
            HTTPChannel.lineReceived(self, line)
            return
        size = self.mortred_size = self.mortred_size + len(line) + 2
        if line:
            fields = self.mortred_fields = self.mortred_fields + 1
            if line[0] in _FOLD:
                self.refuse(400, "obsolete line folding in the request head")
                return
            if size > self.totalHeadersSize or fields > self.maxHeaders:
                self.refuse(431, "request head too large")
                return
        HTTPChannel.lineReceived(self, line)

    def lineLengthExceeded(self, line: bytes) -> None:
        if self.mortred_line is None:
            self.refuse(414, "request line too long")
        else:
            self.refuse(431, "request head too large")

    def headerReceived(self, line: bytes) -> bool:
        if self.refused:
            return False
        if len(line.translate(None, _CTL)) != len(line):
            return self.refuse(400, "control character in a header")
        if line[0] | 0x20 in _FRAMING_INITIALS:  # t(ransfer-encoding) c h e
            name, _, value = line.partition(b":")
            name = name.lower()
            if name == b"transfer-encoding":
                if not (self.mortred_line or b"").endswith(b" HTTP/1.1"):
                    return self.refuse(400, "Transfer-Encoding in an HTTP/1.0 request")
                if self.mortred_length:
                    return self.refuse(400, "ambiguous body length")
                codings = [c.strip(b" \t").lower() for c in value.split(b",")]
                if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
                    return self.refuse(400, "chunked must be the final transfer coding")
                if len(codings) > 1:
                    return self.refuse(501, "transfer coding not implemented")
                self.mortred_length = _CHUNKED
            elif name == b"content-length":
                if self.mortred_length:
                    return self.refuse(400, "ambiguous body length")
                self.mortred_length = _CONTENT_LENGTH
            elif name == b"host":
                self.mortred_hosts += 1
            elif name == b"expect" and value.strip(b" \t").lower() != b"100-continue":
                self.mortred_bad_expect = True
        return bool(HTTPChannel.headerReceived(self, line))

    def allHeadersReceived(self) -> None:
        if self.refused:
            return
        hosts = self.mortred_hosts
        if hosts != 1 and (hosts or (self.mortred_line or b"").endswith(b" HTTP/1.1")):
            self.refuse(400, "an HTTP/1.1 request needs exactly one Host header")
            return
        if self.mortred_bad_expect:
            self.refuse(417, "only Expect: 100-continue is supported")
            return
        limit = getattr(self.site, "body_limit", None)
        if limit is not None and self.length is not None and self.length > limit:
            self.refuse_too_large(self.length)
            return
        HTTPChannel.allHeadersReceived(self)

    def allContentReceived(self) -> None:
        if self.refused:
            return  # the rest of a refused chunked body: never a request
        self.reading_since = None
        self.mortred_line = None
        self.mortred_busy = True
        HTTPChannel.allContentReceived(self)

    def requestDone(self, request: Any) -> None:
        self.mortred_busy = False
        self.last_active = self.mortred_now()
        HTTPChannel.requestDone(self, request)

    # -- refusing --------------------------------------------------------------------

    def refuse_too_large(self, length: int) -> None:
        """A body over the site's limit: the site's ``early_reject`` answer, then close."""
        parts = (self.mortred_line or b"").split(b" ")
        method, target = (parts[0], parts[1]) if len(parts) == 3 else (b"", b"")
        early = getattr(self.site, "early_reject", None)
        if early is None:
            self.refuse(413, "request body too large")
            return
        request = self.requests[-1] if self.requests else None
        headers = request.requestHeaders if request is not None else None
        answer = early(method, target, headers, length)
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
        given = self.requests[-1].getHeader(b"x-request-id") if self.requests else None
        make_id: Callable[[], str] | None = getattr(self.site, "request_id", None)
        self.transport.write(refusal_bytes(status, body, extra, given, make_id))
        self.loseConnection()

    def expire(self, reading: float | None, idle: float | None) -> None:
        """The site's sweep: a request whose first byte came before ``reading`` and that
        is still being read (head or body) is answered 408 and the connection closes;
        a connection whose client has sent nothing since before ``idle`` (between
        requests, or mid-request) is timed out as twisted.web would (closed, and
        aborted ``abortTimeout`` seconds later if an answer is still unread). A
        request being answered (a long ``/wait``) is never timed out here."""
        if self.mortred_busy or self.refused:
            return
        since = self.reading_since
        if since is not None and reading is not None and since < reading:
            self.refuse(408, "request not received in time")
        elif idle is not None and self.last_active < idle:
            self.timeoutConnection()
