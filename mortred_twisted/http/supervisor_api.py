"""The supervisor's Klein edge: REST under ``/api/v1/`` and the web UI at ``/``.

Everything but ``GET /api/v1/health`` and the static UI files needs
``Authorization: Bearer <MORTRED_API_TOKEN>`` (401 + WWW-Authenticate otherwise).
Server actions answer 202 at once with the new state; clients follow
``/api/v1/status``. The infer/jobs proxy talks to a model process directly with the
internal token (it is the operator's try-it and jobs-page path, not the public one:
without a principal header a model lists every job) and rewrites job URLs to
``/api/v1/jobs/<id>/<job>``. ``GET /api/v1/jobs/<id>/<job>/events`` is relayed as a
stream by the gateway's relay (:mod:`mortred_twisted.gateway.events`): each event
reaches the browser as the model writes it, and a browser that leaves closes the
model's stream. ``POST /api/v1/autoscale/<id>/wake`` (the API token or the internal
token) is the gateway's cold-start call (:meth:`SupervisorApi.wake`);
``GET /api/v1/children`` (either token) lists each model process and whether it is
trusted (:mod:`mortred_twisted.supervisor.trust`: the gateway sends the internal
token only to those). Reactor thread only.

Served by the project's HTTP/1.1 server (:meth:`SupervisorApi.http_server`), with the
same limits and deadlines as every port; a request that carries a body is judged
from its head (:meth:`SupervisorPort.refuse_head`). Browser hardening, on every
answer: the
:data:`SECURITY_HEADERS` (a Content-Security-Policy that allows no inline script or
style, no framing, ``nosniff``, no referrer), and, when the supervisor runs without
a token, the DNS-rebinding defence: a ``Host`` that is not a loopback name is
answered 421 (:func:`~mortred_twisted.http11.auth.host_refusal`) before any route runs.
"""

from __future__ import annotations

import json
import mimetypes
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from klein import Klein
from prometheus_client import CollectorRegistry
from twisted.internet import defer
from werkzeug.exceptions import MethodNotAllowed

from mortred_twisted.config.catalog import Catalog
from mortred_twisted.gateway.events import relay
from mortred_twisted.gateway.rewrite import rewrite_file_urls, rewrite_urls, supervisor_prefix
from mortred_twisted.http.route_request import (
    RouteRequest,
    match_endpoint,
    route_with_klein,
    settled,
)
from mortred_twisted.http11.auth import (
    WWW_AUTHENTICATE,
    bearer_token,
    host_refusal,
    token_matches,
)
from mortred_twisted.http11.messages import ServerRequest, StreamCut
from mortred_twisted.http11.server import HTTPServerFactory
from mortred_twisted.http11.upstream import UpstreamClient, UpstreamError
from mortred_twisted.http11.upstream_stream import relay_body
from mortred_twisted.supervisor.metrics import render
from mortred_twisted.supervisor.monitor import Supervisor
from mortred_twisted.supervisor.trust import children_document

JSON = b"application/json; charset=utf-8"
STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
_JOB_PART = ("", "/wait", "/result")
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}")
#: a result file's request headers forwarded to the model, and answer headers back
_FILE_REQUEST = (b"range", b"if-none-match", b"if-range")
#: (the model's Content-Security-Policy, a sandbox, replaces the UI's on a file)
_FILE_ANSWER = (b"content-type", b"etag", b"content-range", b"accept-ranges",
                b"cache-control", b"x-request-id", b"content-disposition",
                b"content-security-policy")  # fmt: skip
_LIST_QUERY = (b"state", b"limit", b"cursor")
#: A client's X-Request-ID is echoed only if it is a short visible-ASCII token.
_REQUEST_ID = re.compile(rb"^[\x21-\x7e]{1,128}$")
#: Headers of a model's event-stream answer passed to the browser.
_STREAM_HEADERS = (b"content-type", b"cache-control", b"x-request-id", b"retry-after")

#: The web UI's Content-Security-Policy: scripts, styles, fetches and frames from this
#: origin only, no inline script or style (app.js and style.css are files), images
#: also from ``data:`` (result PNGs) and ``blob:`` (the picked input file), never
#: framed, no ``<base>``, forms posted here only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
#: Sent with every supervisor answer (UI files, JSON, event streams, errors).
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"Content-Security-Policy", CONTENT_SECURITY_POLICY.encode("ascii")),
    (b"X-Frame-Options", b"DENY"),
    (b"X-Content-Type-Options", b"nosniff"),
    (b"Referrer-Policy", b"no-referrer"),
)
#: Status of a request refused by the Host check (the name is not ours to answer).
MISDIRECTED = 421


def _json(request: Any, status: int, doc: Any) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", JSON)
    request.setHeader(b"Cache-Control", b"no-store")
    return json.dumps(doc).encode("utf-8")


class SupervisorApi:
    """Routes of one supervisor; collaborators injected, no global reactor."""

    app = Klein()

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        catalog: Catalog,
        api_token: str,
        registry: CollectorRegistry,
        proxy: UpstreamClient,
        streams: Any = None,
        internal_token: str = "",
        static_dir: Path = STATIC,
    ) -> None:
        """``streams``: what opens a job's event stream on a model
        (:meth:`~mortred_twisted.http11.pool.LeanUpstreamClient.stream`); None
        answers those 501."""
        self.supervisor = supervisor
        self.catalog = catalog
        self.api_token = api_token
        self.registry = registry
        self.proxy = proxy
        self.streams = streams
        self.internal_token = internal_token
        self.static_dir = static_dir.resolve()

    def port(self) -> SupervisorPort:
        """The app the project's HTTP server serves (:class:`SupervisorPort`): every
        answer carries the :data:`SECURITY_HEADERS`, a request whose ``Host`` the
        token policy refuses is answered 421 without reaching a route, and a request
        with a body is judged from its head."""
        return SupervisorPort(self)

    def http_server(self, clock: Any, *, max_body_bytes: int = 16 << 20, **limits: Any) -> Any:
        """:meth:`port` behind an :class:`~mortred_twisted.http11.server.
        HTTPServerFactory` (``limits``: its budgets, caps and deadlines)."""
        return HTTPServerFactory(
            self.port(), clock=clock, max_body_bytes=max_body_bytes,
            server_header=b"mortred-supervisor", **limits,
        )  # fmt: skip

    def _authorized(self, request: Any) -> bool:
        if not self.api_token:
            return True  # only reachable on loopback: the tap refuses otherwise
        return token_matches(bearer_token(request.getHeader(b"authorization")), self.api_token)

    def _deny(self, request: Any) -> bytes:
        request.setHeader(b"WWW-Authenticate", WWW_AUTHENTICATE.encode())
        return _json(request, 401, {"error": "unauthorized"})

    # -- public -----------------------------------------------------------------------

    @app.route("/api/v1/health", methods=["GET"])
    def health(self, request: Any) -> bytes:
        return _json(request, 200, {"status": "ok"})

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: Any) -> bytes:
        """The liveness path every port answers (gateway, models, supervisor)."""
        request.setHeader(b"Content-Type", JSON)
        request.setHeader(b"Cache-Control", b"no-store")
        return b'{"status":"ok"}'

    @app.route("/", methods=["GET"])
    def index(self, request: Any) -> bytes:
        return self._static(request, "index.html")

    @app.route("/ui/<path:name>", methods=["GET"])
    def static(self, request: Any, name: str) -> bytes:
        return self._static(request, name)

    def _static(self, request: Any, name: str) -> bytes:
        path = (self.static_dir / name).resolve()
        if not path.is_relative_to(self.static_dir) or not path.is_file():
            return _json(request, 404, {"error": f"not found: {name}"})
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        request.setHeader(b"Content-Type", ctype.encode())
        request.setHeader(b"Cache-Control", b"no-cache")
        return path.read_bytes()

    # -- management ---------------------------------------------------------------------

    @app.route("/api/v1/catalog", methods=["GET"])
    def catalog_view(self, request: Any) -> bytes:
        if not self._authorized(request):
            return self._deny(request)
        return _json(request, 200, {"servers": [e.to_json() for e in self.catalog.values()]})

    @app.route("/api/v1/status", methods=["GET"])
    def status(self, request: Any) -> bytes:
        if not self._authorized(request):
            return self._deny(request)
        return _json(request, 200, {"servers": self.supervisor.status()})

    @app.route("/api/v1/servers/<server_id>", methods=["GET"])
    def server(self, request: Any, server_id: str) -> bytes:
        if not self._authorized(request):
            return self._deny(request)
        s = self.supervisor.get(server_id)
        if s is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        doc = s.status()
        scaler = self.supervisor.scalers.get(server_id)
        if scaler is not None:
            doc["autoscale"] = scaler.status()
        entry = self.catalog.get(server_id)
        if entry is not None:
            doc["catalog"] = entry.to_json()
        return _json(request, 200, doc)

    @app.route("/api/v1/servers/<server_id>/<action>", methods=["POST"])
    def action(self, request: Any, server_id: str, action: str) -> bytes:
        if not self._authorized(request):
            return self._deny(request)
        s = self.supervisor.get(server_id)
        if s is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        if action not in ("start", "stop", "restart"):
            return _json(request, 404, {"error": f"unknown action: {action}"})
        if self.supervisor.closing:
            return _json(request, 503, {"error": "supervisor is shutting down"})
        d = getattr(s, action)()
        d.addErrback(lambda f: None)  # outcomes are visible in status and logs
        return _json(request, 202, {"id": server_id, "action": action, **s.status()})

    @app.route("/api/v1/autoscale/<server_id>/wake", methods=["POST"])
    def wake(self, request: Any, server_id: str) -> Any:
        """A gateway holds a request for an autoscaled id with no replica up: start
        one (the scaler counts the waiting request) and answer once one is ready
        (200, ``url``), or 503 with ``Retry-After`` (the measured start-up time)
        after ``cold_start_timeout_s``. The API token or the internal token (the
        gateway's) is accepted; the request carries no body."""
        if not (self._authorized(request) or self._internal(request)):
            return self._deny(request)
        scaler = self.supervisor.scalers.get(server_id)
        if scaler is None:
            return _json(request, 404, {"error": f"not an autoscaled model: {server_id}"})
        if self.supervisor.closing or not scaler.group.wanted:
            why = (
                "shutting down"
                if self.supervisor.closing
                else "not started (autostart off, or stopped by an operator)"
            )
            return self._cold_refusal(request, scaler, f"{server_id}: {why}")

        def answer(url: str | None) -> bytes:
            if url is None:
                return self._cold_refusal(request, scaler, f"{server_id}: no replica ready yet")
            return _json(request, 200, {"id": server_id, "url": url, **scaler.status()})

        return scaler.wake().addCallback(answer)

    @app.route("/api/v1/children", methods=["GET"])
    def children(self, request: Any) -> bytes:
        """Each model process: its origin, pid, state and whether it is trusted (ready
        and proven to be the spawn it claims: the gateway sends the internal token
        only to those, :mod:`~mortred_twisted.supervisor.trust`). The API token or
        the internal token."""
        if not (self._authorized(request) or self._internal(request)):
            return self._deny(request)
        return _json(request, 200, children_document(self.supervisor.model_children()))

    def _internal(self, request: Any) -> bool:
        token = bearer_token(request.getHeader(b"authorization"))
        return bool(self.internal_token) and token_matches(token, self.internal_token)

    @staticmethod
    def _cold_refusal(request: Any, scaler: Any, message: str) -> bytes:
        retry = scaler.retry_after_s()
        request.setHeader(b"Retry-After", str(retry).encode("ascii"))
        return _json(request, 503, {"error": message, "retry_after_s": retry})

    @app.route("/api/v1/servers/<server_id>/logs", methods=["GET"])
    def logs(self, request: Any, server_id: str) -> bytes:
        if not self._authorized(request):
            return self._deny(request)
        s = self.supervisor.get(server_id)
        if s is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        try:
            raw_offset = request.args.get(b"offset", [b""])[0]
            offset = int(raw_offset) if raw_offset else None
            limit = min(5000, int(request.args.get(b"limit", [b"200"])[0]))
        except ValueError:
            return _json(request, 400, {"error": "offset and limit must be integers"})
        return _json(request, 200, {"id": server_id, **s.logs.read(offset, limit).to_json()})

    @app.route("/api/v1/metrics", methods=["GET"])
    def metrics(self, request: Any) -> bytes:
        if not self._authorized(request):
            return self._deny(request)
        request.setHeader(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8")
        return render(self.registry)

    # -- try-it proxy -------------------------------------------------------------------

    @app.route("/api/v1/infer", methods=["POST"])
    def infer(self, request: Any) -> Any:
        """``{"server_id", "async"?: bool, images, params?, req_id?}`` → the model's
        sync route, or its ``/jobs`` when ``async`` is true. A ``multipart/form-data``
        body (an SDK model's inputs as parts) names them in the query instead
        (``?server_id=ID&async=1``) and is passed on as it is, with its Content-Type
        (the model decides: a built-in family answers 415)."""
        if not self._authorized(request):
            return self._deny(request)
        content_type = request.getHeader(b"content-type") or b""
        if _is_form(content_type):
            return self._infer_form(request, content_type)
        try:
            doc = json.loads(request.content.read() or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("expected a JSON object")
        except ValueError as exc:
            return _json(request, 400, {"error": f"invalid JSON: {exc}"})
        server_id = doc.pop("server_id", None)
        use_async = bool(doc.pop("async", False))
        entry = self.catalog.get(server_id) if isinstance(server_id, str) else None
        if entry is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        path = "/jobs" if use_async else entry.server_uri
        body = json.dumps(doc).encode("utf-8")
        return defer.Deferred.fromCoroutine(
            self._proxy(request, "POST", entry.base_url + path, server_id, body)
        )

    def _infer_form(self, request: Any, content_type: bytes) -> Any:
        server_id = request.args.get(b"server_id", [b""])[0].decode("utf-8", "replace")
        use_async = request.args.get(b"async", [b""])[0].lower() in (b"1", b"true")
        entry = self.catalog.get(server_id)
        if entry is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        path = "/jobs" if use_async else entry.server_uri
        body = request.content.read()
        return defer.Deferred.fromCoroutine(
            self._proxy(request, "POST", entry.base_url + path, server_id, body, content_type)
        )

    @app.route("/api/v1/models/<server_id>/openapi.json", methods=["GET"])
    def model_openapi(self, request: Any, server_id: str) -> Any:
        """The model's ``GET /openapi.json`` as it is (its declared inputs and outputs:
        what the try-it panel builds its form from)."""
        if not self._authorized(request):
            return self._deny(request)
        entry = self.catalog.get(server_id)
        if entry is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        url = f"{entry.base_url}/openapi.json"
        return defer.Deferred.fromCoroutine(self._openapi(request, url, server_id))

    async def _openapi(self, request: Any, url: str, server_id: str) -> bytes:
        try:
            response = await self.proxy.request("GET", url, {}, None)
        except UpstreamError as e:
            return _json(request, e.status, {"error": f"{server_id}: {e.message}"})
        request.setResponseCode(response.code)
        request.setHeader(b"Content-Type", JSON)
        request.setHeader(b"Cache-Control", b"no-store")
        return bytes(response.body)

    @app.route("/api/v1/jobs/<server_id>", methods=["GET"])
    def jobs(self, request: Any, server_id: str) -> Any:
        """The model's ``GET /jobs`` (newest first; ``state``, ``limit``, ``cursor``)."""
        if not self._authorized(request):
            return self._deny(request)
        entry = self.catalog.get(server_id)
        if entry is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        query = urlencode([(k, v) for k in _LIST_QUERY for v in request.args.get(k, [])])
        url = f"{entry.base_url}/jobs" + (f"?{query}" if query else "")
        return defer.Deferred.fromCoroutine(self._proxy(request, "GET", url, server_id, None))

    @app.route("/api/v1/queue/<server_id>", methods=["GET"])
    def queue(self, request: Any, server_id: str) -> Any:
        """The model's ``GET /queue`` (depth, running, oldest wait, every caller: the
        supervisor sends no principal, so it sees every job)."""
        if not self._authorized(request):
            return self._deny(request)
        entry = self.catalog.get(server_id)
        if entry is None:
            return _json(request, 404, {"error": f"unknown server: {server_id}"})
        url = f"{entry.base_url}/queue"
        return defer.Deferred.fromCoroutine(self._proxy(request, "GET", url, server_id, None))

    @app.route("/api/v1/jobs/<server_id>/<job>", methods=["GET"])
    def job(self, request: Any, server_id: str, job: str) -> Any:
        return self._job(request, server_id, job, "")

    @app.route("/api/v1/jobs/<server_id>/<job>", methods=["DELETE"])
    def cancel_job(self, request: Any, server_id: str, job: str) -> Any:
        """The model's ``DELETE /jobs/{job}``: 200 cancelled, 202 cancel requested."""
        return self._job(request, server_id, job, "", method="DELETE")

    @app.route("/api/v1/jobs/<server_id>/<job>/<part>", methods=["GET"])
    def job_part(self, request: Any, server_id: str, job: str, part: str) -> Any:
        if part == "events":
            return self._events(request, server_id, job)
        return self._job(request, server_id, job, "/" + part)

    @app.route("/api/v1/jobs/<server_id>/<job>/files/<name>", methods=["GET"])
    def job_file(self, request: Any, server_id: str, job: str, name: str) -> Any:
        """The model's ``/jobs/{job}/files/{name}`` (its bytes and headers as they
        are: ranges, ETag, 304)."""
        if not self._authorized(request):
            return self._deny(request)
        entry = self.catalog.get(server_id)
        if entry is None or not _JOB_ID.fullmatch(job) or not _FILE_NAME.fullmatch(name):
            return _json(request, 404, {"error": "not found"})
        url = f"{entry.base_url}/jobs/{job}/files/{name}"
        return defer.Deferred.fromCoroutine(self._file(request, url, server_id))

    async def _file(self, request: Any, url: str, server_id: str) -> bytes:
        headers: dict[bytes, list[bytes]] = {}
        for name in _FILE_REQUEST:
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers[name] = values[:1]
        if self.internal_token:
            headers[b"authorization"] = [b"Bearer " + self.internal_token.encode()]
        if self.streams is not None:
            return await self._file_stream(request, url, server_id, headers)
        try:
            response = await self.proxy.request("GET", url, headers, None)
        except UpstreamError as e:
            return _json(request, e.status, {"error": f"{server_id}: {e.message}"})
        request.setResponseCode(response.code)
        for name in _FILE_ANSWER:
            values = response.headers.getRawHeaders(name)
            if values and values != [b""]:
                request.responseHeaders.setRawHeaders(name, values)
        return response.body

    async def _file_stream(
        self, request: Any, url: str, server_id: str, headers: dict[bytes, list[bytes]]
    ) -> bytes:
        """A result file relayed as it comes (:func:`~mortred_twisted.http11.
        upstream_stream.relay_body`: at the browser's pace, framed by the model's
        ``Content-Length``, never held whole); an answer other than 200/206 (304, an
        error) is read whole. A model that breaks off cuts the browser's answer."""
        try:
            stream = await self.streams.stream("GET", url, headers)
        except UpstreamError as e:
            return _json(request, e.status, {"error": f"{server_id}: {e.message}"})
        request.setResponseCode(stream.code)
        for name in _FILE_ANSWER:
            values = stream.headers.getRawHeaders(name)
            if values and values != [b""]:
                request.responseHeaders.setRawHeaders(name, values)
        try:
            if stream.code not in (200, 206):
                return await stream.read_all()
            return await relay_body(stream, request)
        except UpstreamError as e:
            if request.started:  # the browser sees its answer cut
                raise StreamCut(e.message) from e
            return _json(request, e.status, {"error": f"{server_id}: {e.message}"})

    def _job(self, request: Any, server_id: str, job: str, part: str, method: str = "GET") -> Any:
        if not self._authorized(request):
            return self._deny(request)
        entry = self.catalog.get(server_id)
        if entry is None or part not in _JOB_PART or not _JOB_ID.fullmatch(job):
            return _json(request, 404, {"error": "not found"})
        query = request.uri.partition(b"?")[2].decode("latin-1")
        if not query.isascii():
            return _json(request, 400, {"error": "query must be ASCII"})
        url = f"{entry.base_url}/jobs/{job}{part}" + (f"?{query}" if query else "")
        return defer.Deferred.fromCoroutine(self._proxy(request, method, url, server_id, None))

    def _events(self, request: Any, server_id: str, job: str) -> Any:
        """``text/event-stream`` of the model's ``/jobs/{job}/events``, relayed live by
        the gateway's relay (:func:`~mortred_twisted.gateway.events.relay`: records as
        they come, job URLs under ``/api/v1/jobs/<id>/``, paused while the browser
        does not read, the model's stream closed when the browser leaves)."""
        if not self._authorized(request):
            return self._deny(request)
        entry = self.catalog.get(server_id)
        if entry is None or not _JOB_ID.fullmatch(job):
            return _json(request, 404, {"error": "not found"})
        if self.streams is None:
            return _json(request, 501, {"error": "event streams are not configured"})
        headers = {b"accept": [b"text/event-stream"]}
        if self.internal_token:
            headers[b"authorization"] = [b"Bearer " + self.internal_token.encode()]
        url = f"{entry.base_url}/jobs/{job}/events"

        def head(stream: Any) -> Any:
            request.setResponseCode(stream.code)
            for name in _STREAM_HEADERS:
                values = stream.headers.getRawHeaders(name)
                if values:
                    request.responseHeaders.setRawHeaders(name, values)
            return relay(stream, request, supervisor_prefix(server_id))

        def failed(failure: Any) -> bytes:
            failure.trap(UpstreamError)
            e = failure.value
            if request.started:  # the stream broke off: the browser sees it cut
                raise StreamCut(e.message)
            return _json(request, e.status, {"error": f"{server_id}: {e.message}"})

        d = self.streams.stream("GET", url, headers)
        return d.addCallback(head).addErrback(failed)

    async def _proxy(
        self,
        request: Any,
        method: str,
        url: str,
        server_id: str,
        body: bytes | None,
        content_type: bytes = b"application/json",
    ) -> bytes:
        headers: dict[bytes, list[bytes]] = {b"content-type": [content_type]}
        if self.internal_token:
            headers[b"authorization"] = [b"Bearer " + self.internal_token.encode()]
        try:
            response = await self.proxy.request(method, url, headers, body)
        except UpstreamError as e:
            return _json(request, e.status, {"error": f"{server_id}: {e.message}"})
        request.setResponseCode(response.code)
        for name in (b"content-type", b"retry-after", b"x-request-id"):
            values = response.headers.getRawHeaders(name)
            if values and values != [b""]:
                request.responseHeaders.setRawHeaders(name, values)
        prefix = supervisor_prefix(server_id)
        return rewrite_file_urls(rewrite_urls(response.body, prefix), prefix)


class SupervisorPort:
    """``dispatch`` (and ``refuse_head``) of the supervisor for the project's HTTP
    server: the security headers and the Host check on every request, then the Klein
    table's route (JSON 404/405 of its own). Reactor thread only."""

    def __init__(self, api: SupervisorApi) -> None:
        self.api = api
        self._klein = api.app  # bound to the instance: its map and endpoints
        self._token_configured = bool(api.api_token)

    def _guard(self, request: Any) -> bytes | None:
        for name, value in SECURITY_HEADERS:
            request.setHeader(name, value)
        rid = request.getHeader(b"x-request-id")  # echoed when sane, as every port does
        if not rid or not _REQUEST_ID.match(rid):
            rid = uuid.uuid4().hex.encode("ascii")
        request.setHeader(b"X-Request-ID", rid)
        refusal = host_refusal(request.getHeader(b"host"), token_configured=self._token_configured)
        if refusal is not None:
            return _json(request, MISDIRECTED, {"error": refusal})
        return None

    def refuse_head(self, proxy: ServerRequest, length: int) -> bytes | None:
        """Before a body byte is read: 421 (Host), 404/405 (no such route or method),
        401 (every route that takes a body needs the token), 413 (a GET, HEAD or
        DELETE route: none takes a body), 415 (the try-it proxy takes JSON or
        ``multipart/form-data``)."""
        refused = self._guard(proxy)
        if refused is not None:
            return refused
        endpoint = match_endpoint(self._klein, proxy.method, proxy.path)
        if isinstance(endpoint, MethodNotAllowed):
            return _method_not_allowed(proxy, endpoint)
        if isinstance(endpoint, Exception):
            return _json(proxy, 404, {"error": "not found"})
        if not self.api._authorized(proxy):
            return self.api._deny(proxy)
        if proxy.method in (b"GET", b"HEAD", b"DELETE"):  # routes that take no body
            return _json(proxy, 413, {"error": "this route takes no request body"})
        content_type = proxy.getHeader(b"content-type") or b""
        if endpoint == "infer" and not (
            content_type.lower().startswith(b"application/json") or _is_form(content_type)
        ):
            return _json(
                proxy, 415,
                {"error": "content type must be application/json or multipart/form-data"},
            )  # fmt: skip
        return None

    def dispatch(self, proxy: ServerRequest) -> Any:
        request = RouteRequest(proxy)
        refused = self._guard(request)
        if refused is not None:
            return refused
        outcome = route_with_klein(
            self._klein,
            request,
            not_found=lambda r, _f: _json(r, 404, {"error": "not found"}),
            method_not_allowed=lambda r, f: _method_not_allowed(r, f.value),
        )
        return settled(request, outcome)


def _is_form(content_type: bytes) -> bool:
    """A ``multipart/form-data`` Content-Type (the try-it form's SDK submits)."""
    return content_type.split(b";", 1)[0].strip().lower() == b"multipart/form-data"


def _method_not_allowed(request: Any, exc: Any) -> bytes:
    allow = ", ".join(sorted(exc.valid_methods or []))
    request.setHeader(b"Allow", allow.encode("ascii"))
    return _json(request, 405, {"error": "method not allowed"})
