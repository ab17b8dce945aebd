"""The sync client's request loop on a scripted transport: which outcomes are
retried, how long it waits (injected sleep and clock, no real waits), what errors
it raises, and that a retried submit resends the same key and the same bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

import pytest
from mortred_client import (
    Client,
    InvalidRequest,
    JobAlreadyFinished,
    JobFailed,
    JobNotFound,
    NotSupported,
    QueueFull,
    RetryPolicy,
    ServerError,
    TransportError,
    Unauthorized,
)
from mortred_client.protocol import Answer, Call

Outcome = Answer | BaseException


class Scripted:
    """A transport answering from a script; records every call."""

    def __init__(self, *outcomes: Outcome | Callable[[Call], Outcome]) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[Call] = []

    def url(self, path: str) -> str:
        return "http://test" + path

    def send(self, call: Call, timeout: float) -> Answer:
        self.calls.append(call)
        outcome = self.outcomes.pop(0)
        if callable(outcome) and not isinstance(outcome, Answer | BaseException):
            outcome = outcome(call)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def answer(status: int, doc: Any = None, **headers: str) -> Answer:
    body = json.dumps(doc).encode() if doc is not None else b""
    return Answer(status, {k.replace("_", "-").lower(): v for k, v in headers.items()}, body)


class Clock:
    """Monotonic and wall time that move only when the client sleeps."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def client(transport: Scripted, clock: Clock, **kw: Any) -> Client:
    return Client(
        "http://test", "tok", model="M", transport=transport, clock=lambda: clock.now,  # type: ignore[arg-type]
        wall=lambda: clock.now, sleep=clock.sleep, rng=lambda: 0.0, **kw,
    )  # fmt: skip


ADMITTED = {"job_id": "job_1", "state": "pending", "poll_url": "/v1/models/M/jobs/job_1"}
STATUS = {"job_id": "job_1", "state": "running", "progress": {"step": 1, "total": 4}}


def test_503_with_retry_after_seconds_waits_that_long_then_succeeds() -> None:
    """A 503 with Retry-After: 2 is retried after exactly 2 s (injected sleep)."""
    clock = Clock()
    t = Scripted(answer(503, {"error": "not ready"}, retry_after="2"), answer(200, STATUS))
    status = client(t, clock).job("job_1").status()
    assert status.state == "running" and status.progress is not None
    assert clock.slept == [2.0] and len(t.calls) == 2


def test_429_with_an_http_date_waits_until_it() -> None:
    """Retry-After as an HTTP date is waited for relative to the injected wall clock."""
    clock = Clock()
    when = formatdate(clock.now + 3, usegmt=True)
    t = Scripted(answer(429, {"error": "busy"}, retry_after=when), answer(200, STATUS))
    client(t, clock).job("job_1").status()
    assert clock.slept == [pytest.approx(3.0, abs=1.0)]


def test_connection_errors_back_off_exponentially_until_max_attempts() -> None:
    """Connection resets on a GET are retried with growing waits, then raised as
    TransportError."""
    clock = Clock()
    t = Scripted(*(ConnectionResetError("reset") for _ in range(4)))
    c = client(t, clock, retry=RetryPolicy(max_attempts=4, base=0.1))
    with pytest.raises(TransportError, match="reset"):
        c.job("job_1").status()
    assert clock.slept == [0.05, 0.1, 0.2] and len(t.calls) == 4


def test_deadline_bounds_the_whole_call() -> None:
    """A Retry-After that would end past the deadline is not waited for: the 503 is
    raised at once as ServerError."""
    clock = Clock()
    t = Scripted(answer(503, {"error": "down"}, retry_after="30"))
    with pytest.raises(ServerError) as e:
        client(t, clock, retry=RetryPolicy(deadline=10.0)).job("job_1").status()
    assert clock.slept == [] and e.value.status == 503 and e.value.message == "down"


def test_submit_retried_with_the_same_key_and_bytes_after_a_lost_answer() -> None:
    """A submit whose connection broke is resent with the same Idempotency-Key and the
    same body; the replayed answer is the first job."""
    clock = Clock()
    t = Scripted(
        ConnectionResetError("answer lost"),
        answer(202, ADMITTED, idempotent_replayed="true"),
    )
    job = client(t, clock).submit([b"img"], {"steps": 2})
    assert job.job_id == "job_1" and job.replayed
    first, second = t.calls
    assert first.body == second.body and first.headers == second.headers
    keys = [v for k, v in first.headers if k == "Idempotency-Key"]
    assert len(keys) == 1 and keys[0].startswith("mc-")
    assert json.loads(first.body or b"") == {"images": ["aW1n"], "params": {"steps": 2}}


def test_supervisor_submit_is_never_retried_after_sending() -> None:
    """The supervisor does not forward Idempotency-Key: a submit through it that lost
    its answer is not repeated."""
    clock = Clock()
    t = Scripted(ConnectionResetError("answer lost"))
    c = Client("http://test", model="M", front="supervisor", transport=t, sleep=clock.sleep)  # type: ignore[arg-type]
    with pytest.raises(TransportError):
        c.submit([b"img"])
    assert len(t.calls) == 1 and t.calls[0].path == "/api/v1/infer"
    assert json.loads(t.calls[0].body or b"")["async"] is True


def test_infer_retries_429_and_refused_only() -> None:
    """Sync inference runs the model: a 429 or a refused connection is retried, a
    503 or a reset is not."""
    clock = Clock()
    ok = answer(200, {"req_id": "r", "code": 0, "msg": "success", "data": {"x": 1}})
    t = Scripted(ConnectionRefusedError(), answer(429, {"code": 429, "msg": "busy"}), ok)
    assert client(t, clock).infer([b"i"]).data == {"x": 1}
    assert [c.path for c in t.calls] == ["/v1/models/M/infer"] * 3
    t = Scripted(answer(503, {"code": 65, "msg": "not ready"}, retry_after="1"))
    with pytest.raises(ServerError) as e:
        client(t, clock).infer([b"i"])
    assert e.value.code == 65
    t = Scripted(ConnectionResetError())
    with pytest.raises(TransportError):
        client(t, clock).infer([b"i"])


def test_error_classes_carry_status_code_and_message() -> None:
    """Each error status becomes its class with the server's status, code, message."""
    clock = Clock()
    cases = [
        (answer(401, {"error": "unauthorized"}), Unauthorized),
        (answer(404, {"error": "job not found: job_1", "code": 63}), JobNotFound),
        (answer(422, {"error": "invalid request: params.x", "code": 52}), InvalidRequest),
    ]
    for reply, cls in cases:
        with pytest.raises(cls) as e:
            client(Scripted(reply), clock).job("job_1").status()
        assert e.value.status == reply.status
    with pytest.raises(JobAlreadyFinished):
        client(Scripted(answer(409, {"error": "job already finished"})), clock).job("j").cancel()
    full = Scripted(*(answer(429, {"error": "async queue full (max 8)"}, retry_after="1"),) * 6)
    with pytest.raises(QueueFull) as q:
        client(full, clock).submit([b"i"])
    assert q.value.retry_after == 1.0 and "queue full" in str(q.value)


def test_result_of_a_failed_job_raises_job_failed_with_its_error() -> None:
    """/result's 409 on a failed job becomes JobFailed carrying the job's error."""
    clock = Clock()
    failed = {"job_id": "job_1", "state": "failed", "error": "model error: boom"}
    t = Scripted(answer(409, {"error": "job not finished (state: failed)", "code": 64}),
                 answer(200, failed))  # fmt: skip
    with pytest.raises(JobFailed) as e:
        client(t, clock).job("job_1").result()
    assert e.value.state == "failed" and e.value.error == "model error: boom"


def test_wait_reissues_the_long_poll_until_terminal() -> None:
    """wait() re-asks the server's long-poll while the job runs and returns the
    terminal status."""
    clock = Clock()
    t = Scripted(answer(200, STATUS), answer(200, STATUS),
                 answer(200, {**STATUS, "state": "done"}))  # fmt: skip
    job = client(t, clock).job("job_1")
    assert job.wait().state == "done" and job.state == "done"
    assert [c.path for c in t.calls] == ["/v1/models/M/jobs/job_1/wait?timeout=30000"] * 3


def test_listing_follows_every_cursor() -> None:
    """jobs() yields the jobs of every page, following next_cursor to the end."""
    clock = Clock()
    page = lambda ids, cur: answer(200, {"jobs": [{"job_id": i, "state": "done"} for i in ids],  # noqa: E731
                                         "next_cursor": cur})  # fmt: skip
    t = Scripted(page(["a", "b"], "c1"), page(["c"], "c2"), page([], None))
    assert [j.job_id for j in client(t, clock).jobs(["done", "failed"], page_size=2)] == list("abc")
    assert [c.path for c in t.calls] == [
        "/v1/models/M/jobs?state=done%2Cfailed&limit=2",
        "/v1/models/M/jobs?state=done%2Cfailed&limit=2&cursor=c1",
        "/v1/models/M/jobs?state=done%2Cfailed&limit=2&cursor=c2",
    ]


def test_queue_404_or_405_is_not_supported() -> None:
    """A server without the queue route answers 404/405: NotSupported."""
    for status in (404, 405):
        with pytest.raises(NotSupported):
            client(Scripted(answer(status, {"error": "not found"})), Clock()).queue()


def test_queue_position_is_none_after_submit_until_a_status_names_it() -> None:
    """The 202 names no queue position (docs/client.md said 1): None until a status
    reports it; a 202 that did report one would fill it."""
    clock = Clock()
    pending = {**ADMITTED, "elapsed_ms": 3, "queue_position": 2}
    t = Scripted(answer(202, ADMITTED), answer(200, pending),
                 answer(202, {**ADMITTED, "queue_position": 4}))  # fmt: skip
    c = client(t, clock)
    job = c.submit(params={})
    assert job.state == "pending" and job.queue_position is None
    assert job.status().queue_position == 2 and job.queue_position == 2
    assert c.submit(params={}).queue_position == 4
