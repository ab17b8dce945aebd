"""The hot routes, dispatched without werkzeug: a root resource in front of Klein.

Klein's per-request work (werkzeug URL matching, environ building, Deferred
plumbing) costs about 40 % of a tiny request's CPU on this reactor; the job API's
hot routes (submit, poll, wait, result, sync infer) are few and fixed, so
:class:`FastRoutes` matches them by hand and calls the *same* handler methods the
Klein app registers. Every other request (probes, metrics, OpenAPI, 404/405) is
delegated to the Klein resource unchanged, so the wire behaviour is one
implementation with two dispatchers; the e2e tests run through this one.

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes as unquote

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET

log = Logger()

Handler = Callable[..., Any]


class FastRoutes(Resource):
    """Root resource: hand-matched hot routes, else the Klein resource."""

    isLeaf = True
    #: Dispatches on ``request.path``; LimitedRequest then skips traversal, and the
    #: Klein fallback gets its ``postpath`` set here (as twisted.web would).
    matches_paths_itself = True

    def __init__(
        self,
        fallback: IResource,
        *,
        infer_path: bytes,
        infer: Handler,
        submit: Handler,
        status: Handler,
        wait: Handler,
        result: Handler,
    ) -> None:
        super().__init__()
        self._fallback = fallback
        self._infer_path = infer_path.rstrip(b"/") or b"/"
        self._infer = infer
        self._submit = submit
        self._status = status
        self._wait = wait
        self._result = result

    def match(self, request: Any) -> tuple[Handler, dict[str, str]] | None:
        """The hot route's (instrumented) handler and its arguments, or None; reads
        only ``request.path`` and ``request.method`` (also used by the llhttp port)."""
        path = request.path.rstrip(b"/") or b"/"
        method = request.method
        if method == b"POST":
            if path == b"/jobs":
                return self._submit, {}
            if path == self._infer_path:
                return self._infer, {}
            return None
        if method != b"GET" or not path.startswith(b"/jobs/"):
            return None
        parts = path[6:].split(b"/")
        if not parts[0] or len(parts) > 2:
            return None
        job_id = parts[0].decode("utf-8", "replace")
        if len(parts) == 1:
            return self._status, {"job_id": job_id}
        if parts[1] == b"wait":
            return self._wait, {"job_id": job_id}
        if parts[1] == b"result":
            return self._result, {"job_id": job_id}
        return None

    def render(self, request: IRequest) -> Any:
        matched = self.match(request)
        if matched is None:
            if not request.postpath:
                request.postpath = [unquote(seg) for seg in request.path[1:].split(b"/")]
            return self._fallback.render(request)
        handler, kwargs = matched
        outcome = handler(request, **kwargs)
        if not isinstance(outcome, Deferred):
            return outcome
        respond_when_fired(request, outcome)
        return NOT_DONE_YET


def respond_when_fired(request: IRequest, outcome: Deferred[bytes]) -> None:
    """Write ``outcome``'s bytes and finish ``request`` when it fires (the render
    method then returns ``NOT_DONE_YET``).

    A client that goes away cancels ``outcome`` (as Klein does), so a parked wait
    leaves its counter and a queued request leaves its queue; an unexpected failure is
    logged and answered 500 with an empty body.
    """
    finished = request.notifyFinish()
    finished.addErrback(lambda _f: outcome.cancel())

    def write(body: bytes) -> None:
        if not finished.called:
            request.write(body)
            request.finish()

    def failed(failure: Any) -> None:
        if failure.check(CancelledError):
            return
        log.failure("unhandled error in {path}", failure, path=request.path)
        if not finished.called:
            request.setResponseCode(500)
            request.setHeader(b"Content-Length", b"0")
            request.finish()

    outcome.addCallbacks(write, failed)
