"""Text-to-image step batching: runs with different prompts and guidance scales at the
same step share one UNet call, the text encoder runs once per distinct text, and a
run's pictures equal its seed alone within 2/255."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from mortred_twisted.model_api.base import InferenceRequest, Model, RunCancelled, RunContext

MakeModel = Callable[..., Model]


def pixels(data: dict[str, Any]) -> list[np.ndarray]:
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(i["base64"]))), dtype=np.int16)
        for i in data["images"]
    ]


def batched(model: Model, runs: list[dict[str, Any]], ctxs: list[RunContext]) -> dict[int, Any]:
    """Join every run, then step the batch to the end; {key: outcome}."""
    batch = model.step_batch()
    assert batch is not None
    for key, (params, ctx) in enumerate(zip(runs, ctxs, strict=True)):
        batch.join(key, model.validate(InferenceRequest(f"r{key}", params=params)), ctx)
    outcomes: dict[int, Any] = {}
    for _ in range(1000):
        if not batch.active:
            break
        outcomes.update(batch.step())
    return outcomes


RUNS = [
    {"prompt": "a red circle", "guidance_scale": 7.5, "sample_steps": 4, "seed": 11},
    {"prompt": "a blue square", "guidance_scale": 3.0, "sample_steps": 4, "seed": 12,
     "num_images": 2},
    {"prompt": "a red circle", "guidance_scale": 1.0, "sample_steps": 4, "seed": 13,
     "scheduler": "euler"},
]  # fmt: skip


def test_runs_share_one_unet_call_per_step_and_keep_their_pictures(make_model: MakeModel) -> None:
    """Three runs (guided twice with other scales, one unguided, 4 pictures) make one
    UNet call of 2 + 4 + 1 = 7 rows per step; each run's pictures are its seed's
    alone within 2/255."""
    model = make_model("sd", max_running_jobs=4)
    assert model.run_capacity == 4
    ctxs = [RunContext() for _ in RUNS]
    outcomes = batched(model, RUNS, ctxs)
    inner = model.step_batch()._inner  # type: ignore[union-attr]
    assert inner.forward_rows[-4:] == [7, 7, 7, 7]
    for key, params in enumerate(RUNS):
        alone = model.run(model.validate(InferenceRequest("a", params=params)), RunContext())
        got = pixels(outcomes[key])
        assert len(got) == params.get("num_images", 1)
        for a, b in zip(got, pixels(alone), strict=True):
            assert int(np.abs(a - b).max()) <= 2
        assert ctxs[key].last_progress == (4, 4)


def test_the_text_encoder_runs_once_per_text_in_a_batch(make_model: MakeModel) -> None:
    """Runs 1 and 3 share "a red circle": the batch encodes it, "a blue square" and the
    empty negative prompt once each."""
    model = make_model("sd", max_running_jobs=4)
    inner = model.step_batch()._inner  # type: ignore[union-attr]
    inner.encoded = []
    batched(model, RUNS, [RunContext() for _ in RUNS])
    assert sorted(inner.encoded) == ["", "a blue square", "a red circle"]
    assert inner._texts == {}  # released as the runs left


def test_a_run_that_cannot_join_holds_nothing(make_model: MakeModel) -> None:
    """A run whose text encoder call fails never joins and leaves no cached text."""
    model = make_model("sd", max_running_jobs=4)
    batch = model.step_batch()
    inner = batch._inner  # type: ignore[union-attr]
    calls = {"n": 0}
    real = model.instance.encode_text  # type: ignore[attr-defined]

    def second_fails(text: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("encoder broke")
        return real(text)

    model.instance.encode_text = second_fails  # type: ignore[attr-defined]
    try:
        request = model.validate(InferenceRequest("x", params={"prompt": "a red circle"}))
        try:
            batch.join(1, request, RunContext())  # type: ignore[union-attr]
        except RuntimeError:
            pass
        else:
            raise AssertionError("join should have failed")
    finally:
        del model.instance.encode_text  # type: ignore[attr-defined]
    assert inner.active == 0 and inner._texts == {}


def test_max_batch_images_splits_a_step_into_calls(make_model: MakeModel) -> None:
    """max_batch_images 3 serves 7 rows in calls of 3, 3 and 1."""
    model = make_model("sd", max_running_jobs=4, max_batch_images=3)
    batched(model, RUNS, [RunContext() for _ in RUNS])
    assert model.step_batch()._inner.forward_rows[-3:] == [3, 3, 1]  # type: ignore[union-attr]


def test_a_cancelled_run_leaves_alone(make_model: MakeModel) -> None:
    """A run cancelled after step 1 leaves with RunCancelled; its mates finish, and
    the batch's UNet calls shrink by its rows."""
    model = make_model("sd", max_running_jobs=4)
    ctxs = [RunContext() for _ in RUNS]
    ctxs[1]._on_progress = lambda step, total: ctxs[1].cancel() if step == 1 else None
    outcomes = batched(model, RUNS, ctxs)
    assert isinstance(outcomes[1], RunCancelled)
    assert len(pixels(outcomes[0])) == 1 and len(pixels(outcomes[2])) == 1
    assert model.step_batch()._inner.forward_rows[-4:] == [7, 3, 3, 3]  # type: ignore[union-attr]


def test_one_run_at_a_time_has_no_batch(make_model: MakeModel) -> None:
    """max_running_jobs 1: no step batch (each run on its own thread); the other kinds
    never batch."""
    assert make_model("sd", max_running_jobs=1).step_batch() is None
    assert make_model("dit").step_batch() is None
