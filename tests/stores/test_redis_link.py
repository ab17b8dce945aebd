# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""The Redis link under faults and over TLS (issue 18 items 2, 3, 4), against real
``redis-server`` processes: silent connections (a TCP proxy that stalls, half-opens
or cuts, tests/support/tcp_proxy.py) are noticed, replaced and re-read; ``rediss://``
verifies the server (CA file), presents a client certificate, refuses a certificate
that does not verify and says why; ACL users, host names and IPv6; and every store
operation runs on a cluster-mode Redis, which refuses a script that touches a key
outside its declared keys' slot.

Detection and recovery times are printed (``-s``) for the docs, never asserted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import formatEvent, globalLogPublisher

from mortred_twisted.config.server import RedisAddress, parse_redis_url
from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.store import StoreUnavailable
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.stores.redis_link import RedisLink
from mortred_twisted.stores.redis_store import RedisJobStore
from mortred_twisted.stores.wire import decode_request, encode_request
from tests.stores.test_store_contract import REQ, eventually, redis  # noqa: F401
from tests.support.redis_server import RedisServer, redis_server
from tests.support.tcp_proxy import TcpProxy, tcp_proxy
from tests.support.tls import TlsFiles, make_tls_files


def build(
    address: RedisAddress,
    model_id: str,
    *,
    timeout_s: float = 1.0,
    registry: CollectorRegistry | None = None,
    counters: NamedCounters | None = None,
    **kw: Any,
) -> RedisJobStore:
    options: dict[str, Any] = dict(
        max_queue=100, job_ttl_ms=300_000, max_completed=100, lease_ms=10_000,
        max_attempts=2, budget_ms=0,
    )  # fmt: skip
    options.update(kw)
    return RedisJobStore(
        reactor=reactor,
        link_factory=lambda r, **link_kw: RedisLink(
            r, address, reply_timeout_s=timeout_s, registry=registry, **link_kw
        ),
        model_id=model_id,
        counters=counters if counters is not None else NamedCounters(),
        encode=encode_request,
        decode=decode_request,
        **options,
    )


async def started(store: RedisJobStore) -> RedisJobStore:
    store.start()
    await store.link.when_connected()
    await eventually(_subscribed(store), "the subscription")
    return store


def _subscribed(store: RedisJobStore) -> Any:
    async def check() -> bool:
        return store.link.subscribed

    return check


async def exercise(a: RedisJobStore, b: RedisJobStore) -> None:
    """Every script of the store once, through two replicas."""
    first = await a.admit(REQ, owner="me", idempotency_key="k1", fingerprint="f")
    assert (await b.admit(REQ, owner="me", idempotency_key="k1", fingerprint="f")).replayed
    second = await b.admit(REQ, owner="me", webhook=("https://hook.example/x", frozenset()))
    assert [s.job_id for s in (await a.list_jobs(owner="me")).jobs] == [
        second.job_id, first.job_id,
    ]  # fmt: skip
    assert (await b.snapshot(first.job_id)).queue_position == 1
    claim = await a.claim_next()
    assert claim.job_id == first.job_id
    a.set_progress(claim.job_id, 3, 3)
    a._refresh_follows()

    async def progressed() -> bool:
        return (await b.snapshot(claim.job_id)).progress == (3, 3)

    await eventually(progressed, "the progress write")
    assert (await b.cancel(claim.job_id))[0] is CancelOutcome.REQUESTED
    assert await b.cancel_requested(claim.job_id)
    await a.maintain()
    assert await a.terminate(claim.job_id, JobState.DONE, result=b"{}")
    assert (await b.take_result(claim.job_id)).state is JobState.CANCELLED
    other = await b.claim_next()
    assert await b.hand_back(other.job_id)
    assert (await a.webhook_of(other.job_id))[0] == "https://hook.example/x"
    assert (await a.cancel(other.job_id))[0] is CancelOutcome.CANCELLED
    assert await a.link.call("GET", a._prefix + "depth") == b"0"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("pki"))


class LogLines:
    """The global log as text lines, while in a ``with`` block."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __enter__(self) -> LogLines:
        globalLogPublisher.addObserver(self._observe)
        return self

    def __exit__(self, *_exc: object) -> None:
        globalLogPublisher.removeObserver(self._observe)

    def _observe(self, event: dict) -> None:
        self.lines.append(formatEvent(event) or "")

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


# -- TLS, auth, addresses --------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_rediss_with_a_ca_file_verifies_and_runs_every_operation(pki: TlsFiles) -> None:
    """A TLS-only Redis whose certificate chains to redis_ca_file: both replicas connect
    (by IP address, and by host name) and every store operation works."""
    with redis_server(tls=pki) as server:
        model_id = "S" + uuid.uuid4().hex[:8]
        by_ip = replace(parse_redis_url(server.url), ca_file=str(pki.ca))
        by_name = replace(by_ip, host="localhost")
        a, b = build(by_ip, model_id), build(by_name, model_id)
        try:
            await started(a)
            await started(b)
            await exercise(a, b)
        finally:
            await a.stop()
            await b.stop()


@pytest_twisted.ensureDeferred
async def test_mutual_tls_needs_the_client_certificate(pki: TlsFiles) -> None:
    """A Redis that requires client certificates accepts the replica that presents one
    (redis_cert_file / redis_key_file) and never the one without."""
    with redis_server(tls=pki, client_certs=True) as server:
        model_id = "M" + uuid.uuid4().hex[:8]
        plain = replace(parse_redis_url(server.url), ca_file=str(pki.ca))
        with_cert = replace(plain, cert_file=str(pki.client_cert), key_file=str(pki.client_key))
        good, bad = build(with_cert, model_id), build(plain, model_id)
        with LogLines() as log:
            try:
                await started(good)
                bad.start()
                await eventually(_logged(log, "cannot use rediss://"), "the refusal in the log")
                assert not bad.link.connected
                with pytest.raises(StoreUnavailable):
                    await bad.submit(REQ)
                assert await good.submit(REQ)
            finally:
                await good.stop()
                await bad.stop()


@pytest_twisted.ensureDeferred
async def test_a_certificate_that_does_not_verify_never_connects_and_the_log_says_why(
    pki: TlsFiles,
) -> None:
    """redis_ca_file names a CA that did not sign the server's certificate: no
    connection is ever used (calls fail at once) and the log says the certificate
    does not verify, naming the key to check."""
    with redis_server(tls=pki) as server:
        wrong = replace(parse_redis_url(server.url), ca_file=str(pki.other_ca))
        store = build(wrong, "W" + uuid.uuid4().hex[:8])
        with LogLines() as log:
            store.start()
            try:
                await eventually(_logged(log, "does not verify"), "the TLS refusal in the log")
                assert log.has("redis_ca_file") and not store.link.connected
                with pytest.raises(StoreUnavailable):
                    await store.submit(REQ)
            finally:
                await store.stop()


def _logged(log: LogLines, text: str) -> Any:
    async def check() -> bool:
        return log.has(text)

    return check


@pytest_twisted.ensureDeferred
async def test_an_acl_user_limited_to_its_model_keys_runs_every_operation_over_ipv6() -> None:
    """An ACL user whose key and channel patterns cover only ``mortred:{<id>}:*``
    (every key a script touches is the model's), reached at ``[::1]``; a replica of
    another model id with that user never connects and its log says NOPERM."""
    model_id = "A" + uuid.uuid4().hex[:8]
    pattern = f"mortred:{{{model_id}}}:*"
    acl = ["--user", "app", "on", ">app-secret", f"~{pattern}", f"&{pattern}", "+@all"]
    with redis_server(args=acl, bind="127.0.0.1 ::1") as server:
        address = parse_redis_url(f"redis://app:app-secret@[::1]:{server.port}/0")
        assert address.host == "::1" and address.redacted().startswith("redis://app:***@[::1]")
        a, b = build(address, model_id), build(address, model_id)
        try:
            await started(a)
            await started(b)
            await exercise(a, b)
            outsider = build(address, "other-" + model_id)  # keys outside the patterns
            with LogLines() as log:
                outsider.start()
                try:
                    await eventually(_logged(log, "NOPERM"), "the ACL refusal in the log")
                    with pytest.raises(StoreUnavailable):
                        await outsider.submit(REQ)
                finally:
                    await outsider.stop()
        finally:
            await a.stop()
            await b.stop()


@pytest_twisted.ensureDeferred
async def test_every_operation_keeps_to_one_cluster_slot() -> None:
    """On a cluster-mode redis-server (which refuses a script touching a key in
    another slot than its declared keys) every store operation succeeds."""
    with redis_server(cluster=True) as server:
        model_id = "K" + uuid.uuid4().hex[:8]
        address = parse_redis_url(server.url)
        a = build(address, model_id, lease_ms=300)
        b = build(address, model_id, lease_ms=300)
        try:
            await started(a)
            await started(b)
            await exercise(a, b)
            lost = await a.submit(REQ)  # a replica lost with its job: reclaim runs
            await b.claim_next()
            b._held.clear()

            async def requeued() -> bool:
                await a.maintain()
                return (await a.snapshot(lost)).state is JobState.PENDING

            await eventually(requeued, "the reclaim")
            few = build(address, model_id, max_completed=1)  # retention per caller
            await started(few)
            try:
                for owner in ("x", "y"):
                    job = (await few.admit(REQ, owner=owner)).job_id
                    await few.cancel(job)
                    await few.snapshot(job)
                assert len((await few.list_jobs(owner=None, states=frozenset(
                    {JobState.CANCELLED}))).jobs) == 1  # fmt: skip
            finally:
                await few.stop()
        finally:
            await a.stop()
            await b.stop()


# -- silent connections -----------------------------------------------------------------


@pytest.fixture
def proxied(redis: RedisServer) -> Iterator[tuple[TcpProxy, RedisAddress, RedisAddress]]:
    """A proxy to the test Redis; the address through it and the direct one."""
    with tcp_proxy(redis.port) as proxy:
        direct = parse_redis_url(redis.url)
        yield proxy, replace(direct, port=proxy.port), direct


def reconnects(registry: CollectorRegistry, which: str) -> float:
    value = registry.get_sample_value(
        "mortred_redis_reconnects_total", {"connection": which}
    )  # fmt: skip
    return value or 0.0


@pytest_twisted.ensureDeferred
async def test_a_half_open_link_is_noticed_replaced_and_what_it_missed_is_read_again(
    proxied: tuple[TcpProxy, RedisAddress, RedisAddress],
) -> None:
    """Every connection of replica A goes silent for good (new ones work): A notices on
    both connections within ~1.5 x redis_timeout_ms (default 3 s: ping after
    0.75 s idle, 3 s unanswered), reconnects, and then applies what it missed meanwhile — the
    cancel of the job it runs, the end of the job its waiter waits for."""
    proxy, through, direct = proxied
    model_id = "H" + uuid.uuid4().hex[:8]
    registry, counters = CollectorRegistry(), NamedCounters()
    a = build(through, model_id, timeout_s=3.0, registry=registry, counters=counters)
    b = build(direct, model_id)
    told: list[str] = []
    a.on_cancel = told.append
    try:
        await started(a)
        await started(b)
        running = await a.submit(REQ)
        assert (await a.claim_next()).job_id == running
        waited = await b.submit(REQ)
        woke: Deferred[str] = counters.counter(waited)
        proxy.half_open()
        t0 = time.monotonic()
        assert (await b.cancel(running))[0] is CancelOutcome.REQUESTED  # c lost on A
        claim = await b.claim_next()
        assert await b.terminate(claim.job_id, JobState.DONE, result=b"{}")  # t lost on A

        async def recovered() -> bool:
            return bool(told) and woke.called

        await eventually(recovered, "A to notice, reconnect and re-read", tries=1000)
        took = time.monotonic() - t0
        print(f"\nhalf-open link (redis_timeout_ms 3000): cancel applied and waiter woken "
              f"{took:.2f} s after the link went silent")  # fmt: skip
        assert told[0] == running and await woke == waited
        assert reconnects(registry, "commands") == 1 and reconnects(registry, "events") == 1

        async def pinged() -> bool:  # the new subscriber's first PING (after 0.75 s)
            labels = {"connection": "events"}
            return bool(registry.get_sample_value("mortred_redis_round_trip_ms_count", labels))

        await eventually(pinged, "a PING round trip on the new subscriber")
        assert await a.submit(REQ)  # and it works again
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_a_stalled_link_fails_calls_then_recovers_when_it_flows_again(
    proxied: tuple[TcpProxy, RedisAddress, RedisAddress],
) -> None:
    """Everything through the proxy stops (old and new connections): a call in flight
    fails with StoreUnavailable once redis_timeout_ms passes (503 at the edge, never a
    hang); once traffic flows, the store works again."""
    proxy, through, _direct = proxied
    a = build(through, "L" + uuid.uuid4().hex[:8], timeout_s=1.0)
    try:
        await started(a)
        proxy.stall()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await a.submit(REQ)
        failed_after = time.monotonic() - t0
        proxy.resume()
        t1 = time.monotonic()
        await a.link.when_connected()

        async def works() -> bool:
            try:
                return bool(await a.submit(REQ))
            except StoreUnavailable:
                return False

        await eventually(works, "the store to work again")
        print(f"\nstalled link (redis_timeout_ms 1000): call failed after {failed_after:.2f} s; "
              f"working {time.monotonic() - t1:.2f} s after traffic resumed")  # fmt: skip
    finally:
        await a.stop()


@pytest_twisted.ensureDeferred
async def test_a_cut_link_reconnects_at_once(
    proxied: tuple[TcpProxy, RedisAddress, RedisAddress],
) -> None:
    """Every connection is reset: both losses are logged, both connections are
    replaced (backoff from 0.1 s) and the subscriber hears events again."""
    proxy, through, direct = proxied
    model_id = "U" + uuid.uuid4().hex[:8]
    counters = NamedCounters()
    a = build(through, model_id, counters=counters)
    b = build(direct, model_id)
    try:
        await started(a)
        await started(b)
        job = await b.submit(REQ)
        woke: Deferred[str] = counters.counter(job)
        subscriber = a.link._sub
        with LogLines() as log:
            proxy.cut()
            t0 = time.monotonic()

            async def resubscribed() -> bool:
                return a.link.subscribed and a.link._sub is not subscriber and a.link.connected

            await eventually(resubscribed, "A to reconnect")
        assert log.has("job store connection to") and log.has("job store subscription to")
        print(f"\ncut link: both connections back {time.monotonic() - t0:.2f} s after the reset")
        claim = await b.claim_next()
        await b.terminate(claim.job_id, JobState.DONE, result=b"{}")
        assert await woke == job
    finally:
        await a.stop()
        await b.stop()


def test_tls_files_exist(pki: TlsFiles) -> None:
    """The test PKI is PEM on disk (what redis-server and the replica read)."""
    for path in (pki.ca, pki.server_cert, pki.client_key):
        assert Path(path).read_bytes().startswith(b"-----BEGIN")


async def settle_turn() -> None:
    await deferLater(reactor, 0, lambda: None)
