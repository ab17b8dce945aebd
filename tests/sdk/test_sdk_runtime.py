"""An SDK model in a ModelRuntime: its declared batching serves the sync path."""

from __future__ import annotations

import json

from twisted.internet.task import Clock

from mortred_twisted.config.server import build_server_config
from mortred_twisted.model_api.base import InferenceRequest
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.sdk import sdk_batching_model


def runtime(**server: object) -> tuple[ModelRuntime, Clock, HandThreads]:
    doc = {
        "server": {"id": "B", "worker_nums": 1, **server},
        "model": {"type": "tests.sdk.sdk_batching_model:Doubler"},
    }
    clock, threads = Clock(), HandThreads()
    rt = ModelRuntime(build_server_config(doc, env={}), clock=clock, threads=threads)
    rt.load_models()
    threads.step()
    assert rt.ready
    return rt, clock, threads


def test_requests_gathered_within_the_declared_wait_run_as_one_batch() -> None:
    """Three sync requests inside batch_wait_ms reach predict_batch together; the
    item that fails fails alone."""
    sdk_batching_model.BATCHES.clear()
    rt, clock, threads = runtime()
    assert rt.sync is not None and rt.validator is not None
    outcomes: list[object] = []
    for n in (1, 13, 3):
        request = rt.validator.validate(InferenceRequest(f"r{n}", params={"n": n}))
        rt.sync.infer(request).addBoth(outcomes.append)
    clock.advance(0.01)
    while threads.pending:
        threads.step()
        clock.advance(0)
    assert sdk_batching_model.BATCHES == [3]
    assert json.loads(outcomes[0].data_json) == 2  # type: ignore[union-attr]
    assert "thirteen" in str(outcomes[1])
    assert json.loads(outcomes[2].data_json) == 6  # type: ignore[union-attr]


def test_the_server_files_batch_size_wins_when_set() -> None:
    """max_batch_size in the server file (above 1) overrides the class attribute."""
    rt, _, _ = runtime(max_batch_size=2, max_batch_delay_ms=1)
    assert rt._batching(rt.models[0]) == {"max_batch_size": 2, "max_batch_delay_ms": 1}
