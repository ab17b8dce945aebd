"""WebhookSender against a real HTTP receiver on 127.0.0.1 (and on a Clock for timing):
retries, jitter, event-derived ids, in-flight caps."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry, Counter
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.web.resource import Resource
from twisted.web.server import Site

from mortred_twisted.jobs.webhooks import loggable_url, verify
from mortred_twisted.runtime.webhook_client import (
    GuardedWebhookClient,
    PinnedAgentTransport,
    reactor_resolver,
)
from mortred_twisted.runtime.webhooks import WebhookSender

KEY = b"receiver-shared-secret"


class Receiver(Resource):
    """Answers ``fail_first`` POSTs with ``fail_code``, then 200; records every attempt."""

    isLeaf = True

    def __init__(self, fail_first: int = 0, fail_code: int = 503) -> None:
        super().__init__()
        self.fail_first = fail_first
        self.fail_code = fail_code
        self.attempts: list[dict[str, Any]] = []
        self.delivered: list[dict[str, Any]] = []

    def render_POST(self, request: Any) -> bytes:
        body = request.content.read()
        names = ("webhook-id", "webhook-timestamp", "webhook-signature", "content-type")
        headers = {k: request.getHeader(k) for k in names}
        signed = verify(
            KEY, headers["webhook-id"], int(headers["webhook-timestamp"]), body,
            headers["webhook-signature"],
        )  # fmt: skip
        record = {"headers": headers, "body": json.loads(body), "signed": signed}
        self.attempts.append(record)
        if len(self.attempts) <= self.fail_first:
            request.setResponseCode(self.fail_code)
            return b"not now"
        self.delivered.append(record)
        return b"ok"


@pytest.fixture
def receiver_site():
    started: list[Any] = []

    def start(resource: Resource) -> str:
        port = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
        started.append(port)
        return f"http://127.0.0.1:{port.getHost().port}/hook"

    yield start
    for port in started:
        pytest_twisted.blockon(port.stopListening())


def make_sender(registry: CollectorRegistry, **kw: Any) -> WebhookSender:
    """A sender on the production client, admitting loopback by address (any port)."""
    deliveries = Counter("mortred_webhook_deliveries", "d", ["event", "outcome"], registry=registry)
    client = GuardedWebhookClient(
        allowed_hosts=frozenset(["127.0.0.1/32:*"]), resolve=reactor_resolver(reactor),
        transport=PinnedAgentTransport(reactor, persistent=False), clock=reactor,
    )  # fmt: skip
    return WebhookSender(clock=reactor, client=client, key=KEY, deliveries=deliveries, **kw)


def outcome_count(registry: CollectorRegistry, event: str, outcome: str) -> float:
    value = registry.get_sample_value(
        "mortred_webhook_deliveries_total", {"event": event, "outcome": outcome}
    )
    return value or 0.0


@pytest_twisted.ensureDeferred
async def test_terminal_event_is_retried_until_delivered_once(receiver_site) -> None:
    """A receiver failing the first three attempts gets the completed event exactly once,
    every attempt signed, one webhook-id across the retries."""
    receiver = Receiver(fail_first=3)
    url = receiver_site(receiver)
    registry = CollectorRegistry()
    sender = make_sender(registry, delays=[0.01] * 11)
    status = {"job_id": "job_a", "state": "done", "result": {"code": 0}}
    outcome = await sender.send("job_a", url, "completed", status, terminal=True)
    assert outcome == "delivered"
    assert len(receiver.attempts) == 4 and len(receiver.delivered) == 1
    assert all(a["signed"] for a in receiver.attempts)
    assert {a["headers"]["webhook-id"] for a in receiver.attempts} == {"job_a.completed"}
    assert receiver.delivered[0]["body"] == status
    assert receiver.delivered[0]["headers"]["content-type"] == "application/json"
    assert outcome_count(registry, "completed", "delivered") == 1
    assert sender.inflight == 0


@pytest_twisted.ensureDeferred
async def test_a_4xx_answer_is_final_and_counted_failed(receiver_site) -> None:
    """A 400 from the receiver is not retried: one attempt, outcome failed."""
    receiver = Receiver(fail_first=100, fail_code=400)
    url = receiver_site(receiver)
    registry = CollectorRegistry()
    sender = make_sender(registry, delays=[0.01] * 11)
    assert (
        await sender.send("job_b", url, "completed", {"state": "done"}, terminal=True) == "failed"
    )
    assert len(receiver.attempts) == 1
    assert outcome_count(registry, "completed", "failed") == 1


@pytest_twisted.ensureDeferred
async def test_a_redirect_is_not_followed(receiver_site) -> None:
    """A 3xx (which could lead past the allowlist) ends the delivery; the target is not called."""
    target = Receiver()
    target_url = receiver_site(target)

    class Redirect(Resource):
        isLeaf = True

        def render_POST(self, request: Any) -> bytes:
            request.setResponseCode(307)
            request.setHeader(b"location", target_url.encode())
            return b""

    url = receiver_site(Redirect())
    sender = make_sender(CollectorRegistry())
    assert (
        await sender.send("job_c", url, "completed", {"state": "done"}, terminal=True) == "failed"
    )
    assert target.attempts == []


@pytest_twisted.ensureDeferred
async def test_connection_refused_gives_up_after_every_attempt() -> None:
    """A dead receiver is tried once per policy attempt, then the outcome is failed."""
    port = reactor.listenTCP(0, Site(Resource()), interface="127.0.0.1")
    dead = f"http://127.0.0.1:{port.getHost().port}/hook"
    await port.stopListening()
    registry = CollectorRegistry()
    sender = make_sender(registry, delays=[0.001] * 3)
    assert await sender.send("job_d", dead, "completed", {"state": "failed"}, terminal=True) == (
        "failed"
    )
    assert outcome_count(registry, "completed", "failed") == 1


class CountingClient:
    """A scripted client: answers each attempt with the next status, records when."""

    def __init__(self, clock: Clock, statuses: list[int]) -> None:
        self.clock = clock
        self.statuses = statuses
        self.calls: list[tuple[float, dict[bytes, list[bytes]]]] = []

    def post(self, url: str, **kwargs: Any) -> Deferred[Any]:
        self.calls.append((self.clock.seconds(), kwargs["headers"]))
        return succeed(self._answer(self.statuses.pop(0)))

    @staticmethod
    def _answer(code: int) -> Any:
        class Answer:
            def __init__(self) -> None:
                self.code = code

            def deliverBody(self, protocol: Any) -> None:
                protocol.connectionLost(None)

        return Answer()


def test_default_policy_doubles_from_100_ms_and_stops_at_twelve() -> None:
    """On a Clock, with the jitter's draw at its top: attempts at 0, 0.1, 0.3, 0.7 … s;
    twelve in all, then failed."""
    clock = Clock()
    client = CountingClient(clock, [503] * 12)
    sender = WebhookSender(clock=clock, client=client, key=KEY, random=lambda: 1.0)
    outcome: list[str] = []
    sender.send("job_e", "http://h/x", "completed", {}, terminal=True).addCallback(outcome.append)
    for _ in range(400):
        clock.advance(1.0 if clock.seconds() > 1 else 0.05)
    assert outcome == ["failed"]
    times = [t for t, _ in client.calls]
    assert len(times) == 12
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] == pytest.approx(0.1, abs=0.06) and gaps[-1] >= 100


def test_progress_events_are_throttled_and_never_retried() -> None:
    """Two progress events 100 ms apart: the second is dropped; a 503 is not retried."""
    clock = Clock()
    client = CountingClient(clock, [503, 200])
    sender = WebhookSender(clock=clock, client=client, key=KEY)
    first: list[str] = []
    sender.send("job_f", "http://h/x", "progress", {}, terminal=False).addCallback(first.append)
    clock.advance(0.1)
    second: list[str] = []
    sender.send("job_f", "http://h/x", "progress", {}, terminal=False).addCallback(second.append)
    assert first == ["failed"] and second == ["dropped"]
    assert len(client.calls) == 1


def test_message_ids_name_the_event_and_unsigned_without_a_secret() -> None:
    """Each message's id names its event; with no secret there is no signature header."""
    clock = Clock()
    client = CountingClient(clock, [200, 200, 200])
    sender = WebhookSender(clock=clock, client=client, key=None)
    sender.send("job_g", "http://h/x", "start", {"state": "running"}, terminal=False)
    sender.send("job_g", "http://h/x", "progress", {"progress": {"step": 2, "total": 5}},
                terminal=False)  # fmt: skip
    sender.send("job_g", "http://h/x", "completed", {"state": "done"}, terminal=True)
    ids = [h[b"webhook-id"][0] for _, h in client.calls]
    assert ids == [b"job_g.start", b"job_g.progress.2", b"job_g.completed"]
    assert all(b"webhook-signature" not in h for _, h in client.calls)


def test_ids_agree_across_two_replicas_and_a_re_run() -> None:
    """Replica A sends start and progress 1-2 and dies; replica B re-runs the job and sends
    start, progress 1-3 and completed: every event both sent has one id, and the
    terminal event's id is none of A's, so a de-duplicating receiver keeps it."""
    ids: dict[str, list[bytes]] = {}
    for replica, steps, ends in (("a", [1, 2], False), ("b", [1, 2, 3], True)):
        clock = Clock()
        client = CountingClient(clock, [200] * 8)
        sender = WebhookSender(clock=clock, client=client, key=KEY)
        sender.send("job_r", "http://h/x", "start", {"state": "running"}, terminal=False)
        for step in steps:
            clock.advance(1.0)  # past the progress throttle
            sender.send("job_r", "http://h/x", "progress",
                        {"progress": {"step": step, "total": 3}}, terminal=False)  # fmt: skip
        if ends:
            sender.send("job_r", "http://h/x", "completed", {"state": "done"}, terminal=True)
        ids[replica] = [h[b"webhook-id"][0] for _, h in client.calls]
    assert ids["b"][: len(ids["a"])] == ids["a"]
    assert ids["b"][-1] == b"job_r.completed" and b"job_r.completed" not in ids["a"]
    assert len(set(ids["b"])) == len(ids["b"])


def test_retry_waits_are_jittered_within_half_to_all_of_the_policy() -> None:
    """With draws 0, 0.5 and 1 the waits are 50 %, 75 % and 100 % of the policy's
    delays: bounded by the policy, never shorter than half of it."""
    clock = Clock()
    client = CountingClient(clock, [503, 503, 503, 200])
    draws = iter([0.0, 0.5, 1.0])
    sender = WebhookSender(clock=clock, client=client, key=KEY, delays=[1.0, 2.0, 4.0],
                           random=lambda: next(draws))  # fmt: skip
    outcome: list[str] = []
    sender.send("job_j", "http://h/x", "completed", {}, terminal=True).addCallback(outcome.append)
    for _ in range(100):
        clock.advance(0.125)
    assert outcome == ["delivered"]
    times = [t for t, _ in client.calls]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([0.5, 1.5, 4.0], abs=0.125)


class HangingClient:
    """Never answers: every message stays in flight until the test fires it."""

    def __init__(self) -> None:
        self.pending: list[Deferred[Any]] = []

    def post(self, url: str, **kwargs: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.pending.append(d)
        return d


def test_deliveries_over_the_caps_are_dropped_and_counted() -> None:
    """A receiver that never answers holds at most 2 messages (the per-host cap); more to
    it are dropped and counted, another host still gets its own until the global cap of
    3; once a message ends, one more is admitted."""
    clock, registry = Clock(), CollectorRegistry()
    deliveries = Counter("mortred_webhook_deliveries", "d", ["event", "outcome"],
                         registry=registry)  # fmt: skip
    client = HangingClient()
    sender = WebhookSender(clock=clock, client=client, key=KEY, deliveries=deliveries,
                           max_inflight=3, max_inflight_per_host=2)  # fmt: skip
    outcomes: list[str] = []

    def send(job: str, url: str) -> None:
        sender.send(job, url, "completed", {}, terminal=True).addCallback(outcomes.append)

    for job in ("j1", "j2", "j3"):
        send(job, "http://stuck.example.com/x")
    assert outcomes == ["dropped"] and sender.inflight == 2
    send("j4", "http://other.example.com/x")
    send("j5", "http://other.example.com/x")
    assert outcomes == ["dropped", "dropped"] and sender.inflight == 3
    assert outcome_count(registry, "completed", "dropped") == 2
    client.pending[0].callback(CountingClient(clock, [])._answer(200))
    assert outcomes[-1] == "delivered" and sender.inflight == 2
    send("j6", "http://other.example.com/x")
    assert sender.inflight == 3 and len(client.pending) == 4


@pytest_twisted.ensureDeferred
async def test_logs_name_the_target_by_origin_and_path_only(receiver_site) -> None:
    """A failed and a refused delivery are logged with the URL's origin and path; its
    query string (a receiver's token), user info and fragment never reach the log."""
    failing = receiver_site(Receiver(fail_first=99, fail_code=400))
    sender = make_sender(CollectorRegistry(), delays=[])
    secret = "tok3n-s3cret"
    with capturedLogs() as events:
        failed = f"{failing}?token={secret}&x=1"
        assert await sender.send("job_q", failed, "completed", {}, terminal=True) == "failed"
        refused = f"http://10.1.2.3:8080/in/hook?sig={secret}"
        assert await sender.send("job_r", refused, "completed", {}, terminal=True) == "refused"
    ours = [e for e in events if e.get("log_namespace", "").startswith("mortred_twisted")]
    text = "\n".join(formatEvent(e) for e in ours)  # not the test receiver's access log
    assert secret not in text and "token=" not in text and "sig=" not in text
    assert f"{failing}" in text and "http://10.1.2.3:8080/in/hook" in text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://h.example/p/q?token=abc#frag", "https://h.example/p/q"),
        ("http://user:pw@h.example:8080/x?y", "http://h.example:8080/x"),
        ("http://[::1]:9/a;b?c", "http://[::1]:9/a;b"),
        ("https://h.example", "https://h.example"),
        ("/relative/path?secret", "/relative/path"),
        ("http://[bad/?secret", "(unparsable URL)"),
    ],
)
def test_loggable_url_keeps_origin_and_path(url: str, shown: str) -> None:
    """loggable_url drops query, fragment and user info, and never fails."""
    assert loggable_url(url) == shown
