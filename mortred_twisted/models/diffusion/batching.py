"""Denoising runs of one diffusion model advanced together: one batched forward per step.

:class:`DenoiseBatch` is the model side of step batching (the reactor side is
``runtime/step_loop.py``; ``sdk/step_batching.py`` hands it to the server: the
:class:`~mortred_twisted.model_api.base.StepBatch` contract in ``predict``'s terms, a run
joins with its SDK :class:`~mortred_twisted.sdk.Context` and its params). Each run
keeps everything that makes it *its own* run, exactly as a run
alone has it: its diffusers scheduler object (any scheduler, step count, ``eta``),
its ``torch.Generator`` (seeded with its seed: the initial noise and every stochastic
step draw from it), its latents, guidance scale, class labels and ``predicted_x0``
snapshots. What runs share is only the denoiser call: per step the model inputs of
every run (``scheduler.scale_model_input``), their timesteps (one per row, as float:
the timestep embedding casts them so anyway) and class labels are concatenated, and
the denoiser runs over them in chunks of at most ``max_rows`` rows
(``max_batch_images``). Classifier-free guidance adds a run's rows twice (with its
labels, then with the "no label" id) and combines its own two halves.

Per run and per step, in this order: ``scheduler.step`` (its own generator and
``eta``; runs at the same step of the same noise-free multistep schedule share one
call, see :data:`SHARED_STEP`); a check that the latents are finite (NaN or inf: the
run fails alone with :class:`SamplingDiverged`); ``ctx.progress(step, total)``;
``ctx.check_cancelled()``.
A cancelled run is also dropped before a step starts, so it never costs a forward
after its cancel was seen. The runs whose last step is done are decoded
together (latent pipelines: one autoencoder call for all that finish in the same
step, at most ``max_rows`` rows unless one run alone has more), encoded as PNGs and
leave with their ``data``. An exception raised by one
run's scheduler (or its decode) is that run's outcome alone.

Images are the same alone and in a batch up to the floating-point differences of a
different batch size in the denoiser's kernels (measured: docs/models/diffusion.md,
"Step batching"). A run alone (``DiffusionModel.predict``) goes through this same code
with a batch of one, so its bytes equal the model's solo output.

Thread contract: one thread at a time calls :meth:`join`, :meth:`step` and
:meth:`abandon` (the server's batch loop, or the thread of a solo ``predict``); a run's
context may be cancelled from any thread. The pipeline's networks are shared and
only read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from mortred_twisted.model_api.base import SamplingDiverged
from mortred_twisted.models.diffusion import schedulers

if TYPE_CHECKING:
    from mortred_twisted.models.diffusion.inputs import SamplingPlan
    from mortred_twisted.sdk import Context


class Denoiser(Protocol):
    """What a :class:`DenoiseBatch` needs of the model whose runs it steps
    (:class:`~mortred_twisted.models.diffusion.service.DiffusionModel` is one): the
    engine depends on this, not on the model, so the model may import the engine."""

    device: torch.device
    dtype: torch.dtype
    pipe: Any  # .latent_shape
    schedulers: Any  # .fresh(name, steps)

    def plan(self, params: Mapping[str, Any]) -> SamplingPlan: ...

    def row_labels(self, plan: SamplingPlan) -> tuple[torch.Tensor | None, bool]: ...

    def denoise(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor: ...

    def x0(
        self, x: torch.Tensor, out: torch.Tensor, t: torch.Tensor, abar: torch.Tensor
    ) -> torch.Tensor: ...

    def decode_runs(self, latents: Sequence[torch.Tensor], max_rows: int) -> list[torch.Tensor]: ...

    def result(
        self, plan: SamplingPlan, steps: int, images: Any, snapshots: Any
    ) -> dict[str, Any]: ...


#: How many intermediate ``predicted_x0`` snapshots a run returns at most.
MAX_X0_SNAPSHOTS = 8


#: Schedulers whose ``step`` may serve several runs at once: for runs at the same
#: step of the same schedule (same scheduler, step count and history length) it is
#: elementwise over the images (per-image thresholding included) and draws no noise,
#: so one call over the concatenated images gives each run the bytes its own call
#: gives. Per class: the per-image state (lists of tensors, split back per run) and
#: the counters ``step`` advances (equal across the runs, copied back). Only the
#: noise-free algorithm types qualify (:data:`_NOISE_FREE`).
SHARED_STEP: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "DPMSolverMultistepScheduler": (("model_outputs",), ("lower_order_nums", "_step_index")),
}
_NOISE_FREE = frozenset({"dpmsolver++", "dpmsolver"})


@dataclass(eq=False)
class _Run:
    """One run's own state (see the module docstring)."""

    ctx: Context
    plan: SamplingPlan
    scheduler: Any
    timesteps: torch.Tensor
    step_kwargs: dict[str, Any]
    x: torch.Tensor
    labels: torch.Tensor | None  # one per forward row (guided: labels, then "no label")
    guided: bool
    snap_steps: frozenset[int]
    #: Runs with equal recipes (scheduler name, steps) at the same step and history
    #: may share their ``scheduler.step`` call; None: this run's step is its own.
    recipe: tuple[str, int] | None = None
    snapshots: list[tuple[int, int, torch.Tensor]] = field(default_factory=list)
    i: int = 0
    #: The step's result when it was computed in a shared call (consumed by _advance).
    stepped: torch.Tensor | None = None

    @property
    def total(self) -> int:
        return len(self.timesteps)

    @property
    def rows(self) -> int:
        return self.x.shape[0] * (2 if self.guided else 1)


class DenoiseBatch:
    """The runs of one :class:`Denoiser` (a ``DiffusionModel``) instance (see the module docstring):
    ``join(key, ctx, params)``, ``step()``, ``abandon()`` and ``active`` as the SDK's
    step batching takes them (``params``: ``predict``'s keyword arguments)."""

    def __init__(self, model: Denoiser, max_rows: int) -> None:
        self._model = model
        self._max_rows = max(1, max_rows)
        self._runs: dict[int, _Run] = {}
        #: Rows of the latest denoiser calls (bounded; tests read it).
        self.forward_rows: deque[int] = deque(maxlen=256)

    @property
    def active(self) -> int:
        return len(self._runs)

    def join(self, key: int, ctx: Context, params: Mapping[str, Any]) -> None:
        """Prepare a run that takes part from the next :meth:`step` on; raises (the
        run never joined) when it is cancelled already."""
        ctx.check_cancelled()
        self._runs[key] = self._start(params, ctx)

    def abandon(self) -> list[int]:
        """Drop every run (after a step itself failed); their keys."""
        keys = list(self._runs)
        self._runs.clear()
        return keys

    # -- one step -----------------------------------------------------------------

    def step(self) -> list[tuple[int, Any]]:
        """One step of every run (the ``StepBatch`` contract). When a part the runs
        share fails (the batched denoiser call: out of memory, a broken kernel), every
        run still held leaves with that error and the batch is empty; runs that left
        earlier in the same step (cancelled, failed alone) keep their own outcome. So
        every run that left is reported, once, and the step itself never raises."""
        left: list[tuple[int, Any]] = []
        finished: list[tuple[int, _Run]] = []
        try:
            self._step(left, finished)
        except Exception as exc:
            reported = {key for key, _ in left}
            left.extend((key, exc) for key, _ in finished if key not in reported)
            left.extend((key, exc) for key in self.abandon())
        return left

    def _step(self, left: list[tuple[int, Any]], finished: list[tuple[int, _Run]]) -> None:
        """:meth:`step`'s body: appends each run that leaves to ``left`` as it does
        (and each run whose last step is done to ``finished``, out of the batch)."""
        inputs: dict[int, torch.Tensor] = {}
        with torch.inference_mode():
            for key, run in list(self._runs.items()):
                try:
                    run.ctx.check_cancelled()
                    t = run.timesteps[run.i]
                    inputs[key] = run.scheduler.scale_model_input(run.x, t)
                except Exception as exc:
                    left.append((key, self._leave(key, exc)))
            outputs = self._denoise(inputs)
            for keys in self._shared_steps(outputs):
                self._step_together(keys, outputs)
            for key, out in outputs.items():
                run = self._runs[key]
                try:
                    done = self._advance(run, inputs[key], out)
                except Exception as exc:
                    left.append((key, self._leave(key, exc)))
                    continue
                if done:
                    finished.append((key, run))
                    del self._runs[key]
            left += self._finish(finished)

    def _leave(self, key: int, exc: Exception) -> Exception:
        self._runs.pop(key, None)
        return exc

    def _denoise(self, inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Every run's (guided) denoiser output, from one concatenated call per chunk."""
        if not inputs:
            return {}
        model = self._model
        xs: list[torch.Tensor] = []
        ts: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        for key, model_input in inputs.items():
            run = self._runs[key]
            rows = torch.cat([model_input, model_input]) if run.guided else model_input
            xs.append(rows)
            t = run.timesteps[run.i].to(model.device, torch.float32)
            ts.append(t.reshape(1).expand(rows.shape[0]))
            if run.labels is not None:
                ys.append(run.labels)
        x = torch.cat(xs).to(model.dtype)
        tt = torch.cat(ts)
        y = torch.cat(ys) if ys else None
        out = torch.cat(
            [
                model.denoise(x[a : a + self._max_rows], tt[a : a + self._max_rows],
                              None if y is None else y[a : a + self._max_rows])
                for a in range(0, x.shape[0], self._max_rows)
            ]
        )  # fmt: skip
        self.forward_rows.extend(min(self._max_rows, x.shape[0] - a)
                                 for a in range(0, x.shape[0], self._max_rows))  # fmt: skip
        per_run: dict[int, torch.Tensor] = {}
        at = 0
        for key in inputs:
            run = self._runs[key]
            part = out[at : at + run.rows]
            at += run.rows
            if run.guided:
                cond, uncond = part.chunk(2)
                part = uncond + run.plan.guidance_scale * (cond - uncond)
            per_run[key] = part
        return per_run

    def _shared_steps(self, outputs: dict[int, torch.Tensor]) -> list[list[int]]:
        """Groups (two runs or more) whose scheduler steps may be one call."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for key in outputs:
            run = self._runs[key]
            if run.recipe is None:
                continue
            counters = SHARED_STEP[type(run.scheduler).__name__][1]
            state = tuple(getattr(run.scheduler, name) for name in counters)
            groups.setdefault((run.recipe, run.i, state), []).append(key)
        return [keys for keys in groups.values() if len(keys) > 1]

    def _step_together(self, keys: list[int], outputs: dict[int, torch.Tensor]) -> None:
        """One ``scheduler.step`` for the runs ``keys`` (see :data:`SHARED_STEP`).

        The first run's scheduler steps the concatenated images with the
        concatenated per-image state; the result and the new state are split back to
        each run (``run.stepped``, its scheduler's lists and counters). Should the
        call raise, that scheduler is restored and each run steps alone in
        :meth:`_advance` (so a failure stays its run's own).
        """
        runs = [self._runs[key] for key in keys]
        lead = runs[0].scheduler
        lists, counters = SHARED_STEP[type(lead).__name__]
        saved = {name: getattr(lead, name) for name in lists + counters}
        try:
            for name in lists:
                mine = [getattr(run.scheduler, name) for run in runs]
                setattr(lead, name, [
                    None if entry is None else torch.cat([state[j] for state in mine])
                    for j, entry in enumerate(mine[0])
                ])  # fmt: skip
            t = runs[0].timesteps[runs[0].i]
            out = torch.cat([outputs[key] for key in keys])
            prev = lead.step(out, t, torch.cat([run.x for run in runs])).prev_sample
            merged = {name: getattr(lead, name) for name in lists}
            after = {name: getattr(lead, name) for name in counters}
        except Exception:
            for name, value in saved.items():
                setattr(lead, name, value)
            return
        sizes = [run.x.shape[0] for run in runs]
        parts = {
            name: [None if m is None else m.split(sizes) for m in entries]
            for name, entries in merged.items()
        }
        for i, (run, x) in enumerate(zip(runs, prev.split(sizes), strict=True)):
            for name, entries in parts.items():
                setattr(run.scheduler, name, [None if m is None else m[i] for m in entries])
            for name, value in after.items():
                setattr(run.scheduler, name, value)
            run.stepped = x

    def _advance(self, run: _Run, model_input: torch.Tensor, out: torch.Tensor) -> bool:
        """``scheduler.step`` + checks for one run; whether its last step is done."""
        t = run.timesteps[run.i]
        step = run.i + 1
        if step in run.snap_steps:
            alphas = run.scheduler.alphas_cumprod
            x0 = self._model.x0(model_input.float(), out.float(), t, alphas)
            run.snapshots.append((step, round(float(t)), x0))
        if run.stepped is not None:
            run.x, run.stepped = run.stepped, None
        else:
            run.x = run.scheduler.step(out, t, run.x, **run.step_kwargs).prev_sample
        if not bool(torch.isfinite(run.x).all()):
            raise SamplingDiverged(
                f"sampling diverged (NaN or inf) at step {step} of {run.total} "
                f"(scheduler {run.plan.scheduler!r})"
            )
        run.i = step
        run.ctx.progress(step, run.total)
        run.ctx.check_cancelled()
        return step == run.total

    def _finish(self, finished: list[tuple[int, _Run]]) -> list[tuple[int, Any]]:
        """The ``data`` of the runs whose last step this was (or what ended each).

        Their latents are decoded together (one autoencoder call for the runs that
        finish in the same step, see ``decode_runs``); if that call raises, each run
        is decoded alone, so a failure stays the failing run's own.
        """
        if not finished:
            return []
        model = self._model
        try:
            images: list[Any] = model.decode_runs([run.x for _, run in finished], self._max_rows)
        except Exception as exc:
            if len(finished) == 1:
                return [(finished[0][0], exc)]
            images = []
            for _, run in finished:
                try:
                    images += model.decode_runs([run.x], self._max_rows)
                except Exception as own:
                    images.append(own)
        left: list[tuple[int, Any]] = []
        for (key, run), decoded in zip(finished, images, strict=True):
            if isinstance(decoded, Exception):
                left.append((key, decoded))
                continue
            try:
                left.append((key, model.result(run.plan, run.total, decoded, run.snapshots)))
            except Exception as exc:
                left.append((key, exc))
        return left

    # -- a run's start ------------------------------------------------------------

    def _start(self, params: Mapping[str, Any], ctx: Context) -> _Run:
        """A fresh scheduler, generator and initial noise for ``params`` (as a run
        alone draws them)."""
        model = self._model
        plan = model.plan(params)
        scheduler = model.schedulers.fresh(plan.scheduler, plan.steps)
        timesteps = scheduler.timesteps
        total = len(timesteps)
        accepted = schedulers.step_arguments(type(scheduler).__name__)
        generator = torch.Generator(device=model.device).manual_seed(plan.seed)
        step_kwargs: dict[str, Any] = {}
        if "generator" in accepted:
            step_kwargs["generator"] = generator
        if "eta" in accepted and plan.eta is not None:
            step_kwargs["eta"] = plan.eta
        if "use_clipped_model_output" in accepted:
            # DDIM: re-derive eps from the clipped x0 (as GLIDE and Song et al. do);
            # with the raw output, guided pixel samples drift off their class.
            step_kwargs["use_clipped_model_output"] = True
        snap_steps = (
            frozenset(
                np.linspace(1, total, min(MAX_X0_SNAPSHOTS, total)).round().astype(int).tolist()
            )
            if plan.predicted_x0
            else frozenset()
        )
        shape = (plan.num_images, *model.pipe.latent_shape)
        with torch.inference_mode():
            x = torch.randn(shape, generator=generator, device=model.device, dtype=torch.float32)
            x = x * scheduler.init_noise_sigma
        labels, guided = model.row_labels(plan)
        shares = (
            type(scheduler).__name__ in SHARED_STEP
            and scheduler.config.get("algorithm_type") in _NOISE_FREE
        )
        return _Run(
            ctx=ctx, plan=plan, scheduler=scheduler, timesteps=timesteps,
            step_kwargs=step_kwargs, x=x, labels=labels, guided=guided, snap_steps=snap_steps,
            recipe=(plan.scheduler, plan.steps) if shares else None,
        )  # fmt: skip


def run_together(
    model: Denoiser,
    runs: list[Mapping[str, Any]],
    ctxs: list[Context],
    max_rows: int,
) -> list[Any]:
    """Run ``runs`` (each its params) in one private batch on the calling thread, to
    the end.

    Each entry is the run's ``data`` or the exception that ended it (one failing run
    never fails the others). ``DiffusionModel.predict`` is this with one run.
    """
    batch = DenoiseBatch(model, max_rows)
    outcomes: dict[int, Any] = {}
    for key, (params, ctx) in enumerate(zip(runs, ctxs, strict=True)):
        try:
            batch.join(key, ctx, params)
        except Exception as exc:
            outcomes[key] = exc
    while batch.active:
        for key, outcome in batch.step():
            outcomes[key] = outcome
    return [outcomes[key] for key in range(len(runs))]
