"""The Twisted client's request loop on task.Clock with a scripted HTTP client: the
waits happen on the injected clock (no real time passes), Twisted's failures are
classified like the sync client's, and a keyed submit is resent as is."""

from __future__ import annotations

import json
from typing import Any

from mortred_client import QueueFull, TransportError
from mortred_client._twisted_io import as_os_error
from mortred_client.twisted import TwistedClient
from twisted.internet import defer, error, task
from twisted.web.client import ResponseNeverReceived
from twisted.web.http_headers import Headers


class Response:
    def __init__(self, code: int, doc: Any, **headers: str) -> None:
        self.code = code
        self.headers = Headers({k.replace("_", "-"): [v] for k, v in headers.items()})
        self._body = json.dumps(doc).encode()

    def content(self) -> defer.Deferred[bytes]:
        return defer.succeed(self._body)


class ScriptedHttp:
    """Answers each request with the next outcome (a Response or an exception)."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[tuple[str, str, Any, Any]] = []

    def request(self, method: str, url: str, **kw: Any) -> defer.Deferred[Any]:
        self.requests.append((method, url, kw["headers"], kw["data"]))
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            return defer.fail(outcome)
        return defer.succeed(outcome)


def make(http: ScriptedHttp, clock: task.Clock) -> TwistedClient:
    return TwistedClient(
        "http://test", "tok", model="M", reactor=clock, http=http,  # type: ignore[arg-type]
        wall=lambda: 1_000.0 + clock.seconds(), rng=lambda: 0.0,
    )  # fmt: skip


STATUS = {"job_id": "job_1", "state": "running", "poll_url": "/v1/models/M/jobs/job_1"}


def test_retry_after_is_waited_on_the_clock() -> None:
    """A 503 with Retry-After: 2 fires the retry only after the clock moved 2 s."""
    clock = task.Clock()
    http = ScriptedHttp(Response(503, {"error": "busy"}, retry_after="2"), Response(200, STATUS))
    d = make(http, clock).job("job_1").status()
    assert not d.called and len(http.requests) == 1
    clock.advance(1.9)
    assert not d.called
    clock.advance(0.1)
    assert d.called and len(http.requests) == 2
    assert d.result.state == "running"


def test_twisted_failures_are_retried_like_os_errors() -> None:
    """A refused connection and a response never received are retried for a GET with
    the backoff (0.05, then 0.1 s at rng 0)."""
    clock = task.Clock()
    http = ScriptedHttp(
        error.ConnectionRefusedError(), ResponseNeverReceived([]), Response(200, STATUS)
    )
    d = make(http, clock).job("job_1").status()
    clock.advance(0.05)
    assert len(http.requests) == 2 and not d.called
    clock.advance(0.1)
    assert d.called and d.result.job_id == "job_1"


def test_keyed_submit_is_resent_unchanged() -> None:
    """A submit whose answer never came is resent with the same key and body."""
    clock = task.Clock()
    admitted = Response(202, STATUS, idempotent_replayed="true")
    http = ScriptedHttp(ResponseNeverReceived([]), admitted)
    d = make(http, clock).submit([b"img"])
    clock.advance(1)
    job = d.result
    assert job.replayed and job.job_id == "job_1"
    (m1, u1, h1, b1), (m2, u2, h2, b2) = http.requests
    assert (m1, u1, b1) == (m2, u2, b2) == ("POST", "http://test/v1/models/M/jobs", b1)
    assert h1.getRawHeaders(b"idempotency-key") == h2.getRawHeaders(b"idempotency-key")


def failure_of(d: defer.Deferred[Any]) -> BaseException:
    """The exception a fired, failed Deferred holds (consumed: nothing unhandled)."""
    failures: list[Any] = []
    d.addErrback(failures.append)
    assert failures, "the Deferred has not failed"
    return failures[0].value


def test_give_up_raises_the_last_error() -> None:
    """Retries spent: a 429 becomes QueueFull, a connection failure TransportError."""
    clock = task.Clock()
    full = [Response(429, {"error": "queue full"}, retry_after="1") for _ in range(6)]
    d = make(ScriptedHttp(*full), clock).job("job_1").status()
    clock.pump([1.0] * 6)
    err = failure_of(d)
    assert isinstance(err, QueueFull) and err.retry_after == 1.0
    d2 = make(ScriptedHttp(*[error.ConnectionLost()] * 6), clock).job("job_1").status()
    clock.pump([5.0] * 6)
    assert isinstance(failure_of(d2), TransportError)


def test_failure_classification() -> None:
    """Twisted's transport failures map to OSErrors; anything else is not one."""
    assert isinstance(as_os_error(error.ConnectionRefusedError()), ConnectionRefusedError)
    assert isinstance(as_os_error(defer.CancelledError()), TimeoutError)
    assert isinstance(as_os_error(error.ConnectionLost()), ConnectionError)
    assert as_os_error(ValueError("bug")) is None
