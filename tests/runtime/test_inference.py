"""The sync path: backpressure, timeout, batching with per-item isolation."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock

from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import InferenceRequest, InputDecodeError, Model, RunContext
from mortred_twisted.runtime.inference import QueueFull, RunTimeout, SyncInference
from mortred_twisted.runtime.workers import WorkerPool
from tests.fakes.threads import HandThreads


class Batchy(Model):
    """Records batch sizes; an image of b'bad' fails alone."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        if request.images[0] == b"bad":
            raise InputDecodeError("cannot decode image")
        return {"id": request.req_id}

    def run_batch(self, requests, ctxs):
        self.batches.append(len(requests))
        return super().run_batch(requests, ctxs)


def make(model: Model, **kw: Any) -> tuple[SyncInference, Clock, HandThreads, WorkerPool]:
    clock, threads = Clock(), HandThreads()
    pool = WorkerPool([model])
    kw.setdefault("run_timeout_ms", 0)
    kw.setdefault("max_queue_depth", 10)
    sync = SyncInference(clock=clock, workers=pool, threads=threads, metrics=ServerMetrics(), **kw)
    return sync, clock, threads, pool


def req(name: str, image: bytes = b"ok") -> InferenceRequest:
    return InferenceRequest(req_id=name, images=(image,))


def outcome(d) -> list:
    out: list = []
    d.addBoth(out.append)
    return out


def test_backpressure_refuses_beyond_max_queue_depth() -> None:
    """With every worker busy and max_queue_depth waiting, the next request is QueueFull."""
    sync, _clock, _threads, _pool = make(Batchy(), max_queue_depth=1)
    sync.infer(req("a"))
    sync.infer(req("b"))
    with pytest.raises(QueueFull):
        sync.infer(req("c"))


def test_run_timeout_fails_with_run_timeout() -> None:
    """model_run_timeout covers wait + run: a slow run fails RunTimeout."""
    sync, clock, threads, pool = make(Batchy(), run_timeout_ms=200)
    got = outcome(sync.infer(req("a")))
    clock.advance(0.2)
    assert got and got[0].check(RunTimeout)
    assert pool.available == 0
    threads.step()
    assert pool.available == 1


def test_batching_runs_one_forward_pass_and_isolates_failures() -> None:
    """Requests gathered within max_batch_delay_ms run in one batch; a bad item fails alone."""
    model = Batchy()
    sync, clock, threads, pool = make(model, max_batch_size=4, max_batch_delay_ms=5)
    results = [outcome(sync.infer(req(n, b"bad" if n == "b" else b"ok"))) for n in "abc"]
    clock.advance(0.005)
    assert threads.pending == 1
    threads.step()
    assert model.batches == [3]
    assert results[0][0].data_json == b'{"id":"a"}'
    assert results[1][0].check(InputDecodeError)
    assert results[2][0].data_json == b'{"id":"c"}'
    assert pool.available == 1


def test_batch_size_is_capped() -> None:
    """More requests than max_batch_size are split into several batches."""
    model = Batchy()
    sync, clock, threads, _pool = make(model, max_batch_size=2, max_batch_delay_ms=1)
    results = [outcome(sync.infer(req(str(i)))) for i in range(5)]
    for _ in range(3):
        clock.advance(0.001)
        threads.drain()
    assert model.batches == [2, 2, 1]
    assert all(r and not hasattr(r[0], "check") for r in results)


def test_cancelled_batch_item_is_skipped_before_it_runs() -> None:
    """A request cancelled while queued for a batch never reaches the model."""
    model = Batchy()
    sync, clock, threads, _pool = make(model, max_batch_size=4, max_batch_delay_ms=5)
    keep = outcome(sync.infer(req("a")))
    gone = sync.infer(req("b"))
    gone.addErrback(lambda f: None)
    gone.cancel()
    clock.advance(0.005)
    threads.drain()
    assert model.batches == [1] and keep[0].data_json == b'{"id":"a"}'
