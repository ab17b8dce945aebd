"""``GET /jobs/{id}/files/{name}``: one result file of a done job (edge).

An SDK job whose output holds an ``Image``/``File`` keeps it as a result file
(``stores/result_files.py``); its result's ``data`` names it as ``{"url":
"/jobs/<id>/files/<name>", "name", "content_type", "size", "sha256"}``. This route
serves it:

* ``Content-Security-Policy: sandbox`` and ``X-Content-Type-Options: nosniff`` on
  every file answer, and ``Content-Disposition: attachment`` unless the type is an
  image that holds no script, audio, video or plain data (:func:`inline_type`): a
  model's file (its type may be copied from a caller's upload) never runs as a page
  of the origin serving it (the supervisor's UI, through its relay);
* ``Content-Type`` as stored, ``Content-Length``, ``ETag: "<sha256>"``,
  ``Accept-Ranges: bytes``, ``Cache-Control: private, max-age=<s>`` no longer than
  the job's remaining retention (``async_job_ttl`` after its end; ``no-cache`` when
  only LRU bounds it);
* ``If-None-Match`` naming its tag (or ``*``): 304; ``Range: bytes=a-b`` / ``a-`` /
  ``-n`` (one range): 206 with ``Content-Range``; a range past the end: 416 with
  ``Content-Range: bytes */<size>``; several ranges, or ``If-Range`` with another
  tag: the whole file (200);
* another caller's job, an unknown job, an unknown or unsafe name: 404 (as every job
  route: ids cannot be probed); a job not done yet: 409, except the files a running
  job has already written (its ``preview`` events name them), served uncached.

The file is looked up, opened and read on a thread (``runtime.io_threads``: the
store's ``lookup`` and ``open_range``, a file or an S3 object), never on the
reactor, and **streamed**: a chunk at a time at the client's pace
(:class:`~mortred_twisted.http11.threaded_body.ThreadedBody`, framed by the
``Content-Length`` announced), so an answer holds a chunk or two, not the file; a
client that leaves stops the reading at once. The file is served from the handle
opened after the lookup: one replaced since (another attempt) is a 503 before the
head, and a source that fails after it cuts the connection, never a short 200.
:func:`prefers_inline` reads a submit's ``Prefer: return=inline``; when the server
honours it (:func:`inline_applied`: an SDK model, whose outputs may hold files) the
answer says so with ``Preference-Applied: return=inline`` (RFC 7240 §3): the 202 of
a submit (its job's files come back as base64 in its result) and a sync answer
(always inline).

Thread contract: reactor thread only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.web.iweb import IRequest

from mortred_twisted.http import errors as E
from mortred_twisted.http.answers import header_value
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.responder import Responder
from mortred_twisted.http11.threaded_body import ThreadedBody
from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.store import then
from mortred_twisted.jobs.types import JobSnapshot
from mortred_twisted.sdk.seed_contract import sdk_declaration
from mortred_twisted.stores.result_files import BadFileName, StoredFile, check_name

log = Logger()
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d{0,19})\s*-\s*(\d{0,19})\s*$", re.IGNORECASE)
_PREFER_INLINE = re.compile(rb"(^|[,;\s])return\s*=\s*\"?inline\"?($|[,;\s])", re.IGNORECASE)


def prefers_inline(prefer: bytes | None) -> bool:
    """Whether a submit's ``Prefer`` header asks for result files inline."""
    return prefer is not None and _PREFER_INLINE.search(prefer) is not None


#: the answer's header when ``Prefer: return=inline`` was honoured
INLINE_APPLIED = ("Preference-Applied", "return=inline")


def inline_applied(runtime: Any, prefer: bytes | None) -> bool:
    """Whether a request's ``Prefer: return=inline`` is honoured: it asks for it and
    the model is declared with the SDK (the built-in models have no result files,
    so for them the preference changes nothing and is not reported applied)."""
    return prefers_inline(prefer) and sdk_declaration(runtime.validator) is not None


#: types a browser may show inline (images that cannot hold script, audio, video,
#: plain data); anything else is served as an attachment (a download, never a page)
_INLINE = re.compile(
    r"(image/(png|jpeg|gif|webp|avif|bmp)|audio/[a-z0-9.+-]+|video/[a-z0-9.+-]+"
    r"|text/plain|application/json|application/octet-stream)",
)


def inline_type(content_type: str) -> bool:
    """Whether a result file of ``content_type`` is served inline (no
    ``Content-Disposition: attachment``)."""
    main = content_type.split(";", 1)[0].strip().lower()
    return _INLINE.fullmatch(main) is not None


class Unsatisfiable(ValueError):
    """A range that starts past the end of the file (416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The ``(start, end)`` (inclusive) of a single byte range, or None for the whole
    file (no header, several ranges, or one we do not read). An end past the file
    is cut to its last byte; a start past it raises :class:`Unsatisfiable`. Digits
    beyond 19 are not a range (the whole file): nothing overflows."""
    if not header:
        return None
    m = _RANGE.match(header)
    if m is None:
        return None
    first, last = m.group(1), m.group(2)
    if not first and not last:
        return None
    if not first:  # the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise Unsatisfiable(header)
        return max(0, size - n), size - 1
    start = int(first)
    end = int(last) if last else None
    if end is not None and end < start:
        return None  # syntactically invalid: ignored (RFC 9110 14.1.1)
    if start >= size:
        raise Unsatisfiable(header)
    end = size - 1 if end is None else end
    return start, min(end, size - 1)


def _etag_matches(header: str, etag: str) -> bool:
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


class JobFileRoutes:
    """The files route of one model server. ``prechecks``: the job routes' checks;
    ``visible``: the snapshot if the caller may see that job, else None."""

    def __init__(
        self,
        runtime: Any,
        responder: Responder,
        prechecks: Callable[[IRequest], ApiError | None],
        visible: Callable[[IRequest, JobSnapshot | None], JobSnapshot | None],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.runtime = runtime
        self.responder = responder
        self._prechecks = prechecks
        self._visible = visible
        self._now = wall_clock

    def job_file(self, request: IRequest, job_id: str, name: str) -> Any:
        err = self._prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)
        try:
            check_name(job_id, "job id")
        except BadFileName:
            return self.responder.lookup_error(request, job_id)
        snap = self.runtime.store.snapshot(job_id)
        answer = then(snap, lambda s: self._found(request, job_id, name, s, rid))
        return self.responder.store_errors(request, answer, rid)

    def _missing(self, request: IRequest, name: str, rid: str | None) -> bytes:
        err = ApiError(E.NOT_FOUND, f"file not found: {name[:200]}")
        return self.responder.job_error(request, err, rid)

    def _found(
        self, request: IRequest, job_id: str, name: str, snap: JobSnapshot | None,
        rid: str | None,
    ) -> Any:  # fmt: skip
        snap = self._visible(request, snap)
        if snap is None:
            return self.responder.lookup_error(request, job_id)
        running = snap.state is JobState.RUNNING
        if snap.state is not JobState.DONE and not running:
            return self._not_finished(request, snap, rid)
        files = self.runtime.result_files
        try:
            check_name(name)
        except BadFileName:
            return self._missing(request, name, rid)
        if files is None:
            return self._missing(request, name, rid)
        looked = self.runtime.io_threads(files.lookup, job_id, name)
        if running:  # a preview the run emitted is served; what it has not written is 409
            looked.addCallback(
                lambda f: (
                    self._serve(request, name, f, snap, rid)
                    if f is not None
                    else self._not_finished(request, snap, rid)
                )
            )
        else:
            looked.addCallback(lambda f: self._serve(request, name, f, snap, rid))
        return looked.addErrback(self._unreachable, request, rid)

    def _unreachable(self, failure: Any, request: IRequest, rid: str | None) -> bytes:
        """The store's IO failed (an object store down, a disk error): 503 with
        Retry-After, never a half-made answer (the file's own headers are dropped)."""
        failure.trap(OSError)
        log.warn("result file store: {e}", e=failure.getErrorMessage())
        for header in (b"ETag", b"Content-Range", b"Accept-Ranges"):
            request.responseHeaders.setRawHeaders(header, [])  # none is sent
        err = ApiError(E.NOT_READY, "result file store unavailable", {"Retry-After": "1"})
        return self.responder.job_error(request, err, rid)

    def _not_finished(self, request: IRequest, snap: JobSnapshot, rid: str | None) -> bytes:
        conflict = ApiError(E.JOB_NOT_FINISHED, f"job not finished (state: {snap.state.value})")
        return self.responder.job_error(request, conflict, rid)

    def _max_age(self, snap: JobSnapshot) -> int:
        ttl_ms = self.runtime.config.async_job_ttl
        if ttl_ms <= 0 or snap.completed_unix is None or snap.state is not JobState.DONE:
            return 0
        return max(0, int(snap.completed_unix + ttl_ms / 1000.0 - self._now()))

    def _serve(
        self, request: IRequest, name: str, found: StoredFile | None, snap: JobSnapshot,
        rid: str | None,
    ) -> Any:  # fmt: skip
        if found is None:
            return self._missing(request, name, rid)
        etag = f'"{found.sha256}"'
        set_header = request.setHeader
        set_header(b"ETag", etag.encode("ascii"))
        max_age = self._max_age(snap)
        cache = f"private, max-age={max_age}" if max_age > 0 else "private, no-cache"
        set_header(b"Cache-Control", cache.encode("ascii"))
        set_header(b"X-Request-ID", header_value(rid or self.responder.request_id(request)))
        # never a document of the origin it is served from (the supervisor's UI)
        set_header(b"Content-Security-Policy", b"sandbox")
        set_header(b"X-Content-Type-Options", b"nosniff")
        header = self.responder.header
        none_match = header(request, b"if-none-match")
        if none_match is not None and _etag_matches(none_match.decode("latin-1"), etag):
            request.setResponseCode(304)
            return b""
        size = found.size
        raw_range = header(request, b"range")
        if_range = header(request, b"if-range")
        if if_range is not None and if_range.decode("latin-1").strip() != etag:
            raw_range = None  # the client's copy is another version: send it all
        try:
            part = parse_range(raw_range.decode("latin-1") if raw_range else None, size)
        except Unsatisfiable:
            err = ApiError(E.INVALID_REQUEST, f"range not satisfiable (size {size})",
                           {"Content-Range": f"bytes */{size}"}, status=416)  # fmt: skip
            return self.responder.job_error(request, err, rid)
        start, end = part if part is not None else (0, size - 1)
        length = max(0, end - start + 1)
        if part is not None:
            request.setResponseCode(206)
            set_header(b"Content-Range", f"bytes {start}-{end}/{size}".encode("ascii"))
        else:
            request.setResponseCode(200)
        set_header(b"Content-Type", header_value(found.content_type))
        set_header(b"Accept-Ranges", b"bytes")
        if not inline_type(found.content_type):
            set_header(b"Content-Disposition", b'attachment; filename="%s"' % name.encode("ascii"))
        set_header(b"Content-Length", b"%d" % length)
        if request.method == b"HEAD" or length == 0:
            return b""
        run = self.runtime.io_threads
        opened = run(self.runtime.result_files.open_range, found, start, length)
        return opened.addCallback(lambda source: ThreadedBody(request, source, length, run).start())
