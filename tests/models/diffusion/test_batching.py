"""Step batching of diffusion runs (DenoiseBatch) over tiny random diffusers pipelines:
mixed requests share one denoiser call per step and each image stays its own.

The built model is the SDK adapter (``SdkModel``); its ``instance`` is the family's
``DiffusionModel`` (pipeline, schedulers, denoiser). Batches are stepped through the
SDK's step batching (``SdkStepBatch``), as the server steps them."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from mortred_twisted.model_api.base import (
    InferenceRequest,
    ModelLoadError,
    RunCancelled,
    RunContext,
)
from mortred_twisted.models.diffusion import batching
from mortred_twisted.models.diffusion.batching import DenoiseBatch, SamplingDiverged
from mortred_twisted.sdk.step_batching import SdkStepBatch

FAMILIES = ["DDPM", "DDIM", "CLS_COND_DDIM", "LDM"]
#: The stated tolerance: an image alone vs in a batch, max difference per pixel (of 255).
TOLERANCE = 2

#: Requests that differ in everything a request can choose.
MIXED: list[dict[str, Any]] = [
    {"scheduler": "dpmsolver++", "sample_steps": 6, "seed": 1},
    {"scheduler": "ddim", "sample_steps": 4, "seed": 2, "eta": 0.5, "num_images": 2},
    {"scheduler": "euler-ancestral", "sample_steps": 5, "seed": 3},
    {"scheduler": "ddpm", "sample_steps": 3, "seed": 4, "num_images": 3},
    {"scheduler": "unipc", "sample_steps": 6, "seed": 5, "predicted_x0": True},
    {"scheduler": "euler-karras", "sample_steps": 2, "seed": 6},
]
CONDITIONAL = [
    {"guidance_scale": 3.0, "class_id": 1},
    {"guidance_scale": 1.0},
    {"guidance_scale": 0.0, "class_id": 7},
    {"guidance_scale": 2.0},
    {"guidance_scale": 5.0, "class_id": 9},
    {"guidance_scale": 1.0, "class_id": 3},
]


def mixed(family: str) -> list[dict[str, Any]]:
    if family != "CLS_COND_DDIM":
        return MIXED
    return [{**p, **c} for p, c in zip(MIXED, CONDITIONAL, strict=True)]


def pixels(data: dict[str, Any]) -> list[np.ndarray]:
    out = []
    for b64 in data["images"]:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            out.append(np.asarray(img).astype(np.int16))
    return out


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> int:
    assert len(a["images"]) == len(b["images"])
    return max(int(np.abs(x - y).max()) for x, y in zip(pixels(a), pixels(b), strict=True))


def requests(model: Any, params: list[dict[str, Any]]) -> list[InferenceRequest]:
    return [
        model.validate(InferenceRequest(req_id=f"r{i}", params=p)) for i, p in enumerate(params)
    ]


def fresh_batch(model: Any, max_rows: int) -> tuple[SdkStepBatch, DenoiseBatch]:
    """A new DenoiseBatch of the model's instance behind the SDK adapter (as the
    server joins runs to it), and the DenoiseBatch itself."""
    inner = DenoiseBatch(model.instance, max_rows)
    return SdkStepBatch(model, inner), inner


def run_staggered(
    model: Any, reqs: list[InferenceRequest], ctxs: list[RunContext], join_at: list[int]
) -> dict[int, Any]:
    """Step a DenoiseBatch by hand; request i joins before step ``join_at[i]``."""
    batch, _inner = fresh_batch(model, model.instance.max_batch_images)
    outcomes: dict[int, Any] = {}
    tick = 0
    while len(outcomes) < len(reqs):
        for key, (req, ctx) in enumerate(zip(reqs, ctxs, strict=True)):
            if join_at[key] == tick:
                batch.join(key, req, ctx)
        outcomes.update(batch.step())
        tick += 1
    assert batch.active == 0
    return outcomes


@pytest.mark.parametrize("family", FAMILIES)
def test_each_image_is_the_same_alone_and_in_a_mixed_batch(
    build: Callable[..., Any], family: str
) -> None:
    """Runs of different schedulers, steps, eta, guidance, image counts, seeds and
    classes, joining at different steps, give each the images it gives alone."""
    model = build(family, max_running_jobs=8)
    reqs = requests(model, mixed(family))
    alone = [model.run(r, RunContext()) for r in reqs]
    together = run_staggered(model, reqs, [RunContext() for _ in reqs], [0, 0, 1, 2, 2, 3])
    for i, data in enumerate(alone):
        got = together[i]
        assert not isinstance(got, BaseException), got
        assert max_diff(got, data) <= TOLERANCE, (i, mixed(family)[i])
        assert (got["seed"], got["steps"], got["scheduler"]) == (
            data["seed"], data["steps"], data["scheduler"],
        )  # fmt: skip
        assert got.get("class_ids") == data.get("class_ids")
        assert len(got.get("predicted_x0", [])) == len(data.get("predicted_x0", []))


@pytest.mark.parametrize("family", ["DDIM", "CLS_COND_DDIM"])
def test_the_batch_makes_one_denoiser_call_per_step(build: Callable[..., Any], family: str) -> None:
    """All runs of a step go through one denoiser call whose rows are every run's rows
    (a guided image counts twice)."""
    model = build(family, max_running_jobs=4, max_batch_images=64)
    params = [{"sample_steps": 3, "seed": 1, "num_images": 2}, {"sample_steps": 3, "seed": 2}]
    if family == "CLS_COND_DDIM":
        params = [{**params[0], "guidance_scale": 2.0}, {**params[1], "guidance_scale": 1.0}]
    calls: list[int] = []
    hook = model.instance.pipe.denoiser.register_forward_pre_hook(
        lambda _m, args: calls.append(args[0].shape[0])
    )
    try:
        run_staggered(model, requests(model, params), [RunContext(), RunContext()], [0, 0])
    finally:
        hook.remove()
    rows = 2 * 2 + 1 if family == "CLS_COND_DDIM" else 2 + 1
    assert calls == [rows] * 3


def test_max_batch_images_caps_the_rows_of_each_call(build: Callable[..., Any]) -> None:
    """Over max_batch_images rows a step makes several calls, none above the cap, and
    the images stay those of the runs alone."""
    model = build("CLS_COND_DDIM", max_running_jobs=4, max_batch_images=3)
    params = [
        {"sample_steps": 2, "seed": 1, "num_images": 2, "guidance_scale": 2.0},
        {"sample_steps": 2, "seed": 2, "num_images": 3, "guidance_scale": 1.0},
    ]
    reqs = requests(model, params)
    calls: list[int] = []
    hook = model.instance.pipe.denoiser.register_forward_pre_hook(
        lambda _m, args: calls.append(args[0].shape[0])
    )
    try:
        together = run_staggered(model, reqs, [RunContext(), RunContext()], [0, 0])
    finally:
        hook.remove()
    assert calls == [3, 3, 1] * 2  # 4 + 3 = 7 rows per step
    for i, req in enumerate(reqs):
        assert max_diff(together[i], model.run(req, RunContext())) <= TOLERANCE


def test_runs_finishing_in_the_same_step_share_one_decode(build: Callable[..., Any]) -> None:
    """The latents of runs whose last step is the same step go through one
    autoencoder call (a run is never split); the images stay those of the runs alone."""
    model = build("LDM", max_running_jobs=4, max_batch_images=3)
    params = [
        {"sample_steps": 3, "seed": 1},
        {"sample_steps": 3, "seed": 2, "num_images": 2},
        {"sample_steps": 3, "seed": 3},
        {"sample_steps": 4, "seed": 4, "num_images": 4},
    ]
    reqs = requests(model, params)
    alone = [model.run(r, RunContext()) for r in reqs]
    rows: list[int] = []
    hook = model.instance.pipe.autoencoder.decoder.register_forward_pre_hook(
        lambda _m, args: rows.append(args[0].shape[0])
    )
    try:
        together = run_staggered(model, reqs, [RunContext() for _ in reqs], [0, 0, 0, 0])
    finally:
        hook.remove()
    # Step 3: runs 0 + 1 fit in 3 rows, run 2 starts the next call; step 4: run 3
    # alone, over the cap but never split.
    assert rows == [3, 1, 4]
    for i, data in enumerate(alone):
        assert max_diff(together[i], data) <= TOLERANCE, i


def test_a_failing_joint_decode_fails_only_the_run_that_fails_alone(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the shared autoencoder call raises, each run is decoded alone: the run
    whose own decode raises fails, the others finish with their images."""
    model = build("LDM", max_running_jobs=4)
    reqs = requests(
        model, [{"sample_steps": 2, "seed": 1}, {"sample_steps": 2, "seed": 2, "num_images": 2}]
    )
    alone = model.run(reqs[0], RunContext())
    real_decode = model.instance._decode

    def decode(z: torch.Tensor) -> torch.Tensor:
        if z.shape[0] != 1:
            raise RuntimeError("decoder out of memory")
        return real_decode(z)

    monkeypatch.setattr(model.instance, "_decode", decode)
    out = run_staggered(model, reqs, [RunContext(), RunContext()], [0, 0])
    assert isinstance(out[1], RuntimeError) and "out of memory" in str(out[1])
    assert max_diff(out[0], alone) <= TOLERANCE


@pytest.mark.parametrize("scheduler", ["dpmsolver++", "euler-ancestral", "dpmsolver++-karras"])
def test_a_copied_scheduler_gives_the_bytes_of_one_built_for_the_run(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, scheduler: str
) -> None:
    """Runs get private copies of a scheduler prepared once per (name, steps), never
    stepped before, and their images are byte for byte those of a scheduler built
    from scratch for the run."""
    model = build("DDIM", max_running_jobs=1)
    a = model.instance.schedulers.fresh(scheduler, 5)
    b = model.instance.schedulers.fresh(scheduler, 5)
    assert a is not b and a.step_index is None and b.step_index is None
    assert a.timesteps.tolist() == b.timesteps.tolist() and len(a.timesteps) == 5
    req = requests(model, [{"scheduler": scheduler, "sample_steps": 5, "seed": 3}])[0]
    copied = [model.run(req, RunContext()) for _ in range(2)]
    monkeypatch.setattr(model.instance.schedulers, "fresh", model.instance.schedulers._prepare)
    assert copied[0] == copied[1] == model.run(req, RunContext())


def _step_calls(monkeypatch: pytest.MonkeyPatch, fail_over_rows: int | None = None) -> list[int]:
    """Count (and optionally fail) DPMSolverMultistepScheduler.step calls by their rows."""
    cls = batching.schedulers._class("DPMSolverMultistepScheduler")
    real = cls.step
    calls: list[int] = []

    def step(self: Any, out: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(out.shape[0])
        if fail_over_rows is not None and out.shape[0] > fail_over_rows:
            raise RuntimeError("shared step failed")
        return real(self, out, *args, **kwargs)

    monkeypatch.setattr(cls, "step", step)
    return calls


SHARING = [
    {"scheduler": "dpmsolver++", "sample_steps": 4, "seed": 1},
    {"scheduler": "dpmsolver++", "sample_steps": 4, "seed": 2, "num_images": 2},
    {"scheduler": "dpmsolver++", "sample_steps": 4, "seed": 3, "predicted_x0": True},
    {"scheduler": "dpmsolver++", "sample_steps": 4, "seed": 4},
    {"scheduler": "dpmsolver++", "sample_steps": 3, "seed": 5},
    {"scheduler": "euler", "sample_steps": 4, "seed": 6},
]


@pytest.mark.parametrize("family", ["DDIM", "LDM"])
def test_runs_at_the_same_step_of_one_schedule_share_the_scheduler_step(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """Runs at the same step of the same noise-free multistep schedule are stepped by
    one scheduler call, and every image is byte for byte the one of separate calls."""
    model = build(family, max_running_jobs=8)
    reqs = requests(model, SHARING)
    join_at = [0, 0, 0, 1, 0, 0]
    separate_calls = _step_calls(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(batching, "SHARED_STEP", {})
        separate = run_staggered(model, reqs, [RunContext() for _ in reqs], join_at)
    assert len(separate_calls) == 4 + 4 + 4 + 4 + 3
    shared_calls = _step_calls(monkeypatch)
    shared = run_staggered(model, reqs, [RunContext() for _ in reqs], join_at)
    # Runs 0-2 share 4 calls of 4 rows; run 3 (joined a step later) and run 4 (3 steps:
    # another schedule) step alone; euler is not in SHARED_STEP.
    assert sorted(shared_calls) == sorted([4] * 4 + [1] * 4 + [1] * 3)
    for i in range(len(reqs)):
        assert shared[i] == separate[i], i


def test_a_failing_shared_step_lets_each_run_step_alone(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared scheduler call that raises is undone and each run steps on its own:
    no run fails for it, and the images are those of separate calls."""
    model = build("LDM", max_running_jobs=8)
    reqs = requests(model, SHARING[:3])
    with monkeypatch.context() as m:
        m.setattr(batching, "SHARED_STEP", {})
        separate = run_staggered(model, reqs, [RunContext() for _ in reqs], [0, 0, 0])
    calls = _step_calls(monkeypatch, fail_over_rows=2)
    out = run_staggered(model, reqs, [RunContext() for _ in reqs], [0, 0, 0])
    assert calls.count(4) == 4  # every shared call was tried, and failed
    for i in range(len(reqs)):
        assert out[i] == separate[i], i


def test_progress_is_reported_per_run_per_step(build: Callable[..., Any]) -> None:
    """Each run's context sees its own steps and total, in order."""
    model = build("DDIM", max_running_jobs=4)
    seen: list[list[tuple[int, int]]] = [[], []]
    ctxs = [RunContext(lambda s, t, i=i: seen[i].append((s, t))) for i in range(2)]
    params = [{"sample_steps": 4, "seed": 1}, {"sample_steps": 2, "seed": 2}]
    run_staggered(model, requests(model, params), ctxs, [0, 1])
    assert seen == [[(1, 4), (2, 4), (3, 4), (4, 4)], [(1, 2), (2, 2)]]


def test_a_cancelled_run_leaves_at_the_next_boundary_alone(build: Callable[..., Any]) -> None:
    """A cancel during step 2 ends that run after step 2 with RunCancelled; its batch
    mate finishes with the images it has alone."""
    model = build("LDM", max_running_jobs=4)
    reqs = requests(model, [{"sample_steps": 8, "seed": 1}, {"sample_steps": 5, "seed": 2}])
    steps: list[int] = []
    ctx: RunContext

    def on_progress(step: int, total: int) -> None:
        steps.append(step)
        if step == 2:
            ctx.cancel()

    ctx = RunContext(on_progress)
    out = run_staggered(model, reqs, [ctx, RunContext()], [0, 0])
    assert isinstance(out[0], RunCancelled) and steps == [1, 2]
    assert max_diff(out[1], model.run(reqs[1], RunContext())) <= TOLERANCE


def test_a_run_cancelled_before_a_step_costs_no_forward(build: Callable[..., Any]) -> None:
    """A run cancelled between two steps leaves before the next denoiser call."""
    model = build("DDIM", max_running_jobs=4)
    batch, inner = fresh_batch(model, 32)
    ctx = RunContext()
    batch.join(1, requests(model, [{"sample_steps": 5, "seed": 1}])[0], ctx)
    batch.step()
    ctx.cancel()
    left = batch.step()
    assert [k for k, _ in left] == [1] and isinstance(left[0][1], RunCancelled)
    assert list(inner.forward_rows) == [1]


def failing(scheduler: Any, at: int, nan: bool) -> Any:
    """``scheduler`` whose ``step`` raises, or returns NaN, from its ``at``-th call on."""
    inner = scheduler.step
    calls = [0]

    def step(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        out = inner(*args, **kwargs)
        if calls[0] >= at:
            if not nan:
                raise RuntimeError("scheduler exploded")
            out.prev_sample = torch.full_like(out.prev_sample, float("nan"))
        return out

    scheduler.step = step
    return scheduler


@pytest.mark.parametrize(("nan", "error"), [(False, RuntimeError), (True, SamplingDiverged)])
def test_a_run_whose_scheduler_raises_or_turns_nan_fails_alone(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, nan: bool, error: type
) -> None:
    """The failing run ends with its own error; the others finish with their images."""
    model = build("DDIM", max_running_jobs=4)
    reqs = requests(
        model,
        [
            {"sample_steps": 4, "seed": 1},
            {"sample_steps": 4, "seed": 99},
            {"sample_steps": 3, "seed": 3},
        ],
    )
    alone = {i: model.run(reqs[i], RunContext()) for i in (0, 2)}
    real_fresh = model.instance.schedulers.fresh
    made: list[Any] = []

    def fresh(name: str, steps: int) -> Any:
        scheduler = real_fresh(name, steps)
        made.append(scheduler)
        return failing(scheduler, at=2, nan=nan) if len(made) == 2 else scheduler

    monkeypatch.setattr(model.instance.schedulers, "fresh", fresh)
    out = run_staggered(model, reqs, [RunContext() for _ in reqs], [0, 0, 0])
    assert isinstance(out[1], error)
    if nan:
        assert "step 2 of 4" in str(out[1])
    for i in (0, 2):
        assert max_diff(out[i], alone[i]) <= TOLERANCE


def test_a_run_alone_fails_on_nan_too(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model.run raises SamplingDiverged instead of returning images of NaN."""
    model = build("DDPM")
    real_fresh = model.instance.schedulers.fresh
    monkeypatch.setattr(
        model.instance.schedulers, "fresh", lambda n, s: failing(real_fresh(n, s), at=1, nan=True)
    )
    with pytest.raises(SamplingDiverged):
        model.run(requests(model, [{"sample_steps": 3, "seed": 1}])[0], RunContext())


def test_run_batch_gives_each_sync_run_its_own_outcome(build: Callable[..., Any]) -> None:
    """run_batch (the sync path's dynamic batching) steps the runs together
    (``predict_together``: one denoiser call per step) and returns each run's data or
    error (its own context: its cancel, its progress)."""
    model = build("DDPM")
    reqs = requests(model, [{"sample_steps": 3, "seed": 1}, {"sample_steps": 2, "seed": 2}])
    cancelled = RunContext()
    cancelled.cancel()
    out = model.run_batch(reqs, [RunContext(), cancelled])
    assert isinstance(out[1], RunCancelled)
    assert max_diff(out[0], model.run(reqs[0], RunContext())) <= TOLERANCE
    calls: list[int] = []
    hook = model.instance.pipe.denoiser.register_forward_pre_hook(
        lambda _m, args: calls.append(args[0].shape[0])
    )
    try:
        ctxs = [RunContext(), RunContext()]
        both = model.run_batch(reqs, ctxs)
    finally:
        hook.remove()
    assert calls == [2, 2, 1]  # both runs in the first two steps, one call each
    assert [c.last_progress for c in ctxs] == [(3, 3), (2, 2)]
    assert not any(isinstance(o, BaseException) for o in both)


def test_capacity_is_the_model_option(build: Callable[..., Any]) -> None:
    """max_running_jobs is the instance's run capacity; 1 means no step batch."""
    batched = build("DDIM", max_running_jobs=5)
    own = batched.instance.step_batch()
    assert batched.run_capacity == 5 and isinstance(own, DenoiseBatch)
    assert batched.step_batch() is batched.step_batch()
    assert batched.step_batch()._inner is own is batched.instance.step_batch()
    single = build("DDIM", max_running_jobs=1)
    assert single.run_capacity == 1 and single.step_batch() is None
    assert single.instance.step_batch() is None


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("max_running_jobs", 0, "max_running_jobs: must be >= 1"),
        ("max_batch_images", "8", "max_batch_images: expected int"),
    ],
)
def test_bad_batching_options_are_load_errors(
    build: Callable[..., Any], key: str, value: Any, says: str
) -> None:
    """Batching options out of range or of the wrong type keep the server not ready."""
    with pytest.raises(ModelLoadError, match=says):
        build("DDIM", **{key: value})


def test_channels_last_gives_the_images_of_the_default_layout(
    build: Callable[..., Any],
) -> None:
    """channels_last (the denoiser's memory format) changes no image beyond the
    tolerance, alone or in a batch."""
    plain = build("CLS_COND_DDIM", channels_last=False, max_running_jobs=4)
    fast = build("CLS_COND_DDIM", channels_last=True, max_running_jobs=4)
    assert fast.instance.pipe.denoiser is not plain.instance.pipe.denoiser
    reqs = requests(plain, mixed("CLS_COND_DDIM")[:3])
    for a, b in zip(
        plain.run_batch(reqs, [RunContext() for _ in reqs]),
        fast.run_batch(reqs, [RunContext() for _ in reqs]),
        strict=True,
    ):
        assert max_diff(a, b) <= TOLERANCE


def test_compile_is_opt_in_and_paid_at_load(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """compile = true wraps the denoiser with torch.compile (dynamic batch size) and
    calls it at load; the default leaves the shared denoiser as it is."""
    compiled: list[dict[str, Any]] = []

    def fake_compile(module: Any, **kwargs: Any) -> Any:
        compiled.append(kwargs)
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    assert build("DDIM").instance.compile_seconds is None and compiled == []
    model = build("DDIM", compile=True)
    assert compiled == [{"dynamic": True}] and model.instance.compile_seconds is not None


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")


@GPU
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_batch_gives_each_image_alone(
    build: Callable[..., Any], family: str, dtype: str
) -> None:
    """On CUDA, in float32 and float16, mixed runs in one batch give the images they
    give alone, within the tolerance."""
    model = build(family, device="cuda", dtype=dtype, max_running_jobs=8)
    reqs = requests(model, mixed(family))
    alone = [model.run(r, RunContext()) for r in reqs]
    together = run_staggered(model, reqs, [RunContext() for _ in reqs], [0, 0, 1, 2, 2, 3])
    for i, data in enumerate(alone):
        assert max_diff(together[i], data) <= TOLERANCE, (i, dtype)


def test_a_failing_denoiser_call_reports_the_runs_that_left_before_it(
    build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cancelled before the step whose batched denoiser call fails is reported
    with RunCancelled, its mate with the call's error, and the batch is empty (before:
    the step raised and the cancelled run was reported by nobody)."""
    model = build("DDIM", max_running_jobs=4)
    batch, _inner = fresh_batch(model, 32)
    reqs = requests(model, [{"sample_steps": 5, "seed": 1}, {"sample_steps": 5, "seed": 2}])
    cancelled = RunContext()
    batch.join(1, reqs[0], cancelled)
    batch.join(2, reqs[1], RunContext())
    batch.step()
    cancelled.cancel()

    def broken(*_args: Any) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(model.instance, "denoise", broken)
    left = dict(batch.step())
    assert sorted(left) == [1, 2] and batch.active == 0
    assert isinstance(left[1], RunCancelled)
    assert isinstance(left[2], RuntimeError) and "out of memory" in str(left[2])
