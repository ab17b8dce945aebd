"""The job API's requests and answers, without IO (sans-IO; shared by both clients).

:class:`Api` builds each request as a :class:`Call` (method, path, body, headers, how
safe it is to repeat) and reads each :class:`Answer` into a value or an exception.
The sync client (:mod:`mortred_client.sync`) and the Twisted client
(:mod:`mortred_client.twisted`) only send calls and sleep between retries.

Three fronts serve the job API (``front``):

* ``"gateway"`` (a ``model`` is given): ``/v1/models/<model>/jobs…``, ``…/infer``;
* ``"model"`` (no model): a model port's ``/jobs…`` and its sync ``server_uri``;
* ``"supervisor"``: the supervisor's operator proxy ``/api/v1/infer`` and
  ``/api/v1/jobs/<model>/…`` (used by ``mortredctl`` without ``--gateway``). It does
  not forward ``Idempotency-Key``, so submits through it are never retried.

A job's own routes are always its ``poll_url`` (``/wait``, ``/result``,
``/events`` below it, ``DELETE`` on it) as the front wrote it: each front rewrites
them to its own paths.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urljoin, urlsplit

from mortred_client._version import __version__
from mortred_client.errors import MortredError, TransportError, decode_body, error_for
from mortred_client.retry import Safety, parse_retry_after
from mortred_client.sse import SseEvent
from mortred_client.types import JobEvent, JobPage, JobStatus, Result, Submitted

FRONTS = ("gateway", "model", "supervisor")
#: The server's cap on one long-poll (ms); longer waits are several calls.
MAX_WAIT_MS = 300_000


@dataclass(frozen=True)
class Call:
    """One HTTP request. ``path`` is a path (+ query) or an absolute URL; ``on_job``
    and ``what`` say which exception an error answer becomes (see
    :func:`~mortred_client.errors.error_for`); ``hold`` is how long the server may
    hold the answer on purpose (a long-poll), added to the read timeout."""

    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    safety: Safety = Safety.REPEATABLE
    on_job: bool = False
    what: str = ""
    hold: float = 0.0


@dataclass(frozen=True)
class Answer:
    """One HTTP answer; header names lower-case."""

    status: int
    headers: Mapping[str, str]
    body: bytes = b""

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise TransportError(
                f"expected JSON, got {self.body[:80]!r}", status=self.status
            ) from None


def resolve_url(base_url: str, path: str) -> str:
    """An absolute URL: ``path`` as is when absolute (``//host/...``, a network-path
    reference, takes the base URL's scheme), else below ``base_url`` (whose path, if
    any, prefixes every client-built path; a server link that already starts with
    that prefix is kept)."""
    if "://" in path:
        return path
    if path.startswith("//"):
        return urljoin(base_url, path)
    base = base_url.rstrip("/")
    prefix = urlsplit(base).path
    if prefix and not path.startswith(prefix + "/"):
        path = prefix + path
    return urljoin(base + "/", path)


#: The only headers sent to a URL on another origin than the base URL's (a link a
#: server returned): none that can carry a credential (``Authorization``, a
#: caller's extra headers).
CROSS_ORIGIN_HEADERS = frozenset(
    {"accept", "user-agent", "content-type", "idempotency-key", "last-event-id"}
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an absolute URL (default ports filled in), or
    None when it has none (a bad port, no host)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme)
    if not parts.hostname or port is None:
        return None
    return scheme, parts.hostname.lower(), port


def for_origin(base_url: str, call: Call) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Where to send ``call`` and with which headers: all of them when its URL is on
    the origin of ``base_url`` (scheme, host and port), else only
    :data:`CROSS_ORIGIN_HEADERS`. Credentials go to the configured origin only, never
    to a server's link (``poll_url``, ``result_url``, ``Location``) that names
    another one, absolute or ``//``-relative."""
    url = resolve_url(base_url, call.path)
    own = origin_of(base_url)
    if own is not None and origin_of(url) == own:
        return url, call.headers
    return url, tuple((k, v) for k, v in call.headers if k.lower() in CROSS_ORIGIN_HEADERS)


def check_base_url(base_url: str) -> str:
    """``base_url`` if it is ``http(s)://host[:port][/prefix]``; ``ValueError``."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url must be http(s)://host[:port], not {base_url!r}")
    return base_url.rstrip("/")


def new_idempotency_key() -> str:
    """A fresh key: 128 random bits (the server accepts 1–255 visible ASCII)."""
    return "mc-" + secrets.token_hex(16)


@dataclass(frozen=True)
class Api:
    """The routes and headers of one front; see the module docstring."""

    front: str = "model"
    model: str | None = None
    token: str | None = None
    infer_path: str | None = None
    user_agent: str = f"mortred-client/{__version__}"
    extra_headers: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.front not in FRONTS:
            raise ValueError(f"front must be one of {FRONTS}, not {self.front!r}")

    # -- headers and paths ------------------------------------------------------------

    def headers(
        self, *extra: tuple[str, str], json_body: bool = False
    ) -> tuple[tuple[str, str], ...]:
        out = [("Accept", "application/json"), ("User-Agent", self.user_agent)]
        if self.token:
            out.append(("Authorization", f"Bearer {self.token}"))
        if json_body:
            out.append(("Content-Type", "application/json; charset=utf-8"))
        return (*out, *self.extra_headers, *extra)

    def _model(self) -> str:
        """The model id, URL-quoted; ``ValueError`` on a gateway or supervisor front
        without one (only a job's own routes, from its poll URL, work there)."""
        if not self.model:
            raise ValueError(f"this needs a model id on a {self.front} front (model=...)")
        return quote(self.model, safe="")

    def _model_prefix(self) -> str:
        return f"/v1/models/{self._model()}"

    def jobs_path(self) -> str:
        """Where jobs are submitted (gateway/model) and listed."""
        if self.front == "gateway":
            return self._model_prefix() + "/jobs"
        if self.front == "supervisor":
            return f"/api/v1/jobs/{self._model()}"
        return "/jobs"

    def job_path(self, job_id: str) -> str:
        """The poll URL of a job known by its id."""
        return f"{self.jobs_path()}/{quote(job_id, safe='')}"

    # -- calls ------------------------------------------------------------------------

    def submit(
        self,
        envelope: dict[str, Any],
        idempotency_key: str | None,
    ) -> Call:
        """``POST`` a job. Repeatable only with a key on a front that forwards it."""
        if self.front == "supervisor":
            self._model()  # checks there is one
            doc = {"server_id": self.model, "async": True, **envelope}
            return Call(
                "POST", "/api/v1/infer", _json_bytes(doc), self.headers(json_body=True),
                Safety.ONCE,
            )  # fmt: skip
        extra = (("Idempotency-Key", idempotency_key),) if idempotency_key else ()
        safety = Safety.REPEATABLE if idempotency_key else Safety.ONCE
        return Call(
            "POST", self.jobs_path(), _json_bytes(envelope),
            self.headers(*extra, json_body=True), safety,
        )  # fmt: skip

    def read_submitted(self, answer: Answer) -> Submitted:
        doc = answer.json()
        replayed = answer.headers.get("idempotent-replayed", "").strip().lower() == "true"
        if not isinstance(doc, dict) or "job_id" not in doc:
            raise MortredError(f"unexpected submit answer: {doc!r:.200}", status=answer.status)
        doc.setdefault("poll_url", self.job_path(doc["job_id"]))
        return Submitted(JobStatus.from_json(doc), replayed)

    def status(self, poll_url: str) -> Call:
        return Call("GET", poll_url, headers=self.headers(), on_job=True)

    def wait(self, poll_url: str, timeout_ms: int) -> Call:
        """One long-poll of at most ``timeout_ms`` (capped at the server's 300 s)."""
        ms = max(0, min(MAX_WAIT_MS, int(timeout_ms)))
        return Call(
            "GET", f"{poll_url}/wait?timeout={ms}", headers=self.headers(), on_job=True,
            hold=ms / 1000.0,
        )  # fmt: skip

    def result(self, poll_url: str, result_url: str | None = None) -> Call:
        path = result_url or f"{poll_url}/result"
        return Call("GET", path, headers=self.headers(), on_job=True, what="result")

    def file(self, url: str) -> Call:
        """``GET`` a result file (its ``url`` from the result: relative to the base
        URL; another origin gets no credential, as every link)."""
        headers = (*tuple(h for h in self.headers() if h[0] != "Accept"), ("Accept", "*/*"))
        return Call("GET", url, headers=headers, on_job=True, what="file")

    def cancel(self, poll_url: str) -> Call:
        """``DELETE`` the job: a cancel is idempotent, so it is repeatable."""
        return Call("DELETE", poll_url, headers=self.headers(), on_job=True, what="cancel")

    def events(self, poll_url: str, last_event_id: str | None) -> Call:
        extra = [("Accept", "text/event-stream")]
        if last_event_id is not None:
            extra.append(("Last-Event-ID", last_event_id))
        headers = tuple(h for h in self.headers() if h[0] != "Accept") + tuple(extra)
        return Call("GET", f"{poll_url}/events", headers=headers, on_job=True)

    def list_page(self, state: str | None, limit: int | None, cursor: str | None) -> Call:
        query = [(k, str(v)) for k, v in (("state", state), ("limit", limit), ("cursor", cursor))
                 if v is not None]  # fmt: skip
        path = self.jobs_path() + (f"?{urlencode(query)}" if query else "")
        return Call("GET", path, headers=self.headers())

    def infer(self, envelope: dict[str, Any], infer_path: str | None = None) -> Call:
        """Sync inference: not repeatable (it runs the model), so retried only on 429."""
        path: str | None = infer_path
        if self.front == "supervisor":
            self._model()  # checks there is one
            doc = {"server_id": self.model, **envelope}
            path = "/api/v1/infer"
        else:
            doc = envelope
            if self.front == "gateway":
                path = self._model_prefix() + "/infer"
            if not path:
                raise ValueError("a model port's sync route is unknown (pass infer_path)")
        return Call("POST", path, _json_bytes(doc), self.headers(json_body=True), Safety.ONCE)

    def queue(self) -> Call:
        """The queue route (``GET /queue``, ``/v1/models/<id>/queue`` at the gateway);
        404/405 mean the server does not have it."""
        if self.front == "supervisor":
            path = f"/api/v1/queue/{self._model()}"
        elif self.front == "gateway":
            path = self._model_prefix() + "/queue"
        else:
            path = "/queue"
        return Call("GET", path, headers=self.headers(), what="optional")

    def openapi(self) -> Call:
        return Call("GET", "/openapi.json", headers=self.headers())

    # -- answers ----------------------------------------------------------------------

    def check(self, call: Call, answer: Answer, now_epoch: float) -> Answer:
        """The answer when it is a success; raises its exception otherwise."""
        if answer.status < 400:
            return answer
        retry_after = parse_retry_after(answer.headers.get("retry-after"), now_epoch)
        raise error_for(
            answer.status, answer.body, answer.headers, on_job=call.on_job, what=call.what,
            retry_after=retry_after,
        )  # fmt: skip


def envelope(
    images: list[str] | None,
    params: Mapping[str, Any] | None = None,
    *,
    req_id: str | None = None,
    webhook: str | None = None,
    webhook_events: list[str] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The request body: ``images`` already base64, sent only when there is one (an
    SDK model takes its inputs by name in ``params``). ``priority`` is sent only when
    given (today's server refuses unknown fields with 422)."""
    doc: dict[str, Any] = {"images": images} if images else {}
    if params:
        doc["params"] = dict(params)
    if req_id is not None:
        doc["req_id"] = req_id
    if webhook is not None:
        doc["webhook"] = webhook
    if webhook_events is not None:
        doc["webhook_events_filter"] = list(webhook_events)
    if priority is not None:
        doc["priority"] = priority
    return doc


def states_param(state: str | Iterable[str] | None) -> str | None:
    """A listing's ``state`` filter: a name, or several joined by commas."""
    if state is None or isinstance(state, str):
        return state
    return ",".join(state)


def read_status(answer: Answer) -> JobStatus:
    doc = answer.json()
    if not isinstance(doc, dict):
        raise MortredError(f"unexpected status answer: {doc!r:.200}", status=answer.status)
    return JobStatus.from_json(doc)


def read_result(answer: Answer) -> Result:
    doc = answer.json()
    if not isinstance(doc, dict):
        raise MortredError(f"unexpected result answer: {doc!r:.200}", status=answer.status)
    return Result.from_json(doc)


def read_page(answer: Answer) -> JobPage:
    doc = answer.json()
    if not isinstance(doc, dict):
        raise MortredError(f"unexpected listing answer: {doc!r:.200}", status=answer.status)
    return JobPage.from_json(doc)


def read_body(answer: Answer) -> Any:
    return decode_body(answer.body)


def find_infer_path(openapi: Any) -> str | None:
    """A model port's sync route from its ``/openapi.json``: the POST path that is not
    ``/jobs``."""
    paths = openapi.get("paths", {}) if isinstance(openapi, dict) else {}
    for path, ops in paths.items():
        if path != "/jobs" and isinstance(ops, dict) and "post" in ops:
            return str(path)
    return None


def _json_bytes(doc: Any) -> bytes:
    # Encoded once per call: a retried submit sends the same bytes, which is what the
    # server's idempotency fingerprint (sha256 of the body) compares.
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


class EventFollow:
    """What a follower of a job's event stream has seen (pure; one per ``events()``).

    Turns SSE events into :class:`JobEvent` s, remembers the ``Last-Event-ID`` to
    send on a reconnect and drops an event that repeats the previous status (a
    reconnect starts again with the current state, which the caller may have seen).
    """

    def __init__(self, last_event_id: str | None = None, *, model_events: bool = False) -> None:
        self.last_event_id = last_event_id
        self.ended = False
        self.model_events = model_events
        self._last_key: tuple[Any, ...] | None = None
        self._last_status: JobStatus | None = None
        self._last_model = 0

    def accept(self, event: SseEvent) -> JobEvent | None:
        """The job event of ``event``, or ``None`` (not a status, or a repeat; a
        model's own event unless ``model_events``)."""
        if event.id is not None and event.id.startswith("m"):  # a model's event (m<n>)
            if not self.model_events or self._last_status is None:
                return None
            try:  # a reopened stream sends the kept ones again: skip those seen
                number = int(event.id[1:])
                data = json.loads(event.data)
            except ValueError:
                return None
            if number <= self._last_model:
                return None
            self._last_model = number
            return JobEvent(event.event, event.id, self._last_status, data, model_event=True)
        try:
            doc = json.loads(event.data)
            status = JobStatus.from_json(doc)
        except (ValueError, KeyError, TypeError):
            return None
        if event.id is not None:  # a status event's id: where a reconnect resumes
            self.last_event_id = event.id
        key = (status.state, status.progress, status.cancel_requested)
        if key == self._last_key:
            return None
        self._last_key = key
        self._last_status = status
        self.ended = status.terminal
        return JobEvent(event.event, event.id, status)
