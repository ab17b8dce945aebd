"""Every terminal transition sends its ``completed`` webhook once and counts once in
``mortred_async_jobs_total``, wherever it happens: in the runner, in the store's
upkeep (a pending job past ``async_timeout``, a lost replica's job), or at claim (a
flagged job handed back). Run on both stores through a whole :class:`ModelRuntime`
(the memory store's timeout is the runner's; Redis ends these jobs inside scripts).

Redis runs on a free loopback port (tests/support/redis_server.py); each test has
its own model id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import deferLater

from mortred_twisted.config.server import build_server_config
from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.store import settle
from mortred_twisted.model_api.base import InferenceRequest
from mortred_twisted.runtime.model_runtime import ModelRuntime
from mortred_twisted.stores.redis_scripts import job_key, key_prefix
from tests.fakes.threads import HandThreads
from tests.stores.test_store_contract import redis_store
from tests.support.redis_server import RedisServer, redis_server

HOOK = "http://127.0.0.1:9/hook"
REQ = InferenceRequest(req_id="r-1", images=(b"\x00\xffpixels",), params={})


class _Answer:
    """A 200 whose body is empty (what ``WebhookSender`` reads of an answer)."""

    code = 200

    def deliverBody(self, protocol: Any) -> None:
        protocol.connectionLost(None)


class RecordingClient:
    """The webhook HTTP client: records every POST and answers 200."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []

    def post(self, url: str, **kwargs: Any) -> Deferred[Any]:
        headers = kwargs["headers"]
        self.posts.append(
            {"url": url, "id": headers[b"webhook-id"][0].decode(),
             "body": json.loads(kwargs["data"])}
        )  # fmt: skip
        return succeed(_Answer())

    def completed(self, job_id: str) -> list[dict[str, Any]]:
        return [p["body"] for p in self.posts if p["id"] == f"{job_id}.completed"]


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


async def turn(seconds: float = 0.0) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def eventually(check: Callable[[], bool], what: str, tries: int = 250) -> None:
    for _ in range(tries):
        if check():
            return
        await turn(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Harness:
    """A loaded :class:`ModelRuntime` (fake model, hand-stepped threads, recorded
    webhooks) on the memory store or on the test Redis."""

    def __init__(self, redis_url: str | None, model_id: str, **server: Any) -> None:
        doc = {
            "server": {
                "id": model_id, "worker_nums": 1, "async_enabled": True,
                "async_timeout": 300, "webhook_allowed_hosts": ["127.0.0.1/32:*"],
                "job_lease_ms": 500, "job_max_attempts": 1, **server,
                **({"job_store": "redis", "redis_url": redis_url} if redis_url else {}),
            },
            "model": {"type": "fake", "fake_delay_ms": 0, "fake_steps": 1},
        }  # fmt: skip
        self.threads = HandThreads()
        self.client = RecordingClient()
        self.runtime = ModelRuntime(
            build_server_config(doc, env={}), clock=reactor, threads=self.threads,
            webhook_client=self.client,
        )  # fmt: skip
        self.model_id = model_id

    async def start(self) -> None:
        rt = self.runtime
        rt.start_store()
        loaded = rt.load_models()
        self.threads.step()
        await loaded
        if rt.store.pull:
            await rt.store.when_connected()  # type: ignore[attr-defined]
            rt.store._reclaim_from = 0.0  # type: ignore[attr-defined]  # reclaim at once
        await eventually(lambda: rt.ready, "the runtime to be ready")

    async def admit(self, events: frozenset[str] = frozenset({"completed"})) -> str:
        rt = self.runtime
        admission = await settle(rt.store.admit(REQ, "r-1", webhook=(HOOK, events)))
        assert admission.job_id is not None
        if not rt.store.pull:
            assert rt.runner is not None
            rt.runner.start(admission.job_id)
        else:
            rt._kick()
        return admission.job_id

    def counted(self, state: str) -> float:
        value = self.runtime.metrics.registry.get_sample_value(
            "mortred_async_jobs_total", {"state": state}
        )
        return value or 0.0

    async def stop(self) -> None:
        self.threads.drain()
        await self.runtime.shutdown(0.0)
        closed = self.runtime.close_store()
        if closed is not None:
            await closed


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "memory":
        return None
    return request.getfixturevalue("redis").url


@pytest_twisted.async_yield_fixture
async def harness(store_url: str | None) -> AsyncIterator[Callable[..., Any]]:
    built: list[Harness] = []
    model_id = "E" + uuid.uuid4().hex[:8]

    async def make(**server: Any) -> Harness:
        h = Harness(store_url, model_id, **server)
        built.append(h)
        await h.start()
        return h

    yield make
    for h in built:
        await h.stop()


async def settled(h: Harness, job_id: str, rounds: int = 3) -> None:
    """A few more upkeep rounds and turns: nothing is sent or counted twice."""
    for _ in range(rounds):
        out = h.runtime.maintain()
        if isinstance(out, Deferred):
            await out
        await turn(0.05)


@pytest_twisted.ensureDeferred
async def test_a_pending_job_past_its_budget_sends_completed_once_and_counts_once(
    harness: Callable[..., Any],
) -> None:
    """A job that waits past async_timeout for a worker ends timeout, with one
    completed webhook and one count, on either store."""
    h: Harness = await harness()
    rt = h.runtime
    assert rt.workers is not None
    busy = await rt.workers.acquire("sync")  # the only worker: the job cannot start
    job = await h.admit()
    await turn(0.4)  # past the 300 ms budget
    await settled(h, job)
    await eventually(lambda: bool(h.client.completed(job)), "the completed webhook")
    await settled(h, job)
    sent = h.client.completed(job)
    assert len(sent) == 1 and sent[0]["state"] == "timeout"
    assert h.counted("timeout") == 1
    busy.release()


@pytest_twisted.ensureDeferred
async def test_a_run_ends_with_one_webhook_and_one_count(harness: Callable[..., Any]) -> None:
    """The common path, for reference: a job run to done sends one completed webhook
    (with its result) and counts done once, on either store."""
    h: Harness = await harness()
    job = await h.admit()
    await eventually(lambda: h.threads.pending == 1, "the run to start")
    h.threads.step()
    await eventually(lambda: bool(h.client.completed(job)), "the completed webhook")
    await settled(h, job)
    sent = h.client.completed(job)
    assert len(sent) == 1 and sent[0]["state"] == "done" and sent[0]["result"] is not None
    assert h.counted("done") == 1


# -- Redis only: jobs that scripts end -------------------------------------------------


@pytest_twisted.async_yield_fixture
async def on_redis(redis: RedisServer) -> AsyncIterator[tuple[Harness, Any]]:
    """A loaded runtime A and a bare replica store B of the same model id."""
    model_id = "L" + uuid.uuid4().hex[:8]
    h = Harness(redis.url, model_id)
    await h.start()
    other = redis_store(redis.url, model_id, lease_ms=500, max_attempts=1)
    other.start()
    await other.link.when_connected()
    yield h, other
    await other.stop()
    await h.stop()


async def claimed_by(other: Any, h: Harness) -> str:
    """A job with a webhook admitted while A has no free worker, claimed by B."""
    rt = h.runtime
    assert rt.workers is not None
    busy = await rt.workers.acquire("sync")
    job = await h.admit()
    claim = await other.claim_next()
    assert claim is not None and claim.job_id == job
    h.busy = busy  # type: ignore[attr-defined]
    return job


@pytest_twisted.ensureDeferred
async def test_a_lost_replicas_job_failed_by_upkeep_sends_completed_once(
    on_redis: tuple[Harness, Any],
) -> None:
    """B claims a job and vanishes (its lease expires, no attempts left): A's upkeep
    ends it failed, with one completed webhook and one count."""
    h, other = on_redis
    job = await claimed_by(other, h)
    other._held.clear()  # B stops renewing: it is "lost"
    await turn(0.6)
    await settled(h, job)
    await eventually(lambda: bool(h.client.completed(job)), "the completed webhook")
    await settled(h, job)
    sent = h.client.completed(job)
    assert len(sent) == 1 and sent[0]["state"] == "failed"
    assert h.counted("failed") == 1
    h.busy.release()  # type: ignore[attr-defined]


@pytest_twisted.ensureDeferred
async def test_a_lost_replicas_cancelled_job_sends_completed_once(
    on_redis: tuple[Harness, Any],
) -> None:
    """A job flagged cancelled whose replica is lost ends cancelled in A's upkeep,
    with one completed webhook and one count."""
    h, other = on_redis
    job = await claimed_by(other, h)
    other.on_cancel = None  # B hears the cancel but does nothing: then it is lost
    outcome, _snap = await h.runtime.store.cancel(job)  # type: ignore[misc]
    assert outcome is CancelOutcome.REQUESTED
    other._held.clear()
    await turn(0.6)
    await settled(h, job)
    await eventually(lambda: bool(h.client.completed(job)), "the completed webhook")
    await settled(h, job)
    sent = h.client.completed(job)
    assert len(sent) == 1 and sent[0]["state"] == "cancelled"
    assert h.counted("cancelled") == 1
    h.busy.release()  # type: ignore[attr-defined]


@pytest_twisted.ensureDeferred
async def test_a_flagged_job_handed_back_ends_at_claim_with_one_webhook(
    on_redis: tuple[Harness, Any],
) -> None:
    """B hands back a job whose cancel was accepted; A's claim ends it cancelled,
    with one completed webhook and one count."""
    h, other = on_redis
    job = await claimed_by(other, h)
    other.on_cancel = None
    outcome, _snap = await h.runtime.store.cancel(job)  # type: ignore[misc]
    assert outcome is CancelOutcome.REQUESTED
    assert await other.hand_back(job)
    h.busy.release()  # type: ignore[attr-defined]
    h.runtime._kick()
    await eventually(lambda: bool(h.client.completed(job)), "the completed webhook")
    await settled(h, job)
    sent = h.client.completed(job)
    assert len(sent) == 1 and sent[0]["state"] == "cancelled"
    assert h.counted("cancelled") == 1
    assert h.threads.pending == 0  # it never ran


@pytest_twisted.ensureDeferred
async def test_a_cancel_racing_a_finishing_run_counts_cancelled_not_done(
    on_redis: tuple[Harness, Any], redis: RedisServer
) -> None:
    """Another replica's cancel lands after A's run returned but before A heard it:
    the job ends cancelled, and A counts it cancelled (not done)."""
    h, _other = on_redis
    job = await h.admit(frozenset())
    await eventually(lambda: h.threads.pending == 1, "the run to start")
    # The cancel's durable fact, written as CANCEL writes it, its message not yet here.
    redis.command("HSET", job_key(key_prefix(h.model_id), job), "cancel", "1")
    h.threads.step()
    store = h.runtime.store
    await eventually(lambda: h.counted("done") + h.counted("cancelled") >= 1, "the end")
    snap = await store.snapshot(job)  # type: ignore[misc]
    assert snap.state is JobState.CANCELLED
    assert h.counted("cancelled") == 1 and h.counted("done") == 0


@pytest_twisted.ensureDeferred
async def test_an_unreadable_request_failed_at_claim_sends_completed_once(
    on_redis: tuple[Harness, Any], redis: RedisServer
) -> None:
    """A queued job whose request cannot be decoded is failed by the replica that
    claims it, with one completed webhook and one count."""
    h, _other = on_redis
    rt = h.runtime
    assert rt.workers is not None
    busy = await rt.workers.acquire("sync")
    job = await h.admit()
    redis.command("HSET", job_key(key_prefix(h.model_id), job), "request", "not a request")
    busy.release()
    h.runtime._kick()
    await eventually(lambda: bool(h.client.completed(job)), "the completed webhook")
    await settled(h, job)
    sent = h.client.completed(job)
    assert len(sent) == 1 and sent[0]["state"] == "failed"
    assert "unreadable" in sent[0]["error"]
    assert h.counted("failed") == 1
