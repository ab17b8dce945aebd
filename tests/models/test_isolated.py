"""Process-isolated workers: same answers as in-process, errors and cancel cross the pipe."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InvalidRequest,
    RunCancelled,
    RunContext,
)
from mortred_twisted.models.fake import create as create_fake
from mortred_twisted.models.isolated import IsolatedModel, RemoteModelError, WorkerCrashed

OPTIONS = {"fake_delay_ms": 0, "fake_steps": 4}


@pytest.fixture(scope="module")
def isolated():
    model = IsolatedModel("fake", OPTIONS, Path("."), create_fake(OPTIONS, Path(".")))
    yield model
    model.close()


def req(**params) -> InferenceRequest:
    return InferenceRequest(req_id="r", images=(b"img",), params=params)


def test_result_and_progress_match_the_in_process_model(isolated) -> None:
    """The worker process returns the same JSON as the model run in-process; progress is relayed."""
    steps: list[tuple[int, int]] = []
    ctx = RunContext(on_progress=lambda s, t: steps.append((s, t)))
    remote = json.loads(isolated.run(req(), ctx))
    local = create_fake(OPTIONS, Path(".")).run(req(), RunContext())
    assert remote == local
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_model_errors_cross_the_pipe(isolated) -> None:
    """An exception in the worker is raised in the server with its message."""
    with pytest.raises(RemoteModelError, match="fake model failure"):
        isolated.run(req(fail=True), RunContext())


def test_validation_runs_in_process(isolated) -> None:
    """validate() uses the in-process instance and names the field."""
    with pytest.raises(InvalidRequest, match=r"params\.mode"):
        isolated.validate(req(mode="warp"))


def test_cancel_stops_the_remote_run(isolated) -> None:
    """Setting the context's cancel flag stops the worker at its next step."""
    ctx = RunContext()
    ctx.cancel()
    with pytest.raises(RunCancelled):
        isolated.run(req(delay_ms=60_000, steps=600), ctx)


def test_batch_isolates_failures(isolated) -> None:
    """run_batch in the worker returns per-item results and errors."""
    out = isolated.run_batch([req(), req(fail=True)], [RunContext(), RunContext()])
    assert json.loads(out[0])["model"] == "fake"
    assert isinstance(out[1], RemoteModelError)


def test_a_worker_dying_mid_run_fails_that_run_only() -> None:
    """A worker process that dies during a run fails it with WorkerCrashed; the server
    process survives and the next run gets a fresh worker."""
    crashing = {**OPTIONS, "fake_exit_on_run": True}
    model = IsolatedModel("fake", crashing, Path("."), create_fake(OPTIONS, Path(".")))
    try:
        first_pid = model.pid
        with pytest.raises(WorkerCrashed):
            model.run(req(), RunContext())
        with pytest.raises(WorkerCrashed):  # the replacement dies too, and is replaced again
            model.run(req(), RunContext())
        assert model.pid != first_pid
    finally:
        model.close()


def test_an_idle_dead_worker_is_replaced_before_the_next_run() -> None:
    """A worker process killed while idle is restarted transparently."""
    model = IsolatedModel("fake", OPTIONS, Path("."), create_fake(OPTIONS, Path(".")))
    try:
        model._process.kill()
        model._process.join(10)
        assert json.loads(model.run(req(), RunContext()))["model"] == "fake"
    finally:
        model.close()


def test_a_run_that_ignores_cancel_is_killed_after_the_grace_and_the_worker_respawns() -> None:
    """A one-step 60 s run never checks its flag: after cancel_grace the worker process is
    killed (RunCancelled), a fresh one is started, and the next run succeeds."""
    model = IsolatedModel(
        "fake", OPTIONS, Path("."), create_fake(OPTIONS, Path(".")), cancel_grace_s=0.2
    )
    try:
        first_pid = model.pid
        ctx = RunContext()
        timer = threading.Timer(0.3, ctx.cancel)
        timer.start()
        with pytest.raises(RunCancelled, match="worker process was killed"):
            model.run(req(delay_ms=60_000, steps=1), ctx)
        assert model.killed_runs == 1
        assert model.pid is not None and model.pid != first_pid
        assert json.loads(model.run(req(delay_ms=0), RunContext()))["steps"] >= 1
    finally:
        model.close()


def test_an_unreadable_image_crosses_the_pipe_as_itself() -> None:
    """The SDK's UnreadableImage is both an InvalidRequest and an InputDecodeError:
    from a worker it comes back as both (400 code 3 naming the input, as in process),
    where it used to come back as a plain 422 InvalidRequest."""
    from mortred_twisted.http.errors import to_api_error
    from mortred_twisted.models.isolated import _decode_error, _encode_error
    from mortred_twisted.sdk.media import UnreadableImage

    sent = UnreadableImage("params.image", "not a readable image (not a known image format)")
    back = _decode_error(*_encode_error(sent))
    assert type(back) is UnreadableImage
    assert (back.field, back.message, str(back)) == (sent.field, sent.message, str(sent))
    assert to_api_error(back) == to_api_error(sent)
