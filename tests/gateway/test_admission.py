"""The gateway's admission at zero replicas (http/gateway_admission.py) against a real
redis-server: a submit is admitted into the shared store by the model port's own
job routes validating with the published twin, exactly as a replica would (422s,
idempotency, callers, queue limit); a replica then claims it; polls and waits are
answered from Redis; without a usable twin the gateway holds instead."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.config.control import AutoscaleSettings
from mortred_twisted.config.server import ServerConfig, build_server_config
from mortred_twisted.gateway.routing import Route, RouteKind
from mortred_twisted.http.gateway_admission import ColdAdmission, HeadlessJobs, LocalResponse
from mortred_twisted.jobs.states import JobState
from mortred_twisted.model_api.base import InferenceRequest, Model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from mortred_twisted.runtime.validation_twin import (
    parse_twin,
    publish_twin,
    twin_document,
    twin_key,
)
from mortred_twisted.sdk import Input, ServedModel
from mortred_twisted.sdk.loading import build_sdk_model
from mortred_twisted.stores.redis_scripts import key_prefix
from tests.fakes.threads import HandThreads
from tests.support.redis_server import RedisServer, redis_server

TOKEN = "internal"


class Greeter(ServedModel):
    """Greets ``name`` ``times`` times."""

    def predict(
        self,
        name: str = Input(description="who", max_length=8),
        times: int = Input(1, ge=1, le=3),
    ) -> str:
        return " ".join(["hello " + name] * times)


class ChecksItself(Greeter):
    """Checks an input with its instance: its twin cannot."""

    def check_inputs(self, params: dict[str, Any]) -> None:
        pass


class CodeValidated(Model):
    """A model whose validation is code (as the built-ins before the SDK port)."""

    def validate(self, request: InferenceRequest) -> InferenceRequest:
        return request

    def run(self, request: InferenceRequest, ctx: Any) -> Any:
        return None


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


GREETER = "tests.gateway.test_admission:Greeter"


def server_config(
    url: str, model_id: str, model_type: str = GREETER, **server: Any
) -> ServerConfig:
    doc = {
        "server": {"id": model_id, "async_enabled": True, "job_store": "redis",
                   "redis_url": url, "auth_token": TOKEN, "async_max_queue": 4, **server},
        "model": {"type": model_type},
    }  # fmt: skip
    return build_server_config(doc, env={}, read_model_file=False)


def loaded(cls: type = Greeter) -> Any:
    return build_sdk_model(cls, {}, Path("."))


def entry(model_id: str) -> CatalogEntry:
    return CatalogEntry(
        model_id, "sdk", "127.0.0.1", 18100, "/infer", True, 16, "m.toml",
        job_store="redis", autoscale=AutoscaleSettings(min_replicas=0, max_replicas=1),
    )  # fmt: skip


def route(model_id: str, kind: RouteKind, job: str | None = None, query: str = "") -> Route:
    path = {RouteKind.SUBMIT: "/jobs", RouteKind.POLL: f"/jobs/{job}",
            RouteKind.WAIT: f"/jobs/{job}/wait{query}", RouteKind.RESULT: f"/jobs/{job}/result",
            RouteKind.CANCEL: f"/jobs/{job}"}[kind]  # fmt: skip
    return Route(kind, entry(model_id), path, job)


def headers(caller: str = "key:a", **extra: str) -> dict[bytes, list[bytes]]:
    out = {b"authorization": [f"Bearer {TOKEN}".encode()],
           b"content-type": [b"application/json"],
           b"x-mortred-principal": [caller.encode()]}  # fmt: skip
    for name, value in extra.items():
        out[name.replace("_", "-").encode()] = [value.encode()]
    return out


def body(**params: Any) -> bytes:
    return json.dumps({"params": params}).encode()


class Rig:
    """A :class:`ColdAdmission` for one model id, a twin published by a replica's
    document, and a replica's store (to claim and end jobs)."""

    def __init__(self, redis: RedisServer, model_type: str = GREETER, **server: Any) -> None:
        self.redis = redis
        self.model_id = "A" + uuid.uuid4().hex[:8]
        self.config = server_config(redis.url, self.model_id, model_type, **server)
        self.jobs = HeadlessJobs(self.config, reactor)
        self.admission = ColdAdmission({self.model_id: self.jobs})
        self.replica = ModelRuntime(self.config, clock=reactor, threads=HandThreads())

    async def start(self, twin: bytes | None = None) -> None:
        self.admission.start()
        self.replica.start_store()
        await self.jobs.store.when_connected()
        await self.replica.store.when_connected()
        if twin is not None:
            self.publish(twin)

    def publish(self, raw: bytes) -> None:
        self.redis.command("SET", twin_key(self.model_id), raw.decode())

    async def stop(self) -> None:
        await self.admission.stop()
        await self.replica.close_store()

    async def call(
        self, kind: RouteKind, data: bytes | None = None, job: str | None = None, **kw: Any
    ) -> LocalResponse | None:
        query = kw.pop("query", "")
        answer = self.admission.serve(route(self.model_id, kind, job, query), headers(**kw), data)
        return None if answer is None else await answer

    def depth(self) -> int:
        return int(self.redis.command("GET", key_prefix(self.model_id) + "depth") or 0)


@pytest_twisted.async_yield_fixture
async def rig(redis: RedisServer) -> AsyncIterator[Rig]:
    made = Rig(redis)
    await made.start(twin_document(loaded(), made.config))
    yield made
    await made.stop()


def doc(response: LocalResponse | None) -> Any:
    assert response is not None
    return json.loads(response.body)


@pytest_twisted.ensureDeferred
async def test_a_submit_is_admitted_at_once_and_a_replica_claims_it(rig: Rig) -> None:
    """202 with Location and poll URLs as the model port answers; the job is pending
    in the shared store with its validated params (defaults filled in), and a
    replica's claim takes that very job."""
    answer = await rig.call(RouteKind.SUBMIT, body(name="ada"))
    assert answer is not None and answer.code == 202, answer
    job = doc(answer)["job_id"]
    assert answer.headers.getRawHeaders(b"location") == [f"/jobs/{job}".encode()]
    assert doc(answer) == {"job_id": job, "state": "pending", "poll_url": f"/jobs/{job}",
                           "result_url": f"/jobs/{job}/result"}  # fmt: skip
    assert rig.depth() == 1
    claim = await rig.replica.store.claim_next()
    assert claim is not None and claim.job_id == job
    assert dict(claim.request.params) == {"name": "ada", "times": 1}


@pytest_twisted.ensureDeferred
async def test_a_bad_input_is_the_models_own_422_and_admits_nothing(rig: Rig) -> None:
    """Each bad input gets the status and body the loaded model's port gives (the
    same handler validating with the model itself), and nothing is admitted."""
    bad = [body(), body(name="a" * 9), body(name="x", times=7), body(name="x", shout=True),
           b"{not json", json.dumps({"params": {"name": 3}}).encode()]  # fmt: skip
    twin_answers = [await rig.call(RouteKind.SUBMIT, b) for b in bad]
    rig.jobs.runtime.models = [loaded()]  # the replica's own validator, same handler
    model_answers = [await rig.call(RouteKind.SUBMIT, b) for b in bad]
    assert [(a.code, a.body) for a in twin_answers if a] == [
        (a.code, a.body) for a in model_answers if a
    ]
    assert len(twin_answers) == len(bad) and {a.code for a in twin_answers if a} <= {400, 422}
    assert b"params.times" in twin_answers[2].body  # type: ignore[union-attr]
    assert rig.depth() == 0


@pytest_twisted.ensureDeferred
async def test_the_fake_built_in_is_admitted_with_its_seed_contract(redis: RedisServer) -> None:
    """The fake family, declared with the SDK (contract mortred-v1): its twin gives
    the seed's 422s exactly as the loaded model does, and a good submit is admitted
    with the seed's params (absent unless given)."""
    from mortred_twisted.models.fake import create as create_fake

    model = create_fake({"fake_delay_ms": 0}, Path("."))
    r = Rig(redis, "fake")
    await r.start(twin_document(model, r.config))
    try:
        bad = [json.dumps(d).encode() for d in (
            {"params": {}}, {"images": [], "params": {}},
            {"images": ["aGk="], "params": {"delay_ms": -1}},
            {"images": ["aGk="], "params": {"dleay_ms": 1}},
            {"images": ["aGk="], "params": {"mode": "warp"}},
        )]  # fmt: skip
        twin_answers = [await r.call(RouteKind.SUBMIT, b) for b in bad]
        r.jobs.runtime.models = [model]
        model_answers = [await r.call(RouteKind.SUBMIT, b) for b in bad]
        assert [(a.code, a.body) for a in twin_answers if a] == [
            (a.code, a.body) for a in model_answers if a
        ]
        assert len(twin_answers) == len(bad) and r.depth() == 0
        assert all(a.code in (400, 413, 422) for a in twin_answers if a)
        ok = json.dumps({"images": ["aGk="], "params": {"delay_ms": 5}}).encode()
        answer = await r.call(RouteKind.SUBMIT, ok)
        assert answer is not None and answer.code == 202, answer
        claim = await r.replica.store.claim_next()
        assert claim is not None and dict(claim.request.params) == {"delay_ms": 5}
        assert list(claim.request.images) == [b"hi"]
    finally:
        await r.stop()


@pytest_twisted.ensureDeferred
async def test_an_idempotent_resubmit_is_the_same_job(rig: Rig) -> None:
    """The same Idempotency-Key and body: the same job, marked replayed; the key with
    another body is refused as on the model port; another caller's key is its own."""
    first = await rig.call(RouteKind.SUBMIT, body(name="ada"), idempotency_key="k1")
    again = await rig.call(RouteKind.SUBMIT, body(name="ada"), idempotency_key="k1")
    assert doc(again)["job_id"] == doc(first)["job_id"]
    assert again.headers.getRawHeaders(b"idempotent-replayed") == [b"true"]  # type: ignore
    other = await rig.call(RouteKind.SUBMIT, body(name="bob"), idempotency_key="k1")
    assert other is not None and other.code == 422 and b"Idempotency-Key" in other.body
    theirs = await rig.call(
        RouteKind.SUBMIT, body(name="ada"), idempotency_key="k1", caller="key:b"
    )
    assert doc(theirs)["job_id"] != doc(first)["job_id"]
    assert rig.depth() == 2


@pytest_twisted.ensureDeferred
async def test_polls_are_answered_from_redis_per_caller(rig: Rig) -> None:
    """A poll by its caller sees the pending job; another caller's poll and result
    are 404 as for an unknown id; the result of a pending job is 409."""
    job = doc(await rig.call(RouteKind.SUBMIT, body(name="ada")))["job_id"]
    mine = await rig.call(RouteKind.POLL, job=job)
    assert doc(mine)["state"] == "pending"
    theirs = await rig.call(RouteKind.POLL, job=job, caller="key:b")
    assert theirs is not None and theirs.code == 404
    early = await rig.call(RouteKind.RESULT, job=job)
    assert early is not None and early.code == 409
    assert (await rig.call(RouteKind.RESULT, job=job, caller="key:b")).code == 404  # type: ignore


@pytest_twisted.ensureDeferred
async def test_a_wait_answered_here_wakes_when_a_replica_ends_the_job(rig: Rig) -> None:
    """A wait parked on the gateway's store is woken by the replica's terminal event
    and answers done; the result is then served from Redis."""
    job = doc(await rig.call(RouteKind.SUBMIT, body(name="ada")))["job_id"]
    waiting = rig.admission.serve(
        route(rig.model_id, RouteKind.WAIT, job, "?timeout=20000"), headers(), None
    )
    assert waiting is not None
    out: list[Any] = []
    waiting.addBoth(lambda r: out.append(r) or r)
    for _ in range(500):  # parked once its counter is registered
        if job in rig.jobs.runtime.counters.names():
            break
        await deferLater(reactor, 0.002, lambda: None)
    assert job in rig.jobs.runtime.counters.names() and out == []
    claim = await rig.replica.store.claim_next()
    assert claim is not None and claim.job_id == job
    await rig.replica.store.terminate(job, JobState.DONE, result=b'"hello ada"')
    assert doc(await waiting)["state"] == "done"
    result = await rig.call(RouteKind.RESULT, job=job)
    assert result is not None and result.code == 200 and b"hello ada" in result.body


@pytest_twisted.ensureDeferred
async def test_the_queue_limit_holds_as_on_a_replica(rig: Rig) -> None:
    """async_max_queue (4) is the store's: the fifth submit is 429 with Retry-After."""
    codes = [(await rig.call(RouteKind.SUBMIT, body(name="n"))).code for _ in range(5)]  # type: ignore
    assert codes == [202, 202, 202, 202, 429]
    assert rig.depth() == 4


@pytest_twisted.ensureDeferred
async def test_a_webhook_outside_the_allowlist_is_refused_before_admission(rig: Rig) -> None:
    """No webhook_allowed_hosts: a submit naming a webhook is refused as on the
    model port, and nothing is admitted."""
    data = json.dumps({"params": {"name": "x"}, "webhook": "https://example.com/h"}).encode()
    answer = await rig.call(RouteKind.SUBMIT, data)
    assert answer is not None and answer.code in (400, 422) and b"webhook" in answer.body
    assert rig.depth() == 0


@pytest_twisted.ensureDeferred
async def test_without_a_usable_twin_the_gateway_holds(redis: RedisServer) -> None:
    """No twin yet, a refusal (a model validated by code, or one with check_inputs),
    a damaged document or other settings: serve() answers None (hold) and admits
    nothing; a good twin published later is taken at the next submit."""
    r = Rig(redis)
    await r.start()
    try:
        assert await r.call(RouteKind.SUBMIT, body(name="x")) is None
        for raw in (
            twin_document(CodeValidated(), r.config),
            twin_document(loaded(ChecksItself), r.config),
            b"{]",
            b"[1, 2]",
            json.dumps(
                {
                    "format": 1,
                    "model_id": r.model_id,
                    "admit": True,
                    "settings": {},
                    "declaration": {},
                }
            ).encode(),
            twin_document(loaded(), server_config(redis.url, r.model_id, async_max_queue=9)),
            twin_document(loaded(), server_config(redis.url, "OTHER")),
        ):
            r.publish(raw)
            assert await r.call(RouteKind.SUBMIT, body(name="x")) is None, raw
        assert r.depth() == 0
        r.publish(twin_document(loaded(), r.config))
        assert (await r.call(RouteKind.SUBMIT, body(name="x"))).code == 202  # type: ignore
        assert await r.call(RouteKind.CANCEL, job="job_x") is None  # a replica's route
    finally:
        await r.stop()


def test_a_damaged_twin_is_a_reason_never_an_exception() -> None:
    """parse_twin answers a reason for every malformed document."""
    config = server_config("redis://127.0.0.1:1/0", "M")
    good = json.loads(twin_document(loaded(), config))
    for raw in (None, b"x" * (2 << 20), b"\xff", b"null", b"{}",
                json.dumps({**good, "input_limits": [-1, 2]}).encode(),
                json.dumps({**good, "input_limits": "big"}).encode(),
                json.dumps({**good, "declaration": {"name": 1}}).encode()):  # fmt: skip
        parsed = parse_twin(raw, config)
        assert parsed.twin is None and parsed.why, raw
    assert parse_twin(json.dumps(good).encode(), config).twin is not None


@pytest_twisted.ensureDeferred
async def test_a_replica_publishes_its_twin_at_ready(redis: RedisServer) -> None:
    """publish_twin writes the document once the store is reached; a model
    validated by code publishes a refusal (so a stale twin is replaced)."""
    model_id = "P" + uuid.uuid4().hex[:8]
    config = server_config(redis.url, model_id)
    runtime = ModelRuntime(config, clock=reactor, threads=HandThreads())
    runtime.models = [loaded()]
    runtime.start_store()
    try:
        await publish_twin(runtime)
        raw = redis.command("GET", twin_key(model_id))
        assert parse_twin(raw.encode(), config).twin is not None
        runtime.models = [CodeValidated()]
        await publish_twin(runtime)
        refused = json.loads(redis.command("GET", twin_key(model_id)))
        assert refused["admit"] is False and "not an SDK model" in refused["why"]
    finally:
        await runtime.close_store()


def test_the_admission_covers_autoscaled_redis_ids_read_as_the_children_do(
    tmp_path: Path,
) -> None:
    """for_catalog: an autoscaled id on Redis with async jobs gets a headless model
    read from its server file with this environment (MORTRED_* overrides as in the
    children) and the internal token as its auth_token; another id, or an unreadable
    server file, is left to hold-and-forward."""
    conf = tmp_path / "conf" / "server"
    conf.mkdir(parents=True)
    good = conf / "a.toml"
    good.write_text('[server]\nid = "A"\nasync_enabled = true\njob_store = "redis"\n'
                    '[model]\ntype = "fake"\n')  # fmt: skip
    fixed = replace(entry("F"), autoscale=None, config_path=str(good))
    memory = replace(entry("M"), job_store="memory", config_path=str(good))
    broken = replace(entry("B"), config_path=str(tmp_path / "missing.toml"))
    catalog = Catalog([replace(entry("A"), config_path=str(good)), fixed, memory, broken])
    env = {"MORTRED_REDIS_URL": "redis://127.0.0.1:1/3", "MORTRED_ASYNC_MAX_QUEUE": "7"}
    admission = ColdAdmission.for_catalog(catalog, reactor, "secret", env)
    assert admission is not None and list(admission.models) == ["A"]
    config = admission.models["A"].config
    assert (config.redis_url, config.async_max_queue, config.auth_token) == (
        "redis://127.0.0.1:1/3", 7, "secret",
    )  # fmt: skip
    assert ColdAdmission.for_catalog(Catalog([fixed]), reactor) is None


@pytest_twisted.ensureDeferred
async def test_a_multipart_submit_is_admitted_as_on_the_model_port(rig: Rig) -> None:
    """An SDK model takes multipart/form-data: its fields are the inputs (text
    parsed as the declaration says), as on the model port."""
    boundary = "xyz"
    data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nada\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"times\"\r\n\r\n2\r\n"
            f"--{boundary}--\r\n").encode()  # fmt: skip
    kind = f"multipart/form-data; boundary={boundary}"
    answer = rig.admission.serve(
        route(rig.model_id, RouteKind.SUBMIT), {**headers(), b"content-type": [kind.encode()]}, data
    )
    assert answer is not None
    admitted = await answer
    assert admitted is not None and admitted.code == 202, admitted
    claim = await rig.replica.store.claim_next()
    assert claim is not None and dict(claim.request.params) == {"name": "ada", "times": 2}


def test_a_process_isolated_replica_publishes_the_twin_its_worker_sent() -> None:
    """Under worker_isolation = "process" the server validates with the twin its
    worker sent back: that twin is what the replica publishes."""
    from mortred_twisted.models.isolated import IsolatedModel

    isolated = IsolatedModel.__new__(IsolatedModel)  # no worker process: its twin only
    isolated._local = loaded().validation_twin()
    config = server_config("redis://127.0.0.1:1/0", "M")
    parsed = parse_twin(twin_document(isolated, config), config)
    assert parsed.twin is not None
    assert parsed.twin.declaration.to_json() == loaded().declaration.to_json()
